//! Rounds of requests in flight together on the array's shard: the
//! engine's own shard (`raid_core::shard::Stepped`), its loop turned by
//! this thread after each event the seed chooses: a request given, a
//! member I/O completed (in any order), a disk vanishing or going bad
//! between two completions, the journal's committer leading a group of
//! the shard's records (where the life steps it), a few steps of an owed
//! resync while the shard holds nothing. What the shard hands to
//! the blocking path runs here too, once nothing is in flight on the shard
//! (it may wait for a stripe lock or for writers in flight, which only
//! this thread moves); a write whose member write erred is ended as soon
//! as no member I/O is in flight, since a write waiting on the shard for
//! room in the journal may need its end.
//!
//! In half the lives (by the seed alone: no draw added), the round's
//! requests are given by a front end run on the shard itself
//! (`raid_core::shard::Client`), which takes them from a queue at each
//! pass instead of the shard taking them from its inbox; their
//! completions then run on the shard, those of the blocking path posted
//! back and heard after the next turn. `SIM_NO_FRONT=1` gives them
//! through the inbox in every life, to tell whether a failing seed's
//! fault is the front end's.
//!
//! Invariants, on top of the life's: a read returns, block by block, the
//! last acknowledged write or one in flight during the read; a write is
//! refused only when the power went; no request is left unanswered once
//! the shard has nothing in flight; and, after a cut with writes in flight,
//! the life's recovery checks hold (each block holds a value it had since
//! the last flush, parity is repaired).

use super::{World, BLOCK};
use raid_core::array::ArrayError;
use raid_core::buf::AlignedBuf;
use raid_core::metadata::SlotState;
use raid_core::shard::{Client, Local, Stepped, WriteDone};
use rand::Rng;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Reads and writes the shards served themselves, over every life of
/// the run (a run in which they served none tested nothing of them): the
/// engine's counts (`shard_round`), then at `STEPS` the journal
/// committer's steps that found work (`commit_journal_step`: groups to
/// lead, a ring to free).
pub(super) static SERVED: [AtomicU64; 10] = [const { AtomicU64::new(0) }; 10];
/// Where `SERVED` counts the committer's steps.
const STEPS: usize = 9;

/// What a request of the round asks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Ask {
    Read,
    Write,
    /// A write durable once answered (`Stepped::write_fua`).
    WriteFua,
}

/// Requests for the front end on the shard to give: what it asks, the
/// offset, the buffer, what to call with the answer.
pub(super) type Front = Arc<Mutex<VecDeque<(Ask, u64, AlignedBuf, WriteDone)>>>;

/// The front end: gives, at each poll, what the round queued for it.
struct FrontEnd(Front);

impl Client for FrontEnd {
    fn poll(&mut self, io: &mut Local<'_>) -> bool {
        let queued: Vec<_> = self.0.lock().unwrap().drain(..).collect();
        for (ask, offset, buf, done) in queued {
            match ask {
                Ask::Write => io.write(offset, buf, done),
                Ask::WriteFua => io.write_fua(offset, buf, done),
                Ask::Read => io.read(offset, buf, done),
            }
        }
        true
    }
}

/// Whether this life's requests are given by a front end on the shard
/// (see the module's doc for `SIM_NO_FRONT`).
fn by_front_end(seed: u64) -> bool {
    (seed / 40) % 2 == 1 && std::env::var("SIM_NO_FRONT").is_err()
}

/// Answers the round's clients heard, by request, in the order answered.
type Heard = Arc<Mutex<Vec<(usize, Result<AlignedBuf, ArrayError>)>>>;

/// A request of the round, given and not yet answered.
enum Asked {
    /// The blocks from `b0`, and what they are to hold; with FUA (durable
    /// once answered) or not.
    Write { b0: usize, data: Vec<u8>, fua: bool },
    /// The blocks from `b0`, each with the values it may return.
    Read { b0: usize, may: Vec<Vec<Vec<u8>>> },
}

impl World {
    /// A round of 1 to 16 requests (see the module's doc). A cut ends it:
    /// the writes it had in flight may or may not have landed.
    pub(super) fn shard_round(&mut self) {
        let array = self.array.clone().expect("an array is running");
        if self.stepped.is_none() {
            let st = Stepped::new(array)
                .unwrap_or_else(|e| panic!("seed {}: no shard (io_uring): {e}", self.seed));
            if by_front_end(self.seed) {
                trace!(self, "requests given by a front end on the shard");
                let front = Front::default();
                st.run_client(Box::new(FrontEnd(front.clone())));
                self.front = Some(front);
            }
            self.stepped = Some(st);
        }
        // The engine's counts, in `SERVED`'s order (all but the last).
        let served = |w: &World| {
            let c = w.stepped.as_ref().expect("made above").counts();
            [
                &c.on_shards,
                &c.writes_on_shards,
                &c.blocking,
                &c.writes_blocking,
                &c.degraded_on_shards,
                &c.writes_merged,
                &c.write_errors,
                &c.writes_split,
                &c.fua_on_shards,
            ]
            .map(|n| n.load(Ordering::Relaxed))
        };
        let before = served(self);
        self.play_round();
        for (i, n) in served(self).into_iter().enumerate() {
            SERVED[i].fetch_add(n - before[i], Ordering::Relaxed);
        }
    }

    fn play_round(&mut self) {
        let tl = self.timeline.clone().expect("a life on a shard");
        let heard: Heard = Default::default();
        let mut asked: BTreeMap<usize, Asked> = BTreeMap::new();
        let n = self.rng.gen_range(1..=16);
        trace!(self, "round of {n} requests on the shard");
        let mut given = 0;
        // Requests given since the shard's last turn (they wait in its
        // inbox, to be taken together, as a front end's batch is).
        let mut unturned = false;
        loop {
            self.hear(&heard, &mut asked);
            if self.cut_now() {
                trace!(
                    self,
                    "the power went with {} requests in flight",
                    asked.len()
                );
                for a in asked.into_values() {
                    if let Asked::Write { b0, data, .. } = a {
                        for (k, v) in data.chunks(BLOCK).enumerate() {
                            self.model.maybe_wrote(b0 + k, v);
                        }
                    }
                }
                return;
            }
            let st = self.stepped.as_mut().expect("made above");
            let (pending, busy, queued) = (tl.pending(), st.busy(), st.blocking_queued());
            let finishing = st.finishing_queued();
            // Records of the shard's degraded writes wait for a leader (or
            // the journal's ring for freeing): the committer's step runs
            // at a moment the seed picks among the member I/Os, or when
            // nothing else can move.
            let due = self.a().journal_commit_due();
            let r = self.rng.gen_range(0..100);
            if due && ((35..50).contains(&r) || pending == 0) {
                trace!(
                    self,
                    "  the journal's committer: leads a group, frees the ring"
                );
                if self.a().commit_journal_step() {
                    SERVED[STEPS].fetch_add(1, Ordering::Relaxed);
                }
            } else if (50..56).contains(&r) && self.resync_step_now(pending, queued, finishing) {
                // As the engine's resync thread would, between requests:
                // those given later meet rows on both sides of it.
                let steps = self.rng.gen_range(1..=3);
                self.resync_steps(steps);
            } else if given < n && (r < 35 || (pending == 0 && queued == 0)) {
                self.give(given, &heard, &mut asked);
                given += 1;
                if self.rng.gen_bool(0.5) {
                    unturned = true;
                    continue;
                }
            } else if pending > 0 && r >= 98 {
                self.disk_fails_in_flight();
            } else if pending > 0 && (93..95).contains(&r) && self.cut_allowed() {
                trace!(self, "  the power goes");
                self.power.off.store(true, Ordering::SeqCst);
            } else if pending > 0 && r >= 95 && self.may_flush_in_flight() {
                // Covers the writes answered so far; those in flight may
                // land before it or after.
                trace!(self, "  a flush, with member I/O in flight");
                self.flush();
            } else if pending > 0 {
                let i = self.rng.gen_range(0..pending);
                tl.complete(i);
            } else if queued > 0 && !busy {
                trace!(self, "  a request on the blocking path");
                self.stepped.as_mut().expect("made above").run_blocking();
            } else if pending == 0 && finishing > 0 {
                // The shard waits for the journal (room in its ring that
                // this write's end frees): as the engine's finishing
                // thread would, without waiting for the shard.
                trace!(self, "  a write whose member write erred ends");
                self.stepped.as_mut().expect("made above").run_finishing();
            } else if unturned {
                // Nothing else to do: the shard takes what waits.
            } else {
                assert!(
                    !busy,
                    "seed {}: the shard holds requests with no member I/O in flight",
                    self.seed
                );
                assert!(
                    asked.is_empty(),
                    "seed {}: requests {:?} never answered",
                    self.seed,
                    asked.keys().collect::<Vec<_>>()
                );
                return;
            }
            self.stepped.as_mut().expect("made above").turn();
            unturned = false;
        }
    }

    /// Gives request `id`: a read or a write of 1 to 4 blocks (a write
    /// that would overlap one in flight reads instead: writes in flight
    /// together have no order, and the model keeps one value per block).
    fn give(&mut self, id: usize, heard: &Heard, asked: &mut BTreeMap<usize, Asked>) {
        let blocks = self.blocks();
        // Most of them one block: inside one chunk, which the shard serves
        // on every level (more cross a chunk, which it serves on RAID1/10
        // under every chunk's lock, and may cross a RAID5/6 stripe, which
        // it cuts into a write per stripe).
        let nb = match self.rng.gen_bool(0.75) {
            true => 1,
            false => self.rng.gen_range(2..=4).min(blocks),
        };
        // Some follow the request before (a stream: writes of one stripe
        // waiting together, which the shard merges).
        let next = asked.values().last().map(|a| match a {
            Asked::Write { b0, data, .. } => b0 + data.len() / BLOCK,
            Asked::Read { b0, may } => b0 + may.len(),
        });
        let b0 = match next {
            Some(n) if n + nb <= blocks && self.rng.gen_bool(0.5) => n,
            _ => self.rng.gen_range(0..=blocks - nb),
        };
        let overlaps = |x0: usize, xn: usize| x0 < b0 + nb && b0 < x0 + xn;
        let writing = asked.values().any(|a| match a {
            Asked::Write { b0: x0, data, .. } => overlaps(*x0, data.len() / BLOCK),
            Asked::Read { .. } => false,
        });
        let h = heard.clone();
        let done = Box::new(move |r| h.lock().unwrap().push((id, r)));
        if self.rng.gen_bool(0.6) && !writing {
            let mut data = vec![0u8; nb * BLOCK];
            self.rng.fill(&mut data[..]);
            trace!(
                self,
                "  {id}: write blocks {b0}..{}: {:02x?}",
                b0 + nb,
                super::heads(&data)
            );
            // Reads in flight over these blocks may return them too.
            for a in asked.values_mut() {
                if let Asked::Read { b0: r0, may } = a {
                    for (k, m) in may.iter_mut().enumerate() {
                        let b = *r0 + k;
                        if (b0..b0 + nb).contains(&b) {
                            m.push(data[(b - b0) * BLOCK..(b - b0 + 1) * BLOCK].to_vec());
                        }
                    }
                }
            }
            let mut buf = AlignedBuf::new(data.len());
            buf.copy_from_slice(&data);
            // One in four with FUA: durable once answered, with no flush.
            let fua = self.rng.gen_bool(0.25);
            let ask = if fua { Ask::WriteFua } else { Ask::Write };
            if fua {
                trace!(self, "  {id}: with FUA");
            }
            self.send(ask, b0, buf, done);
            asked.insert(id, Asked::Write { b0, data, fua });
        } else {
            trace!(self, "  {id}: read blocks {b0}..{}", b0 + nb);
            let may = (b0..b0 + nb)
                .map(|b| {
                    let mut m = vec![self.model.now[b].clone()];
                    m.extend(self.model.open[b].iter().cloned());
                    for a in asked.values() {
                        if let Asked::Write { b0: w0, data, .. } = a {
                            if (*w0..*w0 + data.len() / BLOCK).contains(&b) {
                                m.push(data[(b - w0) * BLOCK..(b - w0 + 1) * BLOCK].to_vec());
                            }
                        }
                    }
                    m
                })
                .collect();
            let buf = AlignedBuf::new(nb * BLOCK);
            self.send(Ask::Read, b0, buf, done);
            asked.insert(id, Asked::Read { b0, may });
        }
    }

    /// Gives a read or write of the blocks from `b0` to the shard: through
    /// the life's front end where it has one, else through the inbox.
    fn send(&self, ask: Ask, b0: usize, buf: AlignedBuf, done: WriteDone) {
        let offset = (b0 * BLOCK) as u64;
        let st = self.stepped.as_ref().expect("made by the round");
        match (&self.front, ask) {
            (Some(f), _) => f.lock().unwrap().push_back((ask, offset, buf, done)),
            (None, Ask::Write) => st.write(offset, buf, done),
            (None, Ask::WriteFua) => st.write_fua(offset, buf, done),
            (None, Ask::Read) => st.read(offset, buf, done),
        }
    }

    /// Checks what the clients heard since the last look.
    fn hear(&mut self, heard: &Heard, asked: &mut BTreeMap<usize, Asked>) {
        let answers = std::mem::take(&mut *heard.lock().unwrap());
        for (id, r) in answers {
            let a = asked
                .remove(&id)
                .unwrap_or_else(|| panic!("seed {}: request {id} answered twice", self.seed));
            let ok = r.is_ok();
            trace!(
                self,
                "  {id}: answered, {}",
                if ok { "ok" } else { "an error" }
            );
            match (a, r) {
                (Asked::Write { b0, data, fua }, r) => {
                    if let Ok(buf) = &r {
                        assert!(
                            buf[..] == data[..],
                            "seed {}: write {id} answered with another buffer than its own",
                            self.seed
                        );
                    }
                    let what = format!("write {id} on the shard");
                    let ok = r.is_ok();
                    self.answered_write(b0, &data, r.err(), &what);
                    if fua && ok {
                        // Durable now: a cut from here on keeps it (or
                        // what is written over it later).
                        for (k, v) in data.chunks(BLOCK).enumerate() {
                            self.model.durable(b0 + k, v);
                        }
                    }
                }
                (Asked::Read { b0, may }, Ok(buf)) => {
                    for (k, m) in may.iter().enumerate() {
                        let got = &buf[k * BLOCK..(k + 1) * BLOCK];
                        assert!(
                            m.iter().any(|v| v[..] == *got),
                            "seed {}: read {id} on the shard: block {} holds {:02x?}, neither its last acknowledged write nor one in flight ({:02x?})",
                            self.seed,
                            b0 + k,
                            &got[..4],
                            m.iter().map(|v| v[..4].to_vec()).collect::<Vec<_>>()
                        );
                        // A value still open is decided by this read (one
                        // of a write in flight, or of a block written
                        // since it was given, decides nothing).
                        let _ = self.model.read_back(b0 + k, got);
                    }
                }
                (Asked::Read { .. }, Err(e)) => assert!(
                    self.cut_now() || self.read_refused_for_space(&e),
                    "seed {}: read {id} on the shard failed within redundancy: {e}",
                    self.seed
                ),
            }
        }
    }

    /// Whether steps of an owed resync may run now: it can run (the array
    /// optimal, or a mirror), and the shard holds nothing (a step waits
    /// for its rows' locks, which a request in flight may hold, and only
    /// this thread moves it).
    fn resync_step_now(&self, pending: usize, queued: usize, finishing: usize) -> bool {
        let st = self.stepped.as_ref().expect("a round on a shard");
        let idle = pending == 0 && queued == 0 && finishing == 0 && !st.busy();
        idle && self.a().resync_progress().is_some()
    }

    /// Whether a flush may run with writes in flight on the shard: only
    /// where it cannot fail (no member's disk gone, no cut planned), as failing a
    /// member waits for the writers in flight, which only this thread
    /// moves. (The engine flushes on a thread of its own.)
    fn may_flush_in_flight(&self) -> bool {
        let planned = self.power.cut_planned();
        let members: Vec<String> = self
            .a()
            .slots()
            .into_iter()
            .filter_map(|s| s.member)
            .collect();
        let gone = self
            .disks
            .iter()
            .any(|d| members.contains(&d.name) && d.st.lock().unwrap().vanished);
        // A flush settles the journal, which waits for every record's
        // in-place writes: here only this thread moves them.
        let records = self.a().journal_records_in_flight();
        !planned && !gone && records == 0
    }

    /// With member I/O in flight, an active member's disk vanishes or a
    /// row of it goes bad (the array finds out from the I/O that meets
    /// it): within what the level survives, not with a cut planned (see
    /// the life's rule on the write hole), nor while a parity array's
    /// resync is owed.
    fn disk_fails_in_flight(&mut self) {
        let planned = self.power.cut_planned();
        let owed = self.parity_resync_owed();
        if planned || self.weak_slots() >= self.tolerance() || owed {
            return;
        }
        let slots = self.a().slots();
        let active: Vec<_> = slots
            .iter()
            .filter(|s| s.state == SlotState::Active)
            .filter_map(|s| s.member.clone())
            .collect();
        if active.is_empty() {
            return;
        }
        let name = &active[self.rng.gen_range(0..active.len())];
        let d = self.disks.iter().find(|d| &d.name == name).unwrap().clone();
        if self.rng.gen_bool(0.5) {
            trace!(self, "  disk {name} vanishes");
            d.st.lock().unwrap().vanished = true;
        } else {
            let row = self.rng.gen_range(0..self.rows);
            let at = self.data_offset + row * super::CHUNK;
            trace!(self, "  disk {name} goes bad at row {row}");
            d.st.lock().unwrap().bad.push((at, at + super::CHUNK));
        }
    }
}
