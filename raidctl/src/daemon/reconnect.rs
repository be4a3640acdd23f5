//! Network members that stopped answering come back by themselves: a slot
//! failed because its member was given up as unreachable (not one the
//! operator failed, nor one whose server reported errors) is tried again
//! every few seconds, and re-added as soon as its export answers and carries
//! this array's metadata. The re-add resyncs only the regions the
//! write-intent bitmap marked while it was away.
//!
//! A member is left to the operator, with a `member_kept_out` event, where
//! it answers with a disk not to be taken back by itself (an older copy of
//! its own, another's), or where it was lost again after each of its last
//! `RETURNS` returns within `RETURNS_WITHIN` (a server slower than the
//! member timeout, a flapping link): each return costs a failure alert
//! and a resync, and would go on for as long as the server is sick.

use super::{Daemon, Served};
use parking_lot::Mutex;
use raid_core::metadata::SlotState;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Time between two tries at one member.
const RETRY: Duration = Duration::from_secs(2);
/// Time between two reads of an active network member's metadata
/// (`probe_network_members`).
const PROBE: Duration = Duration::from_secs(5);

/// Returns by itself of one member within `RETURNS_WITHIN` after which a
/// further loss leaves it to the operator.
const RETURNS: usize = 3;
const RETURNS_WITHIN: Duration = Duration::from_secs(600);

/// The daemon's work on network members, per (array, slot).
#[derive(Default)]
pub(super) struct Tries {
    /// A re-add of a member given up running now, or when the next may
    /// start.
    re_adds: Mutex<HashMap<(String, usize), Try>>,
    /// The slots the operator failed (`raidctl fail`), which are never
    /// brought back by themselves.
    held: Mutex<HashSet<(String, usize)>>,
    /// A probe of an active member running now, or when the next may
    /// start.
    probes: Mutex<HashMap<(String, usize), Try>>,
    /// Why the last re-add of a member that answers again was refused (an
    /// older copy of its disk, another member's) or could not be recorded
    /// (the state folder full): logged when it changes, not at every try.
    refused: Mutex<HashMap<(String, usize), String>>,
    /// When each member came back by itself lately (`RETURNS`).
    returns: Mutex<HashMap<(String, usize), Vec<Instant>>>,
}

impl Tries {
    /// The operator failed this slot: leave it to them. False if it was
    /// held already.
    pub(super) fn hold(&self, array: &str, slot: usize) -> bool {
        self.held.lock().insert((array.to_string(), slot))
    }

    /// The slots the operator failed, locked: a re-add by the daemon
    /// checks and acts under it, so a `fail` (`hold`) waits for it.
    pub(super) fn holds(&self) -> parking_lot::MutexGuard<'_, HashSet<(String, usize)>> {
        self.held.lock()
    }

    /// A device took the slot again (re-add, replace).
    pub(super) fn release(&self, array: &str, slot: usize) {
        self.held.lock().remove(&(array.to_string(), slot));
    }

    /// A device was put in the slot by the operator (re-add, replace) or a
    /// spare took it: the returns so far, and why one was refused, were
    /// another device's story.
    pub(super) fn forget_returns(&self, array: &str, slot: usize) {
        let key = (array.to_string(), slot);
        self.returns.lock().remove(&key);
        self.refused.lock().remove(&key);
    }

    /// The array starts: what was held or counted for its slots belongs to
    /// its last run (an operator's fail is in its metadata now: a failed
    /// member is not retried, only one given up or missing at the start).
    pub(super) fn forget_array(&self, array: &str) {
        self.held.lock().retain(|(a, _)| a != array);
        self.returns.lock().retain(|(a, _), _| a != array);
        self.refused.lock().retain(|(a, _), _| a != array);
    }

    /// Counts a return by itself; whether the member came back `RETURNS`
    /// times within `RETURNS_WITHIN` (then this loss is one too many).
    fn returned(&self, key: &(String, usize)) {
        let mut r = self.returns.lock();
        let times = r.entry(key.clone()).or_default();
        times.retain(|t| t.elapsed() < RETURNS_WITHIN);
        times.push(Instant::now());
    }

    fn keeps_returning(&self, key: &(String, usize)) -> bool {
        self.returns.lock().get(key).is_some_and(|times| {
            times
                .iter()
                .filter(|t| t.elapsed() < RETURNS_WITHIN)
                .count()
                >= RETURNS
        })
    }
}

enum Try {
    Running,
    After(Instant),
}

impl Daemon {
    /// Reads each active network member's metadata every `PROBE` (on a
    /// thread of its own: an answer may take the member timeout). NBD has
    /// no keepalive, so without it a host that went away while the array
    /// sat idle would be found only by the next request: now it is failed
    /// and alerted within `PROBE` and the member timeout, while the other
    /// members still hold the redundancy to replace it.
    pub(super) fn probe_network_members(self: &Arc<Self>, s: &Arc<Served>) {
        for slot in s.array.slots() {
            if slot.state == SlotState::Failed {
                continue;
            }
            let Some(m) = s.array.member_of(slot.slot) else {
                continue;
            };
            if !matches!(m.device_key(), raid_core::member::DeviceKey::Network(_)) {
                continue;
            }
            let key = (s.array.name().to_string(), slot.slot);
            {
                let mut p = self.reconnects.probes.lock();
                match p.get(&key) {
                    Some(Try::Running) => continue,
                    Some(Try::After(at)) if Instant::now() < *at => continue,
                    _ => {}
                }
                p.insert(key.clone(), Try::Running);
            }
            // The thread holds the member's handle and a weak reference to
            // the array only: a stopped array is not kept alive (its local
            // members' locks, its other connections) by a probe waiting up
            // to the member timeout for a host that is gone.
            let (d, array) = (self.clone(), Arc::downgrade(&s.array));
            std::thread::spawn(move || {
                let mut buf = raid_core::buf::AlignedBuf::new(raid_core::metadata::SB_SIZE);
                if let Err(e) = m.read_at(&mut buf, raid_core::metadata::SB_OFFSETS[0]) {
                    let why = format!("a read of its metadata failed: {e}");
                    if array
                        .upgrade()
                        .is_some_and(|a| a.fail_probed(key.1, &m, &why))
                    {
                        tracing::warn!(array = %key.0, slot = key.1, "network member failed by its probe: {e}");
                    }
                }
                d.reconnects
                    .probes
                    .lock()
                    .insert(key, Try::After(Instant::now() + PROBE));
            });
        }
    }

    /// Starts a try (on its own thread: connecting may take seconds) for
    /// each slot of `s` whose member was given up as unreachable, or whose
    /// network member did not answer at the start (its server was down
    /// then: it comes back as one given up later would).
    pub(super) fn retry_unreachable(self: &Arc<Self>, s: &Arc<Served>) {
        for slot in s.array.slots() {
            if slot.state != SlotState::Failed {
                continue;
            }
            let member = match s.array.member_of(slot.slot) {
                Some(m) if m.unreachable() => m.identity().to_string(),
                Some(_) => continue,
                None if slot.missing_at_start => match s.record.lock().members.get(slot.slot) {
                    Some(p) if crate::remote::is_remote(p) => p.display().to_string(),
                    _ => continue,
                },
                None => continue,
            };
            let key = (s.array.name().to_string(), slot.slot);
            if self.reconnects.held.lock().contains(&key) {
                continue;
            }
            if self.reconnects.keeps_returning(&key) {
                // Held as the operator's `fail` holds it: their re-add or
                // replace releases it. Under the holds' lock, which an
                // operator's re-add takes too: a slot filled meanwhile is
                // not held (nor alerted) for the device that left it.
                let newly = {
                    let mut held = self.reconnects.holds();
                    s.array
                        .slots()
                        .get(key.1)
                        .is_some_and(|x| x.state == SlotState::Failed)
                        && held.insert(key.clone())
                };
                if newly {
                    let reason = format!(
                        "it came back by itself {RETURNS} times within {} minutes and was lost again each time: its server answers, but not within the member timeout ([remote] timeout_seconds) or not for long (an overloaded server, a flapping link)",
                        RETURNS_WITHIN.as_secs() / 60
                    );
                    tracing::error!(array = %key.0, slot = key.1, member = %member, "network member left to the operator: {reason}");
                    s.array
                        .record_event(raid_core::array::ArrayEvent::MemberKeptOut {
                            slot: key.1,
                            member: member.clone(),
                            reason,
                        });
                }
                continue;
            }
            {
                let mut t = self.reconnects.re_adds.lock();
                match t.get(&key) {
                    Some(Try::Running) => continue,
                    Some(Try::After(at)) if Instant::now() < *at => continue,
                    _ => {}
                }
                t.insert(key.clone(), Try::Running);
            }
            let (d, member) = (self.clone(), PathBuf::from(member));
            let array = Arc::downgrade(&s.array);
            std::thread::spawn(move || {
                let r = d.re_add_as(&key.0, &member, true);
                let mut alert = None;
                {
                    let mut t = d.reconnects.re_adds.lock();
                    match r {
                        Ok(msg) => {
                            tracing::warn!(array = %key.0, slot = key.1, "network member back: {msg}");
                            d.reconnects.refused.lock().remove(&key);
                            d.reconnects.returned(&key);
                            t.remove(&key);
                        }
                        // It answers, with a disk not to be taken back by
                        // itself: said once (the operator's to decide).
                        // Not where the refusal is the operator's doing
                        // (a fail that holds the slot, a re-add or a
                        // replace that filled it meanwhile).
                        Err(e) if e.code == crate::error::code::REFUSED => {
                            let still_waits = !d.reconnects.holds().contains(&key)
                                && array.upgrade().is_some_and(|a| {
                                    a.slots()
                                        .get(key.1)
                                        .is_some_and(|x| x.state == SlotState::Failed)
                                });
                            let mut said = d.reconnects.refused.lock();
                            if still_waits && said.get(&key) != Some(&e.msg) {
                                tracing::error!(array = %key.0, slot = key.1, "network member answers again but is not taken back: {}", e.msg);
                                alert = Some(e.msg.clone());
                                said.insert(key.clone(), e.msg);
                            }
                            t.insert(key.clone(), Try::After(Instant::now() + RETRY));
                        }
                        // It answers, but its return cannot be recorded
                        // (the state folder full or read-only): tried
                        // again, and said once, as the array stays
                        // degraded until the operator frees room.
                        Err(e) if e.msg.starts_with(super::record::NOT_RECORDABLE) => {
                            let mut said = d.reconnects.refused.lock();
                            if said.get(&key) != Some(&e.msg) {
                                tracing::error!(array = %key.0, slot = key.1, "network member answers again but its return waits: {}", e.msg);
                                said.insert(key.clone(), e.msg);
                            }
                            t.insert(key.clone(), Try::After(Instant::now() + RETRY));
                        }
                        Err(e) => {
                            tracing::debug!(array = %key.0, slot = key.1, "network member still away: {e}");
                            t.insert(key.clone(), Try::After(Instant::now() + RETRY));
                        }
                    }
                }
                // Recorded with no lock of ours held (it waits for the
                // array's metadata lock).
                if let (Some(reason), Some(a)) = (alert, array.upgrade()) {
                    a.record_event(raid_core::array::ArrayEvent::MemberKeptOut {
                        slot: key.1,
                        member: member.display().to_string(),
                        reason,
                    });
                }
            });
        }
    }
}
