//! What happens to the life's disks and members between its requests: a
//! disk vanishing or going bad, a failed one replaced and rebuilt, one
//! returning and re-added, a hot replace, a rebuild, a scrub. Each is an
//! operator's or a monitor's act the seed schedules, checked by the life's
//! invariants after it.

use super::*;

impl World {
    pub(super) fn fault(&mut self) {
        if self.weak_slots() >= self.tolerance() {
            return;
        }
        // A stripe a cut tore agrees with its parity again only once the
        // resync has passed it: a disk lost before is the double fault
        // `cut_allowed` keeps out (md's resync leaves the same window
        // open). A mirror's torn chunk is made to agree before any read.
        if self.parity_resync_owed() {
            return;
        }
        let slots = self.a().slots();
        let active: Vec<usize> = slots
            .iter()
            .filter(|s| s.state == SlotState::Active)
            .map(|s| s.slot)
            .collect();
        if active.is_empty() {
            return;
        }
        let slot = active[self.rng.gen_range(0..active.len())];
        let member = slots[slot].member.clone().unwrap();
        let d = self
            .disks
            .iter()
            .find(|d| d.name == member)
            .unwrap()
            .clone();
        match self.rng.gen_range(0..3) {
            0 => {
                trace!(self, "operator fails slot {slot}");
                self.a().fail_member(slot, false).unwrap_or_else(|e| {
                    panic!("seed {}: fail within redundancy refused: {e}", self.seed)
                });
            }
            1 => {
                trace!(self, "disk {member} (slot {slot}) vanishes");
                d.st.lock().unwrap().vanished = true;
            }
            _ => {
                let row = self.rng.gen_range(0..self.rows);
                let at = self.data_offset + row * CHUNK;
                trace!(self, "disk {member} (slot {slot}) goes bad at row {row}");
                d.st.lock().unwrap().bad.push((at, at + CHUNK));
            }
        }
    }

    /// Replaces every failed slot with a new disk and rebuilds them, in
    /// one pass where there are two (which a cut may stop; the next start
    /// resumes it).
    pub(super) fn replace_and_rebuild(&mut self) {
        let failed: Vec<usize> = self
            .a()
            .slots()
            .iter()
            .filter(|s| s.state == SlotState::Failed)
            .map(|s| s.slot)
            .collect();
        for slot in failed {
            let d = self.new_disk();
            trace!(self, "replace slot {slot} with {}", d.name);
            self.disks.push(d.clone());
            if let Err(e) = self.a().replace(slot, d as MemberRef) {
                assert!(
                    self.cut_now() || self.a().state() == ArrayState::Failed,
                    "seed {}: replace refused: {e}",
                    self.seed
                );
                return;
            }
        }
        self.rebuild();
    }

    /// A disk that vanished or went bad comes back (a cable, an enclosure
    /// reboot): healed, and offered back with re-add, which resyncs only
    /// what the bitmap marked since it left. Refused is fine (its slot was
    /// given to another disk, or the array never noticed it was gone).
    pub(super) fn disk_returns(&mut self) {
        let sick: Vec<Arc<SimDisk>> = self
            .disks
            .iter()
            .filter(|d| {
                let st = d.st.lock().unwrap();
                st.vanished || !st.bad.is_empty()
            })
            .cloned()
            .collect();
        if sick.is_empty() {
            return;
        }
        let d = sick[self.rng.gen_range(0..sick.len())].clone();
        {
            let mut st = d.st.lock().unwrap();
            st.vanished = false;
            st.bad.clear();
        }
        trace!(self, "disk {} comes back", d.name);
        match self.a().re_add(d as MemberRef) {
            Ok(slot) => {
                trace!(self, "re-added into slot {slot}");
                self.rebuild();
            }
            Err(e) => trace!(self, "re-add refused: {e}"),
        }
    }

    /// The operator moves an active member onto a new disk while the array
    /// stays whole (hot replace), the copy run to its end (or a cut).
    pub(super) fn hot_replace(&mut self) {
        if self.a().state() != ArrayState::Optimal || self.unnoticed_fault() {
            return;
        }
        let slot = self.rng.gen_range(0..self.a().slots().len());
        let d = self.new_disk();
        trace!(self, "hot replace slot {slot} with {}", d.name);
        self.disks.push(d.clone());
        if let Err(e) = self.a().hot_replace(slot, d as MemberRef) {
            assert!(
                self.cut_now(),
                "seed {}: hot replace refused: {e}",
                self.seed
            );
            return;
        }
        // A third of the copies meet a bad spot on the old disk, drawn
        // from a stream of its own: its slot fails and the new disk takes
        // it, to be rebuilt. The seeds kept for the bugs they found never
        // do, so their lives stay the ones that found them.
        // On RAID5/6 not with a cut planned in this step: a cut before the
        // array saw the spot is the write hole's double fault
        // (`cut_allowed`). Mirrors take it: a cut may then land anywhere in
        // the failure, the takeover or the rebuild that follows.
        let mut side = StdRng::seed_from_u64(self.seed ^ ((self.disks.len() as u64) << 40));
        let torn = self.torn_needs_every_disk();
        let kept = KEPT_SEEDS.contains(&self.seed);
        // Nor while a resync is owed (the double fault `fault` keeps out).
        let owed = self.parity_resync_owed();
        if !(kept || owed || torn && self.power.cut_planned()) && side.gen_ratio(1, 3) {
            let old = self.a().slots()[slot].member.clone().unwrap_or_default();
            let row = side.gen_range(0..self.rows);
            let at = self.data_offset + row * CHUNK;
            trace!(
                self,
                "disk {old} (slot {slot}) goes bad at row {row} during the copy"
            );
            if let Some(d) = self.disks.iter().find(|d| d.name == old) {
                d.st.lock().unwrap().bad.push((at, at + CHUNK));
            }
        }
        // Steps of a row: each run's writes go out with its next reads.
        // Runs of holes of a row are skipped (the disks are small).
        let opts = RebuildOptions {
            batch_rows: 4,
            step_bytes: CHUNK,
            hole_bytes: CHUNK,
            ..Default::default()
        };
        match self.a().hot_replace_copy(&opts, &AtomicBool::new(false)) {
            Ok(_) => {}
            // The old disk failed: the new one took its slot, to be rebuilt.
            Err(e) => {
                trace!(self, "hot replace ended: {e}");
                self.rebuild();
            }
        }
    }

    pub(super) fn rebuild(&mut self) {
        let slots = self.a().rebuilds_wanted();
        if slots.is_empty() {
            return;
        }
        trace!(self, "rebuild slots {slots:?}");
        // One run at a time: runs side by side would race for the power
        // cut's budget and the disks' coins, and a seed would not replay.
        // Steps of a row, and holes of a row skipped, as the copy's.
        let opts = RebuildOptions {
            batch_rows: 4,
            parallel: 1,
            step_bytes: CHUNK,
            hole_bytes: CHUNK,
            ..Default::default()
        };
        match self.a().rebuild_all(&opts, &AtomicBool::new(false)) {
            Ok(RebuildEnd::Finished) | Ok(RebuildEnd::Interrupted) => {}
            // A fault on a source or the new disk ends it; the array says why.
            Err(e) => trace!(self, "rebuild ended: {e}"),
        }
    }

    /// The resync a start after a cut owes, run now: to its end, or half
    /// the time a few steps of it, the rest left to later steps of the
    /// life (requests then meet rows on both sides of its position).
    pub(super) fn resync(&mut self) {
        let steps = match self.rng.gen_bool(0.5) {
            true => usize::MAX,
            false => self.rng.gen_range(1..=4),
        };
        self.resync_steps(steps);
    }

    /// At most `steps` steps of the resync owed (`Array::run_resync_steps`).
    pub(super) fn resync_steps(&mut self, steps: usize) {
        match steps {
            usize::MAX => trace!(self, "resync"),
            _ => trace!(self, "resync, {steps} steps at most"),
        }
        if let Err(e) = self.a().run_resync_steps(steps) {
            // A repair the full filesystem refuses stops it too.
            assert!(
                self.cut_now() || self.weak_slots() > 0 || self.refused_for_space(&e),
                "seed {}: resync failed: {e}",
                self.seed
            );
        }
    }

    pub(super) fn scrub(&mut self) {
        trace!(self, "scrub");
        if self.a().state() != ArrayState::Optimal {
            return;
        }
        if self.a().resync_owed() {
            let e = self
                .a()
                .scrub(&ScrubOptions::default(), &AtomicBool::new(false))
                .expect_err("a scrub while a resync is owed");
            assert!(
                e.to_string().contains("resyncing"),
                "seed {}: {e}",
                self.seed
            );
            return;
        }
        let opts = ScrubOptions {
            hole_bytes: CHUNK,
            ..Default::default()
        };
        match self.a().scrub(&opts, &AtomicBool::new(false)) {
            Ok(r) => assert!(
                r.mismatches.is_empty() || self.weak_slots() > 0,
                "seed {}: scrub found {} mismatches in a live array: {:?}",
                self.seed,
                r.mismatches.len(),
                r.mismatches
            ),
            // A fault the array had not noticed yet stops the scrub.
            Err(e) => assert!(
                self.cut_now() || self.weak_slots() > 0,
                "seed {}: scrub failed: {e}",
                self.seed
            ),
        }
    }
}
