//! The filesystem under sparse member files fills up. In one life in five
//! of a redundant level (by the seed alone, so no other life's draws
//! change; none of the seeds kept for the bugs they found), at a step the
//! seed picks, the disks' filesystem has no page left to give: writes that
//! need a new page meet ENOSPC (`disk::Space`), and the array must refuse
//! each such write whole, its space reserved on every member before any
//! is written (`Member::reserve`), and stop taking writes. Every block is
//! then read (a refused write's block may read as before or as written,
//! `Model::maybe_landed`, and that read decides), a disk fails within
//! redundancy, and every block must read as it did: a stripe left with
//! some of a refused write's member writes and not others would rebuild
//! a chunk as neither. Space is then freed and the machine
//! starts again (a power cycle, with its own checks), and the life goes on.

use super::*;

/// The step at which seed `seed`'s life fills its disks' filesystem, if
/// it does.
pub(super) fn fills_at(seed: u64, level: Level) -> Option<usize> {
    let chosen = seed % 5 == 2 && level != Level::Raid0 && !KEPT_SEEDS.contains(&seed);
    chosen.then_some(((seed / 5) % 8) as usize)
}

impl World {
    pub(super) fn fill_up(&mut self, on_shard: bool) {
        // A crash with a disk dead and unnoticed is the write hole's double
        // fault, and the episode ends in a power cycle: not now.
        if !self.cut_allowed() {
            return;
        }
        trace!(self, "the disks' filesystem is full");
        self.power.budget.store(i64::MAX, Ordering::SeqCst);
        self.space.free.store(0, Ordering::SeqCst);
        for _ in 0..self.rng.gen_range(1..=3) {
            match on_shard && self.rng.gen_ratio(1, 2) {
                true => self.shard_round(),
                false => self.write(),
            }
            // A round may cut the power (its own draw, whatever the
            // budget): the machine starts again below.
            if self.cut_now() {
                break;
            }
        }
        if !self.cut_now() {
            self.fail_one_and_read_all();
        }
        // Space freed, and the machine started again. A disk that went bad
        // or vanished during the episode, unnoticed, makes a cut the write
        // hole's double fault (`cut_allowed`), which the power cycle here
        // must not play: everything is flushed first, so that the cut
        // tears no stripe (the flush fails a vanished disk, on a noticed
        // fault as any other).
        self.space.free.store(i64::MAX, Ordering::SeqCst);
        if !self.cut_now() && !self.cut_allowed() {
            trace!(
                self,
                "a disk went bad unnoticed: a flush before the power goes"
            );
            self.flush();
        }
        self.power_cycle();
    }

    /// With writes stopped by the full filesystem: every block read (a
    /// refused write's block decides there, as before or as written), then
    /// a disk fails, where the array survives it, and every block must
    /// read as it did: a stripe a refused write tore would rebuild a chunk
    /// as neither, and a mirror chunk's copies would disagree.
    fn fail_one_and_read_all(&mut self) {
        trace!(self, "out of space: {:?}", self.a().out_of_space());
        self.read_every_block("with the filesystem full");
        if self.weak_slots() < self.tolerance() && !self.parity_resync_owed() {
            let active: Vec<usize> = (self.a().slots().iter())
                .filter(|s| s.state == SlotState::Active)
                .map(|s| s.slot)
                .collect();
            let slot = active[self.rng.gen_range(0..active.len())];
            trace!(self, "slot {slot} fails");
            self.a()
                .fail_member(slot, false)
                .unwrap_or_else(|e| panic!("seed {}: a disk could not be failed: {e}", self.seed));
            self.read_every_block("after a disk failed, the filesystem full");
        }
    }

    /// Block by block: a read of a mirror chunk whose copies a cut left
    /// different must write before it answers, and is refused.
    fn read_every_block(&mut self, when: &str) {
        for b in 0..self.blocks() {
            let mut got = vec![0u8; BLOCK];
            match self.a().read((b * BLOCK) as u64, &mut got) {
                Ok(()) => assert!(
                    self.model.read_back(b, &got),
                    "seed {}: block {b} reads as neither its last acknowledged write nor a refused one, {when}",
                    self.seed
                ),
                Err(e) if self.read_refused_for_space(&e) => {}
                Err(e) => panic!("seed {}: block {b} unreadable within redundancy, {when}: {e}", self.seed),
            }
        }
    }
}
