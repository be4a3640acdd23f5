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
//! refused it, and at least one has it; one that every recipient refused
//! stays queued, untried, until the settings change.
//!
//! The settings are read again before each try (`reload`): a fix to the
//! server, the login or the recipients takes effect for the alerts already
//! queued, without a restart of the daemon (which stays up while alerts
//! are queued). A refusal is tried again once the server, the login or
//! the sender changes.
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

/// Which recipients have a queued event (`true`) or refused it under the
/// settings of `Ledger::settings` (`false`), by queue file.
#[derive(Default)]
struct Ledger {
    by_file: HashMap<PathBuf, HashMap<String, bool>>,
    settings: u64,
    /// Files already said to have reached no one.
    said_unreached: HashSet<PathBuf>,
}

impl Ledger {
    /// New settings: the refusals under the old ones count no more.
    fn settings_are(&mut self, fingerprint: u64) {
        if fingerprint != self.settings {
            self.settings = fingerprint;
            for m in self.by_file.values_mut() {
                m.retain(|_, had| *had);
            }
            self.said_unreached.clear();
        }
    }

    fn owed(&self, p: &Path, to: &str) -> bool {
        self.by_file.get(p).is_none_or(|m| !m.contains_key(to))
    }

    fn mark(&mut self, p: &Path, to: &str, had: bool) {
        self.by_file
            .entry(p.to_path_buf())
            .or_default()
            .insert(to.to_string(), had);
    }

    /// Every recipient in `to` has it or refused it, and one has it.
    fn settled(&self, p: &Path, to: &[String]) -> bool {
        self.by_file.get(p).is_some_and(|m| {
            to.iter().all(|t| m.contains_key(t)) && to.iter().any(|t| m.get(t) == Some(&true))
        })
    }

    /// Every recipient in `to` refused it.
    fn unreached(&self, p: &Path, to: &[String]) -> bool {
        self.by_file
            .get(p)
            .is_some_and(|m| to.iter().all(|t| m.get(t) == Some(&false)))
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
    // The last complaint about the config, said once.
    let mut said_of_config: Option<String> = None;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(200));
        if Instant::now() < next_try {
            continue;
        }
        let files = queued(&st);
        ledger.by_file.retain(|p, _| files.contains(p));
        ledger.said_unreached.retain(|p| files.contains(p));
        if files.is_empty() {
            continue;
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
        // Wait for the coalescing window after the oldest event.
        let window = Duration::from_secs(cfg.coalesce_seconds);
        let oldest = events.iter().map(|(_, r)| r.unix).min().unwrap_or(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if now < oldest + window.as_secs() {
            continue;
        }
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
        let mut arrays: Vec<String> = events.iter().map(|(_, r)| r.array.clone()).collect();
        arrays.sort();
        arrays.dedup();
        let mut failed = false;
        for a in arrays {
            let batch: Vec<&(PathBuf, EventRecord)> =
                events.iter().filter(|(_, r)| r.array == a).collect();
            // Recipients owed the same events get one message.
            let mut groups: BTreeMap<Vec<usize>, Vec<String>> = BTreeMap::new();
            for t in &cfg.to {
                let owed: Vec<usize> = (0..batch.len())
                    .filter(|&i| ledger.owed(&batch[i].0, t))
                    .collect();
                if !owed.is_empty() {
                    groups.entry(owed).or_default().push(t.clone());
                }
            }
            for (owed, to) in groups {
                let records: Vec<EventRecord> = owed.iter().map(|&i| batch[i].1.clone()).collect();
                let (subject, body) = compose(&records);
                let deliveries = match cfg.send_each(&to, &subject, &body) {
                    Ok(d) => d,
                    Err(e) => {
                        counters.send_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(array = %a, "alert not sent, will retry in {backoff:?}: {}", e.msg);
                        failed = true;
                        continue;
                    }
                };
                for d in deliveries {
                    match &d.outcome {
                        Outcome::Sent(answer) => {
                            counters.sent.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(array = %a, to = %d.to, events = records.len(), "alert sent: {answer}");
                        }
                        o if o.permanent() => {
                            counters.send_failures.fetch_add(1, Ordering::Relaxed);
                            tracing::error!(array = %a, to = %d.to, "alert not sent, and not tried again for this recipient until the [alerts] settings change: {}", o.why());
                        }
                        o => {
                            counters.send_failures.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(array = %a, to = %d.to, "alert not sent, will retry in {backoff:?}: {}", o.why());
                            failed = true;
                            continue;
                        }
                    }
                    let had = matches!(d.outcome, Outcome::Sent(_));
                    for &i in &owed {
                        ledger.mark(&batch[i].0, &d.to, had);
                    }
                }
            }
            for (p, r) in batch {
                if ledger.settled(p, &cfg.to) {
                    let _ = std::fs::remove_file(p);
                    ledger.by_file.remove(p);
                } else if ledger.unreached(p, &cfg.to) && ledger.said_unreached.insert(p.clone()) {
                    tracing::error!(array = %a, event = %r.event, "alert refused by every recipient: it stays queued and goes out once the [alerts] settings change (the daemon reads them again before each try)");
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

#[cfg(test)]
mod tests {
    use super::Ledger;
    use std::path::PathBuf;

    fn to(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_event_leaves_the_queue_once_each_recipient_has_it_or_refused_it() {
        let mut l = Ledger::default();
        let p = PathBuf::from("1.json");
        let rcpt = to(&["ops@x", "gone@x"]);
        l.mark(&p, "ops@x", true);
        assert!(!l.settled(&p, &rcpt), "gone@x is still owed it");
        assert!(l.owed(&p, "gone@x") && !l.owed(&p, "ops@x"));
        l.mark(&p, "gone@x", false);
        assert!(l.settled(&p, &rcpt));
        // A recipient added to the config is owed it again.
        assert!(!l.settled(&p, &to(&["ops@x", "gone@x", "new@x"])));
    }

    #[test]
    fn refused_by_everyone_stays_until_the_settings_change() {
        let mut l = Ledger::default();
        let p = PathBuf::from("1.json");
        let rcpt = to(&["a@x", "b@x"]);
        l.mark(&p, "a@x", false);
        l.mark(&p, "b@x", false);
        assert!(!l.settled(&p, &rcpt) && l.unreached(&p, &rcpt));
        assert!(!l.owed(&p, "a@x"), "a refusal is not tried again");
        l.settings_are(l.settings);
        assert!(!l.owed(&p, "a@x"), "the same settings: still not tried");
        l.settings_are(l.settings ^ 1);
        assert!(l.owed(&p, "a@x") && l.owed(&p, "b@x"));
    }
}
