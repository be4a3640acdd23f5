//! The daemon's side of the arrays' background work: the monitor's rounds,
//! rate limits, scrubs asked for or scheduled, write-intent bits cleared
//! once idle. The work itself runs on threads the array owns.

use super::observe::unix_now;
use super::{scrub_options, Daemon, Served};
use crate::error::{CliError, Result};
use crate::protocol::Response;
use crate::status;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Daemon {
    /// Every quarter second: new events are logged and alerted; a member
    /// file that shrank is failed; a failed slot with a spare at hand gets
    /// the spare; write-intent bits no write needs any more are cleared; a
    /// rebuilding slot gets a rebuild thread.
    pub(super) fn monitor(self: &Arc<Self>) {
        while !self.exiting.load(Ordering::Acquire) {
            self.monitor_tick
                .store(self.started.elapsed().as_millis() as u64, Ordering::Release);
            self.process_events();
            let arrays: Vec<Arc<Served>> = self.arrays.lock().values().cloned().collect();
            for s in arrays {
                self.save_record_again(&s);
                let deleted = s.array.check_member_files();
                self.warn_deleted_members(&s, deleted);
                self.retry_unreachable(&s);
                self.probe_network_members(&s);
                self.take_spare(&s);
                self.settle_bitmap(&s);
                s.array.kick_resync();
                // A rebuild or hot replace running: nothing to start.
                if s.array.copy_progress().is_some() {
                    continue;
                }
                s.engine.check_health();
                self.kick_rebuild(&s);
                self.scheduled_scrub(&s);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Clears the write-intent bits of regions no longer written, once
    /// their linger is over (`Array::settle_bitmap`: a flush first, at
    /// most once a linger), on a thread of its own: that flush may wait on
    /// a slow member, which must not hold up the monitor's rounds. The
    /// thread holds the array weakly, as the network probes do.
    fn settle_bitmap(&self, s: &Served) {
        if !s.array.bitmap_settle_due() || s.settling.swap(true, Ordering::AcqRel) {
            return;
        }
        let (array, settling) = (Arc::downgrade(&s.array), s.settling.clone());
        let spawned = std::thread::Builder::new()
            .name("bitmap-settle".into())
            .spawn(move || {
                if let Some(a) = array.upgrade() {
                    if let Err(e) = a.settle_bitmap() {
                        tracing::warn!(array = %a.name(), "clearing the write-intent bitmap: {e}");
                    }
                }
                settling.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            tracing::warn!(array = %s.array.name(), "no thread to clear the write-intent bitmap: {e}");
            s.settling.store(false, Ordering::Release);
        }
    }

    /// Changes the rate limits of the array's background work, also of the
    /// work running now; says what they are.
    pub(super) fn rate(
        &self,
        name: &str,
        rebuild: Option<u64>,
        scrub: Option<u64>,
    ) -> Result<String> {
        let s = self.served(name)?;
        // Kept in the record, so a restart keeps them too; saved first, so
        // that an error leaves the rates as they were.
        if rebuild.is_some() || scrub.is_some() {
            let mut rec = s.record.lock();
            let mut next = rec.clone();
            next.rebuild_rate = rebuild.or(rec.rebuild_rate);
            next.scrub_rate = scrub.or(rec.scrub_rate);
            self.state.save(&next)?;
            *rec = next;
        }
        s.array.set_rates(rebuild, scrub);
        let (r, sc) = s.array.rates();
        let show = |r: u64| {
            if r == 0 {
                "no limit".to_string()
            } else {
                format!("{}/s", status::human_bytes(r))
            }
        };
        Ok(format!(
            "'{name}': rebuild, replace and resync {}, scrub {}",
            show(r),
            show(sc)
        ))
    }

    /// Starts the array's scrub in the background; refused while one
    /// runs. `mark`: where a scheduled scrub records that it completed.
    pub(super) fn start_scrub(
        &self,
        s: &Arc<Served>,
        repair: bool,
        mark: Option<(PathBuf, u64)>,
    ) -> Result<u64> {
        // Kept while it runs: a scrub the daemon never saw end (killed,
        // a crash) is said at the next start (`scrub_cut`). Written once
        // the scrub is started (a refused one leaves the mark of the one
        // that runs as it is), under the lock its end takes to remove it.
        let running = self.state.scrub_running(s.array.name());
        let (ended, served) = (running.clone(), Arc::downgrade(s));
        let _marking = s.scrub_mark.lock();
        let id = s.array.start_scrub(
            &scrub_options(repair),
            Box::new(move |array, r| {
                {
                    let served = served.upgrade();
                    let _marking = served.as_ref().map(|s| s.scrub_mark.lock());
                    let _ = std::fs::remove_file(&ended);
                }
                match r {
                    Ok(rep) if !rep.interrupted => {
                        tracing::info!(
                            array = array.name(),
                            mismatches = rep.mismatches.len(),
                            "scrub done"
                        );
                        if let Some((mark, now)) = mark {
                            let _ = std::fs::create_dir_all(mark.parent().unwrap());
                            let _ = std::fs::write(&mark, now.to_string());
                        }
                    }
                    Ok(_) => tracing::info!(array = array.name(), "scrub interrupted"),
                    Err(e) => tracing::warn!(array = array.name(), "scrub failed: {e}"),
                }
            }),
        )?;
        let _ = std::fs::create_dir_all(running.parent().unwrap());
        let _ = std::fs::write(&running, if repair { "repair" } else { "check" });
        Ok(id)
    }

    /// `raidctl scrub`: in the background (`background`), cancelled
    /// (`cancel`), or waited for, its report in the answer.
    pub(super) fn scrub(
        &self,
        name: &str,
        repair: bool,
        background: bool,
        cancel: bool,
    ) -> Result<Response> {
        let s = self.served(name)?;
        if cancel {
            let (done, rows) = s
                .array
                .cancel_scrub()
                .ok_or_else(|| CliError::refused(format!("no scrub of '{name}' is running")))?;
            let mut msg = format!("scrub of '{name}' cancelled after {done} of {rows} rows");
            // A cancel holds until the schedule's next period: counted as
            // the period's scrub, or the schedule would start it again at
            // once (a scrub hurting production must stay stopped).
            if let Some(sched) = &self.scrub_schedule {
                let mark = self.state.scrub_last(name);
                let _ = std::fs::create_dir_all(mark.parent().unwrap());
                let _ = std::fs::write(&mark, unix_now().to_string());
                msg.push_str(&format!(
                    "; the schedule's next scrub is due in {} hours",
                    sched.every_hours
                ));
            }
            return Ok(Response::ok(msg));
        }
        let id = self.start_scrub(&s, repair, None)?;
        if background {
            return Ok(Response::ok(format!(
                "scrub of '{name}' started{} (raidctl status {name} shows its progress, raidctl events {name} its result)",
                if repair { " with repair" } else { "" }
            )));
        }
        let r = s.array.wait_scrub(id).ok_or_else(|| {
            CliError::failed(format!(
                "the scrub of '{name}' was cancelled (raidctl events {name} shows how far it got)"
            ))
        })??;
        let slots = s.array.slots();
        let result = crate::protocol::ScrubResult {
            array: name.into(),
            repair,
            rows_checked: r.rows,
            rows_are: match s.array.geometry().level.parity_chunks() {
                0 => "mirrored chunks",
                _ => "stripes",
            }
            .into(),
            bytes_read: r.bytes_read,
            mismatches: r
                .mismatches
                .iter()
                .map(|m| crate::protocol::ScrubMismatch {
                    stripe: m.stripe,
                    slot: m.slot,
                    member: m
                        .slot
                        .and_then(|i| slots.get(i))
                        .and_then(|x| x.member.clone()),
                    what: m.what.clone(),
                    repaired: m.repaired,
                    located: m.located,
                    unresolved: m.unresolved,
                })
                .collect(),
        };
        Ok(Response {
            ok: true,
            scrub: Some(result),
            ..Default::default()
        })
    }

    /// Starts a scrub when the schedule says one is due: the last one is
    /// remembered in STATE_DIR/scrub/NAME.last (seconds since the epoch).
    pub(super) fn scheduled_scrub(&self, s: &Arc<Served>) {
        let Some(sched) = &self.scrub_schedule else {
            return;
        };
        // Nor while a full filesystem stops writes: a repair would be
        // refused, and the scrub started again at the next round.
        if s.array.state() != raid_core::array::ArrayState::Optimal
            || s.array.scrub_progress().is_some()
            || s.array.resync_owed()
            || s.array.out_of_space().is_some()
        {
            return;
        }
        let mark = self.state.scrub_last(s.array.name());
        let now = unix_now();
        let last: u64 = std::fs::read_to_string(&mark)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        if (now.saturating_sub(last) as f64) < sched.every_hours * 3600.0 {
            return;
        }
        if let Err(e) = self.start_scrub(s, sched.repair, Some((mark, now))) {
            tracing::warn!(array = s.array.name(), "scheduled scrub not started: {e}");
        }
    }
}
