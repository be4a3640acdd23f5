//! Helpers shared by the parity tests and benchmark.
#![allow(dead_code)]

#[cfg(have_isal)]
pub mod isal;

pub mod array;
pub mod power_cut;

/// Polls `done` until it holds, failing the test (`what` not done) after
/// 30 seconds.
pub fn wait_until(what: &str, done: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !done() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "{what}: still not done after 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Inside `impl Member for W`, where `W` has a field `inner` (a member):
/// the methods a test wrapper passes straight through to it (identity,
/// device key, size, flush, zeroing, reserving space, and the read). The
/// wrapper writes its own `write_at`, and whatever else it changes; with
/// `(writes)`, its own `read_at` instead, and the writes pass through.
#[allow(unused_macros)]
macro_rules! pass_through_to_inner {
    () => {
        support::pass_through_to_inner!(@common);
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.inner.read_at(buf, offset)
        }
    };
    (writes) => {
        support::pass_through_to_inner!(@common);
        fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            self.inner.write_at(buf, offset)
        }
    };
    (@common) => {
        fn identity(&self) -> &str {
            self.inner.identity()
        }
        fn device_key(&self) -> raid_core::member::DeviceKey {
            self.inner.device_key()
        }
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn flush(&self) -> std::io::Result<()> {
            self.inner.flush()
        }
        fn write_zeroes(&self, offset: u64, len: u64) -> std::io::Result<()> {
            self.inner.write_zeroes(offset, len)
        }
        fn reserved(&self, offset: u64, len: u64) -> bool {
            self.inner.reserved(offset, len)
        }
        fn reserve(&self, offset: u64, len: u64) -> std::io::Result<()> {
            self.inner.reserve(offset, len)
        }
    };
}
#[allow(unused_imports)]
pub(crate) use pass_through_to_inner;

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

/// Keeps up to `depth` of `n` requests in flight from this one thread:
/// `send(i, answer)` gives request `i`, whose completion is to call
/// `answer`; `check` sees each answer as it comes (a request not answered
/// within 30 s fails the test). Returns once all `n` were answered.
pub fn in_flight<T: Send + 'static>(
    n: usize,
    depth: usize,
    mut send: impl FnMut(usize, Box<dyn FnOnce(T) + Send>),
    mut check: impl FnMut(T),
) {
    let (tx, rx) = std::sync::mpsc::channel::<T>();
    let (mut sent, mut got) = (0, 0);
    while got < n {
        while sent < n && sent - got < depth {
            let tx = tx.clone();
            send(sent, Box::new(move |t| tx.send(t).unwrap()));
            sent += 1;
        }
        let t = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("a request completes");
        check(t);
        got += 1;
    }
}
