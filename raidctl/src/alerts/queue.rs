//! The outgoing queue and its sender.
//!
//! Each event worth alerting is a file in STATE_DIR/alerts/queue, written
//! before anything is sent. The sender waits a short coalescing window,
//! then mails the queued events of an array in one message, to each
//! recipient in a transaction of its own (`AlertConfig::send_each`).
//!
//! It keeps, in memory, which recipients already have each queued event
//! and which refused it for good (a 5xx answer): a retry goes only to
//! those still owed it, so one recipient's mailbox being down neither
//! holds the message from the others nor sends them copies at every
//! retry. An event leaves the queue once every recipient has it or
//! refused it, and at least one has it. One that every recipient refused
//! stays queued, and is tried again after an hour, or once the server,
//! the login or the sender changes.
//!
//! The settings are read again every few seconds while alerts wait
//! (`reload`): a fix to the server, the login or the recipients takes
//! effect for the alerts already queued, without a restart of the daemon
//! (which stays up while alerts are queued).
//!
//! A crash between the server's acceptance and the deletion of the file
//! can repeat one message; nothing is dropped.

use super::{compose, AlertConfig, Outcome};
use crate::error::{CliError, Result};
use crate::eventlog::EventRecord;
use crate::registry::StateDir;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn queue_dir(st: &StateDir) -> PathBuf {
    st.root.join("alerts").join("queue")
}

/// Puts an event in the outgoing queue (durably, before any send).
pub fn enqueue(st: &StateDir, r: &EventRecord, seq: u64) -> Result<()> {
    let dir = queue_dir(st);
    std::fs::create_dir_all(&dir)
        .map_err(|e| CliError::failed(format!("{}: {e}", dir.display())))?;
    let p = dir.join(format!("{:020}-{seq:06}.json", r.unix));
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(r).unwrap())
        .and_then(|_| std::fs::rename(&tmp, &p))
        .map_err(|e| CliError::failed(format!("{}: {e}", p.display())))
}

fn queued(st: &StateDir) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(queue_dir(st))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    v
}

/// Whether alerts of `array` wait to go out.
pub fn queued_for(st: &StateDir, array: &str) -> bool {
    queued(st).iter().any(|p| {
        std::fs::read(p)
            .ok()
            .and_then(|b| serde_json::from_slice::<EventRecord>(&b).ok())
            .is_some_and(|r| r.array == array)
    })
}

/// How many alerts wait to go out.
pub fn queue_len(st: &StateDir) -> usize {
    queued(st).len()
}

/// Whether alerts are still waiting to go out.
pub fn queue_is_empty(st: &StateDir) -> bool {
    queued(st).is_empty()
}

/// Reads the alert settings again: `Ok(None)` where the config has no
/// `[alerts]` section (any more).
pub type Reload = Box<dyn Fn() -> Result<Option<AlertConfig>> + Send>;

/// What became of a queued event for one recipient.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mark {
    Had,
    /// Refused for good, then: tried again once the settings change, or
    /// after `RETRY_REFUSED` (a fix on the server's side: a mailbox made,
    /// a relay allowed).
    Refused(Instant),
}

/// How long a recipient that refused an alert for good is left alone.
const RETRY_REFUSED: Duration = Duration::from_secs(3600);
/// How often the settings are read again while alerts wait.
const RELOAD_EVERY: Duration = Duration::from_secs(5);

/// What became of each queued event (by its file) for each recipient, in
/// memory: a daemon started anew may send a recipient a second copy of an
/// alert another recipient had not yet got.
#[derive(Default)]
struct Ledger {
    by_file: HashMap<PathBuf, HashMap<String, Mark>>,
    settings: u64,
    /// Files already said to have reached no one, or not to come off the
    /// queue.
    said: HashSet<PathBuf>,
}

impl Ledger {
    /// New settings: the refusals under the old ones count no more.
    fn settings_are(&mut self, fingerprint: u64) {
        if fingerprint != self.settings {
            self.settings = fingerprint;
            for m in self.by_file.values_mut() {
                m.retain(|_, mark| *mark == Mark::Had);
            }
            self.said.clear();
        }
    }

    fn owed(&self, p: &Path, to: &str, now: Instant) -> bool {
        match self.by_file.get(p).and_then(|m| m.get(to)) {
            None => true,
            Some(Mark::Had) => false,
            Some(Mark::Refused(at)) => now.duration_since(*at) >= RETRY_REFUSED,
        }
    }

    fn mark(&mut self, p: &Path, to: &str, mark: Mark) {
        self.by_file
            .entry(p.to_path_buf())
            .or_default()
            .insert(to.to_string(), mark);
    }

    /// Every recipient in `to` has it or refused it, and one has it.
    fn settled(&self, p: &Path, to: &[String]) -> bool {
        self.by_file.get(p).is_some_and(|m| {
            to.iter().all(|t| m.contains_key(t)) && to.iter().any(|t| m.get(t) == Some(&Mark::Had))
        })
    }

    /// Every recipient in `to` refused it.
    fn unreached(&self, p: &Path, to: &[String]) -> bool {
        self.by_file.get(p).is_some_and(|m| {
            to.iter()
                .all(|t| matches!(m.get(t), Some(Mark::Refused(_))))
        })
    }
}

/// The sender: drains the queue until `stop`, with backoff on failure.
pub fn sender(
    st: StateDir,
    mut cfg: AlertConfig,
    reload: Reload,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    counters: std::sync::Arc<crate::daemon::AlertCounters>,
) {
    use std::sync::atomic::Ordering;
    let mut backoff = Duration::from_secs(1);
    let mut next_try = Instant::now();
    let mut ledger = Ledger {
        settings: cfg.fingerprint(),
        ..Ledger::default()
    };
    let mut last_reload = Instant::now();
    // The last complaint about the config, said once.
    let mut said_of_config: Option<String> = None;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(200));
        let now = Instant::now();
        if now < next_try {
            continue;
        }
        let files = queued(&st);
        ledger.by_file.retain(|p, _| files.contains(p));
        ledger.said.retain(|p| files.contains(p));
        if files.is_empty() {
            continue;
        }
        if now.duration_since(last_reload) >= RELOAD_EVERY {
            last_reload = now;
            let complaint = match reload() {
                Ok(Some(c)) => {
                    cfg = c;
                    None
                }
                Ok(None) => Some("the config has no [alerts] section any more".to_string()),
                Err(e) => Some(e.msg),
            };
            if complaint != said_of_config {
                if let Some(c) = &complaint {
                    tracing::warn!("alert settings not read again ({c}): the queued alerts are tried with the settings read before");
                }
                said_of_config = complaint;
            }
            ledger.settings_are(cfg.fingerprint());
        }
        let events: Vec<(PathBuf, EventRecord)> = files
            .into_iter()
            .filter_map(|p| {
                let r = std::fs::read(&p).ok().and_then(|b| serde_json::from_slice(&b).ok());
                if r.is_none() {
                    tracing::error!(file = %p.display(), "unreadable queued alert; moving it aside");
                    let _ = std::fs::rename(&p, p.with_extension("bad"));
                }
                r.map(|r| (p, r))
            })
            .collect();
        // Only what someone is owed waits for the coalescing window (an
        // alert every recipient refused must not open it for the next).
        let owed = |p: &Path| cfg.to.iter().any(|t| ledger.owed(p, t, now));
        let oldest = events
            .iter()
            .filter(|(p, _)| owed(p))
            .map(|(_, r)| r.unix)
            .min();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let due = oldest.is_some_and(|o| wall >= o + cfg.coalesce_seconds);
        let mut arrays: Vec<String> = events.iter().map(|(_, r)| r.array.clone()).collect();
        arrays.sort();
        arrays.dedup();
        let mut failed = false;
        for a in arrays {
            let batch: Vec<&(PathBuf, EventRecord)> =
                events.iter().filter(|(_, r)| r.array == a).collect();
            // Recipients owed the same events get one message.
            let mut groups: BTreeMap<Vec<usize>, Vec<String>> = BTreeMap::new();
            for t in cfg.to.iter().filter(|_| due) {
                let owed: Vec<usize> = (0..batch.len())
                    .filter(|&i| ledger.owed(&batch[i].0, t, now))
                    .collect();
                if !owed.is_empty() {
                    groups.entry(owed).or_default().push(t.clone());
                }
            }
            for (owed, to) in groups {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let records: Vec<EventRecord> = owed.iter().map(|&i| batch[i].1.clone()).collect();
                let (subject, body) = compose(&records);
                let id = message_id(owed.iter().map(|&i| batch[i]));
                let deliveries = match cfg.send_each(&to, &subject, &body, Some(id)) {
                    Ok(d) => d,
                    Err(e) => {
                        counters.send_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(array = %a, "alert not sent, will retry in {backoff:?}: {}", e.msg);
                        failed = true;
                        continue;
                    }
                };
                for d in deliveries {
                    let mark = match &d.outcome {
                        Outcome::Sent(answer) => {
                            counters.sent.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(array = %a, to = %d.to, events = records.len(), "alert sent: {answer}");
                            Mark::Had
                        }
                        o if o.permanent() => {
                            counters.send_failures.fetch_add(1, Ordering::Relaxed);
                            tracing::error!(array = %a, to = %d.to, "alert refused for good for this recipient (fix or remove the address): {}", o.why());
                            Mark::Refused(Instant::now())
                        }
                        o => {
                            counters.send_failures.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(array = %a, to = %d.to, "alert not sent, will retry in {backoff:?}: {}", o.why());
                            failed = true;
                            continue;
                        }
                    };
                    for &i in &owed {
                        ledger.mark(&batch[i].0, &d.to, mark);
                    }
                }
            }
            for (p, r) in batch {
                if ledger.settled(p, &cfg.to) {
                    // Some recipient has it: done with, also for those that
                    // refused it (an address fixed later gets the next
                    // alerts, not this one).
                    match std::fs::remove_file(p) {
                        Ok(()) => {
                            ledger.by_file.remove(p);
                        }
                        // Kept in the ledger, so not sent again (a state
                        // folder gone read-only would otherwise have it
                        // sent at every turn).
                        Err(e) => {
                            if ledger.said.insert(p.clone()) {
                                tracing::error!(file = %p.display(), "a sent alert cannot be taken off the queue ({e}): it is not sent again while the daemon runs");
                            }
                        }
                    }
                } else if ledger.unreached(p, &cfg.to) && ledger.said.insert(p.clone()) {
                    tracing::error!(array = %a, event = %r.event, "alert refused by every recipient: it stays queued, tried again in an hour or once the [alerts] settings change (the daemon reads them again every few seconds)");
                }
            }
        }
        if failed {
            next_try = Instant::now() + backoff;
            backoff = (backoff * 2).min(Duration::from_secs(60));
        } else {
            backoff = Duration::from_secs(1);
        }
    }
}

/// The Message-ID of a message about these queued events: the same for
/// the same events (their queue files name them), so that a copy sent
/// again (after a restart of the daemon) can be told for one.
fn message_id<'a>(events: impl Iterator<Item = &'a (PathBuf, EventRecord)>) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut host = String::new();
    let mut array = String::new();
    for (p, r) in events {
        p.file_name().hash(&mut h);
        host.clone_from(&r.host);
        array.clone_from(&r.array);
    }
    // Only characters a Message-ID's parts may hold.
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-._".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    };
    format!(
        "<raidctl.{}.{:016x}@{}>",
        clean(&array),
        h.finish(),
        clean(&host)
    )
}

#[cfg(test)]
mod tests {
    use super::{Ledger, Mark, RETRY_REFUSED};
    use std::path::PathBuf;
    use std::time::Instant;

    fn to(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_event_leaves_the_queue_once_each_recipient_has_it_or_refused_it() {
        let mut l = Ledger::default();
        let p = PathBuf::from("1.json");
        let now = Instant::now();
        let rcpt = to(&["ops@x", "gone@x"]);
        l.mark(&p, "ops@x", Mark::Had);
        assert!(!l.settled(&p, &rcpt), "gone@x is still owed it");
        assert!(l.owed(&p, "gone@x", now) && !l.owed(&p, "ops@x", now));
        l.mark(&p, "gone@x", Mark::Refused(now));
        assert!(l.settled(&p, &rcpt));
        // A recipient added to the config is owed it again.
        assert!(!l.settled(&p, &to(&["ops@x", "gone@x", "new@x"])));
    }

    #[test]
    fn a_message_about_the_same_events_has_the_same_id() {
        let ev = |file: &str| {
            let mut r = crate::eventlog::record_for_test();
            r.array = "data".into();
            r.host = "box one".into();
            (PathBuf::from(format!("/q/{file}")), r)
        };
        let (a, b) = (ev("1-000001.json"), ev("1-000002.json"));
        let id = super::message_id([&a, &b].into_iter());
        assert_eq!(id, super::message_id([&a, &b].into_iter()));
        assert_ne!(id, super::message_id([&a].into_iter()));
        assert!(
            id.starts_with("<raidctl.data.") && id.ends_with("@box-one>"),
            "{id}"
        );
    }

    #[test]
    fn refused_by_everyone_stays_until_the_settings_change_or_an_hour() {
        let mut l = Ledger::default();
        let p = PathBuf::from("1.json");
        let now = Instant::now();
        let rcpt = to(&["a@x", "b@x"]);
        l.mark(&p, "a@x", Mark::Refused(now));
        l.mark(&p, "b@x", Mark::Refused(now));
        assert!(!l.settled(&p, &rcpt) && l.unreached(&p, &rcpt));
        assert!(
            !l.owed(&p, "a@x", now),
            "a refusal is not tried again at once"
        );
        assert!(l.owed(&p, "a@x", now + RETRY_REFUSED), "but an hour on");
        l.settings_are(l.settings);
        assert!(
            !l.owed(&p, "a@x", now),
            "the same settings: still not tried"
        );
        l.settings_are(l.settings ^ 1);
        assert!(l.owed(&p, "a@x", now) && l.owed(&p, "b@x", now));
    }
}
