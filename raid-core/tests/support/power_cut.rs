//! What a power cut may leave of each block: its value as of the last
//! completed flush, or one of the values written to it since; and the
//! checks after recovery.

use raid_core::array::{Array, RebuildOptions, ScrubOptions};
use raid_core::layout::Level;
use raid_core::member::MemberRef;
use raid_core::metadata::SlotState;
use std::sync::atomic::AtomicBool;

/// A rebuild a row at a time, paced at `rate` bytes a second, its
/// position saved every `save_every` bytes of its member: a power cut
/// during it lands with rows rebuilt past the one saved.
pub fn paced_rebuild(rate: u64, save_every: u64) -> RebuildOptions {
    RebuildOptions {
        batch_rows: 1,
        parallel: 1,
        rate_limit: Some(rate),
        checkpoint_bytes: save_every,
        ..Default::default()
    }
}

/// After a recovery whose array read back as `got`: every slot not in
/// sync is rebuilt from what recovery left (a failed one onto a member
/// from `new`, by slot; one being rebuilt on from where it stands), which
/// must not change the data; then (but for RAID0) a scrub must find
/// redundancy agreeing with the data everywhere. `what` names the run
/// (level and seed).
pub fn rebuild_and_scrub(a: &Array, got: &[u8], new: impl Fn(usize) -> MemberRef, what: &str) {
    let out: Vec<(usize, SlotState)> = a
        .slots()
        .iter()
        .filter(|s| s.state != SlotState::Active)
        .map(|s| (s.slot, s.state))
        .collect();
    for &(slot, state) in &out {
        if state == SlotState::Failed {
            a.replace(slot, new(slot)).unwrap();
        }
        a.rebuild(slot, &Default::default(), &AtomicBool::new(false))
            .unwrap();
    }
    if !out.is_empty() {
        let mut again = vec![0u8; a.capacity() as usize];
        a.read(0, &mut again).unwrap();
        assert!(again == got, "{what}: the rebuild changed the data");
    }
    if a.geometry().level != Level::Raid0 {
        let r = a
            .scrub(&ScrubOptions::default(), &AtomicBool::new(false))
            .unwrap();
        assert!(
            r.mismatches.is_empty(),
            "{what}: parity inconsistent after recovery: {:?}",
            r.mismatches
        );
    }
}

#[derive(Clone)]
pub struct CutModel {
    block: usize,
    /// The image as of the last completed flush.
    flushed: Vec<u8>,
    /// Per block, the values written since that flush, oldest first.
    since: Vec<Vec<Vec<u8>>>,
}

impl CutModel {
    /// A model whose last flush left `image`, in blocks of `block` bytes.
    pub fn new(image: Vec<u8>, block: usize) -> CutModel {
        let blocks = image.len() / block;
        CutModel {
            block,
            flushed: image,
            since: vec![Vec::new(); blocks],
        }
    }

    pub fn blocks(&self) -> usize {
        self.since.len()
    }

    /// `data` was written (or is in flight) from block `b0` on.
    pub fn wrote(&mut self, b0: usize, data: &[u8]) {
        for (k, blk) in data.chunks(self.block).enumerate() {
            self.since[b0 + k].push(blk.to_vec());
        }
    }

    /// A flush completed with no write in flight: every block's last value
    /// is durable.
    pub fn flushed(&mut self) {
        let n = self.block;
        for (b, vals) in self.since.iter_mut().enumerate() {
            if let Some(last) = vals.pop() {
                self.flushed[b * n..(b + 1) * n].copy_from_slice(&last);
            }
            vals.clear();
        }
    }

    /// Panics, naming `what` (level and seed), unless every block of `got`
    /// holds its flushed value or one written since.
    pub fn check(&self, got: &[u8], what: &str) {
        let n = self.block;
        for (b, since) in self.since.iter().enumerate() {
            let now = &got[b * n..(b + 1) * n];
            let before = &self.flushed[b * n..(b + 1) * n];
            if since.is_empty() {
                assert_eq!(now, before, "{what}: flushed block {b} lost");
            }
            let ok = now == before || since.iter().any(|v| v[..] == *now);
            assert!(
                ok,
                "{what}: block {b} holds data nobody wrote (written {} times since the flush)",
                since.len()
            );
        }
    }
}
