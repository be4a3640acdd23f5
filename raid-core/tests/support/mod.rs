//! Helpers shared by the parity tests and benchmark.
#![allow(dead_code)]

#[cfg(have_isal)]
pub mod isal;

pub mod array;
pub mod power_cut;

/// A 64-byte-aligned zeroed buffer (Vec<u8> gives no alignment promise).
pub struct Aligned {
    buf: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    pub fn new(len: usize) -> Aligned {
        let buf = vec![0u8; len + 64];
        let off = buf.as_ptr().align_offset(64);
        Aligned { buf, off, len }
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[self.off..self.off + self.len]
    }
    pub fn as_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.off..self.off + self.len]
    }
}
