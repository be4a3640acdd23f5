//! Alerts: email straight to an SMTP server (no local MTA), through an
//! on-disk queue that survives a down server and a daemon restart, plus an
//! optional program hook per event (like mdadm's PROGRAM).
//!
//! Delivery: each event worth alerting is written to STATE_DIR/alerts/queue
//! before anything is sent. A sender thread waits a short coalescing window,
//! then mails all queued events of an array in one message (a flapping member
//! makes one message, not a storm) and deletes them once the server accepted
//! it; on failure it retries with exponential backoff. A crash between the
//! server's acceptance and the deletion can repeat one message; nothing is
//! dropped.

use crate::error::{CliError, Result};
use crate::eventlog::EventRecord;
use crate::registry::StateDir;
use lettre::message::header::ContentType;
use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{Message, SmtpTransport, Transport};
use raid_core::array::Severity;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How to reach the SMTP server.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Security {
    /// Plain connection upgraded with STARTTLS; refuses if the server
    /// cannot. The default.
    #[default]
    Starttls,
    /// TLS from the first byte (port 465).
    Tls,
    /// No encryption at all: only when asked for.
    Plain,
}

/// The `[alerts]` section of the config file.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertConfig {
    pub smtp_host: String,
    pub smtp_port: Option<u16>,
    #[serde(default)]
    pub security: Security,
    pub username: Option<String>,
    /// A file holding the SMTP password (first line).
    pub password_file: Option<PathBuf>,
    /// Or an environment variable holding it.
    pub password_env: Option<String>,
    /// Extra trusted root certificate (PEM), for a server with its own CA.
    pub ca_file: Option<PathBuf>,
    pub from: String,
    pub to: Vec<String>,
    #[serde(default = "default_min")]
    pub min_severity: String,
    /// A program run for every event, with the details in its environment.
    pub hook: Option<PathBuf>,
    /// Seconds to gather events into one message.
    #[serde(default = "default_coalesce")]
    pub coalesce_seconds: u64,
}

fn default_min() -> String {
    "warning".into()
}
fn default_coalesce() -> u64 {
    2
}

// The password never appears in logs, status or JSON: Debug shows where it
// comes from, not what it is.
impl std::fmt::Debug for AlertConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlertConfig")
            .field("smtp_host", &self.smtp_host)
            .field("smtp_port", &self.smtp_port)
            .field("security", &self.security)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("to", &self.to)
            .finish()
    }
}

impl AlertConfig {
    pub fn min_severity(&self) -> Result<Severity> {
        Severity::from_name(&self.min_severity).ok_or_else(|| {
            CliError::usage(format!(
                "min_severity '{}' is not info, warning or critical",
                self.min_severity
            ))
        })
    }

    fn port(&self) -> u16 {
        self.smtp_port.unwrap_or(match self.security {
            Security::Starttls => 587,
            Security::Tls => 465,
            Security::Plain => 25,
        })
    }

    fn password(&self) -> Result<Option<String>> {
        if let Some(p) = &self.password_file {
            let text = std::fs::read_to_string(p).map_err(|e| {
                CliError::not_found(format!("cannot read password_file {}: {e}", p.display()))
            })?;
            return Ok(Some(text.lines().next().unwrap_or("").to_string()));
        }
        if let Some(v) = &self.password_env {
            return std::env::var(v).map(Some).map_err(|_| {
                CliError::not_found(format!("password_env names ${v}, which is not set"))
            });
        }
        Ok(None)
    }

    fn transport(&self) -> Result<SmtpTransport> {
        let tls_params = || -> Result<TlsParameters> {
            let mut b = TlsParameters::builder(self.smtp_host.clone());
            if let Some(ca) = &self.ca_file {
                let pem = std::fs::read(ca).map_err(|e| {
                    CliError::not_found(format!("cannot read ca_file {}: {e}", ca.display()))
                })?;
                let cert = Certificate::from_pem(&pem).map_err(|e| {
                    CliError::usage(format!(
                        "ca_file {} is not a PEM certificate: {e}",
                        ca.display()
                    ))
                })?;
                b = b.add_root_certificate(cert);
            }
            b.build_rustls()
                .map_err(|e| CliError::failed(format!("TLS setup: {e}")))
        };
        let tls = match self.security {
            Security::Plain => Tls::None,
            Security::Starttls => Tls::Required(tls_params()?),
            Security::Tls => Tls::Wrapper(tls_params()?),
        };
        let mut t = SmtpTransport::builder_dangerous(&self.smtp_host)
            .port(self.port())
            .tls(tls)
            .timeout(Some(SMTP_TIMEOUT));
        if let Some(user) = &self.username {
            let pw = self.password()?.ok_or_else(|| {
                CliError::usage("username is set but neither password_file nor password_env is: say where the password is")
            })?;
            t = t.credentials(Credentials::new(user.clone(), pw));
        }
        Ok(t.build())
    }

    /// The sender and the recipients, parsed: what makes every message
    /// fail whatever the server says. Checked when the config is loaded
    /// (a daemon must not start with alerts that can never go, retrying
    /// them for ever) and before each message.
    pub fn addresses(&self) -> Result<(Mailbox, Vec<Mailbox>)> {
        let from = self
            .from
            .parse()
            .map_err(|e| CliError::usage(format!("from address '{}': {e}", self.from)))?;
        if self.to.is_empty() {
            return Err(CliError::usage(
                "alerts have no recipient: set to = [\"ops@example.com\"]",
            ));
        }
        let to = self
            .to
            .iter()
            .map(|t| {
                t.parse()
                    .map_err(|e| CliError::usage(format!("recipient '{t}': {e}")))
            })
            .collect::<Result<_>>()?;
        Ok((from, to))
    }

    /// Sends one message; returns the server's answer.
    pub fn send(&self, subject: &str, body: &str) -> Result<String> {
        let (from, to) = self.addresses()?;
        let mut b = Message::builder()
            .from(from)
            .subject(subject)
            .header(ContentType::TEXT_PLAIN);
        for t in to {
            b = b.to(t);
        }
        let msg = b
            .body(body.to_string())
            .map_err(|e| CliError::failed(format!("building the message: {e}")))?;
        let t = self.transport()?;
        match t.send(&msg) {
            Ok(r) => Ok(format!(
                "{} {}",
                r.code(),
                r.message().collect::<Vec<_>>().join(" ")
            )),
            Err(e) => Err(CliError::failed(explain(&e, self))),
        }
    }
}

/// How long the mail server may take to answer each step.
const SMTP_TIMEOUT: Duration = Duration::from_secs(20);

/// Turns lettre's error into what the operator should check.
fn explain(e: &lettre::transport::smtp::Error, c: &AlertConfig) -> String {
    let text = e.to_string();
    let server = format!("{}:{}", c.smtp_host, c.port());
    if e.is_permanent() && (text.contains("535") || text.to_lowercase().contains("auth")) {
        return format!(
            "SMTP server {server} refused the login for user '{}': {text} (check the password in {})",
            c.username.as_deref().unwrap_or(""),
            c.password_file.as_ref().map(|p| p.display().to_string()).or(c.password_env.as_ref().map(|v| format!("${v}"))).unwrap_or_default()
        );
    }
    if e.is_permanent() || e.is_transient() {
        // Which recipients, as the server's answer may not say.
        return format!(
            "SMTP server {server} refused the message to {}: {text}",
            c.to.join(", ")
        );
    }
    // A read that waited its whole timeout shows as EAGAIN ("Resource
    // temporarily unavailable"): said as what it is.
    let io = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .map(|io| io.kind());
    if e.is_timeout()
        || matches!(
            io,
            Some(std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
        )
    {
        return format!(
            "SMTP server {server} did not answer within {} s: is it up and reachable, and is the port ({}) and security ({:?}) right?",
            SMTP_TIMEOUT.as_secs(),
            c.port(),
            c.security
        );
    }
    format!("cannot deliver through {server} ({:?}): {text}", c.security)
}

/// The subject and body of a message about some events of one array.
pub fn compose(events: &[EventRecord]) -> (String, String) {
    // The subject names the array's state as the last event left it, and
    // the array's own failure where there is one, else the first of the
    // most severe events: a mail that says the array failed must not read
    // like the earlier ones that said a member failed.
    let top = events
        .iter()
        .filter_map(|e| Severity::from_name(&e.severity))
        .max();
    let first = events
        .iter()
        .find(|e| e.event == "array_failed")
        .or_else(|| {
            events
                .iter()
                .find(|e| Severity::from_name(&e.severity) == top)
        })
        .unwrap_or(&events[0]);
    let state = events.last().map(|e| e.array_state.as_str()).unwrap_or("");
    let more = if events.len() > 1 {
        format!(" (+{} more)", events.len() - 1)
    } else {
        String::new()
    };
    let subject = format!(
        "[raidctl] {} array {}{}: {} ({}){more}",
        first.host,
        first.array,
        match state {
            "" | "-" => String::new(),
            s => format!(" {s}"),
        },
        first.event.replace('_', " "),
        first.severity
    );
    let mut body = format!(
        "Host: {}\nArray: {}\nArray state: {}\n\n",
        first.host, first.array, state
    );
    for e in events {
        body.push_str(&format!(
            "{} [{}] {}: {}\n",
            e.time, e.severity, e.event, e.message
        ));
        if let Some(m) = &e.member {
            body.push_str(&format!("  member: {m}\n"));
        }
        if let Some(u) = &e.member_uuid {
            body.push_str(&format!("  member uuid: {u}\n"));
        }
        if let Some(s) = &e.member_serial {
            body.push_str(&format!("  serial: {s}\n"));
        }
        if let Some(n) = &e.new_member {
            body.push_str(&format!("  new member: {n}\n"));
        }
        if let Some(n) = &e.next {
            body.push_str(&format!("  next: {n}\n"));
        }
    }
    body.push_str("\n-- raidctl\n");
    (subject, body)
}

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

/// Runs the event hook, one event at a time and in the events' order, on
/// a thread of its own (as mdadm runs its PROGRAM: waits for each): a
/// script that keeps state (a ticket opened on `member_failed`, closed on
/// `rebuild_finished`) sees the events as they happened. A hook that hangs
/// holds the next ones up to `HOOK_TIMEOUT`, then is killed.
#[derive(Default)]
pub struct HookRunner {
    queue: std::sync::Mutex<Option<std::sync::mpsc::Sender<(PathBuf, EventRecord)>>>,
}

impl HookRunner {
    /// Queues `r` for `hook`; the thread that runs them starts with the
    /// first.
    pub fn run(&self, hook: PathBuf, r: EventRecord) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let mut job = (hook, r);
        // A thread that ended (it could not start, or a hook's run
        // panicked) is started again, once per event.
        for _ in 0..2 {
            let tx = q.get_or_insert_with(Self::start);
            match tx.send(job) {
                Ok(()) => return,
                Err(std::sync::mpsc::SendError(back)) => {
                    job = back;
                    *q = None;
                }
            }
        }
        tracing::warn!(hook = %job.0.display(), "event hook not run: no thread to run it");
    }

    fn start() -> std::sync::mpsc::Sender<(PathBuf, EventRecord)> {
        let (tx, rx) = std::sync::mpsc::channel::<(PathBuf, EventRecord)>();
        let spawned = std::thread::Builder::new()
            .name("event-hooks".into())
            .spawn(move || {
                for (hook, r) in rx {
                    run_hook(&hook, &r);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("event hooks: no thread to run them: {e}");
        }
        tx
    }
}

/// Runs the hook for one event, details in the environment.
pub fn run_hook(hook: &Path, r: &EventRecord) {
    let mut c = std::process::Command::new(hook);
    c.env("RAIDCTL_EVENT", &r.event)
        .env("RAIDCTL_SEVERITY", &r.severity)
        .env("RAIDCTL_ARRAY", &r.array)
        .env("RAIDCTL_ARRAY_STATE", &r.array_state)
        .env("RAIDCTL_MESSAGE", &r.message)
        .env("RAIDCTL_TIME", &r.time)
        .env("RAIDCTL_MEMBER", r.member.as_deref().unwrap_or(""))
        .env(
            "RAIDCTL_MEMBER_UUID",
            r.member_uuid.as_deref().unwrap_or(""),
        )
        .env("RAIDCTL_NEW_MEMBER", r.new_member.as_deref().unwrap_or(""))
        .env("RAIDCTL_NEXT", r.next.as_deref().unwrap_or(""))
        .stdin(std::process::Stdio::null());
    let mut child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => return tracing::warn!(hook = %hook.display(), "event hook could not run: {e}"),
    };
    // A hook that hangs is killed: one per event, they would pile up (and
    // outlive the daemon) under a burst of events.
    let began = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) if began.elapsed() >= HOOK_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!(
                    "still running after {} s: killed",
                    HOOK_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => break Err(e.to_string()),
        }
    };
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => tracing::warn!(hook = %hook.display(), "event hook exited with {s}"),
        Err(e) => tracing::warn!(hook = %hook.display(), "event hook: {e}"),
    }
}

/// How long an event hook may run.
const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// How many alerts wait to go out.
pub fn queue_len(st: &StateDir) -> usize {
    std::fs::read_dir(queue_dir(st))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .count()
        })
        .unwrap_or(0)
}

/// Whether alerts are still waiting to go out.
pub fn queue_is_empty(st: &StateDir) -> bool {
    std::fs::read_dir(queue_dir(st))
        .map(|d| {
            !d.flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "json"))
        })
        .unwrap_or(true)
}

/// The sender: drains the queue until `stop`, with backoff on failure.
pub fn sender(
    st: StateDir,
    cfg: AlertConfig,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    counters: std::sync::Arc<crate::daemon::AlertCounters>,
) {
    use std::sync::atomic::Ordering;
    let mut backoff = Duration::from_secs(1);
    let mut next_try = Instant::now();
    let window = Duration::from_secs(cfg.coalesce_seconds);
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(200));
        if Instant::now() < next_try {
            continue;
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(queue_dir(&st))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        if files.is_empty() {
            continue;
        }
        files.sort();
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
        let oldest = events.iter().map(|(_, r)| r.unix).min().unwrap_or(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if now < oldest + window.as_secs() {
            continue;
        }
        let mut arrays: Vec<String> = events.iter().map(|(_, r)| r.array.clone()).collect();
        arrays.dedup();
        arrays.sort();
        arrays.dedup();
        let mut failed = false;
        for a in arrays {
            let batch: Vec<&(PathBuf, EventRecord)> =
                events.iter().filter(|(_, r)| r.array == a).collect();
            let records: Vec<EventRecord> = batch.iter().map(|(_, r)| r.clone()).collect();
            let (subject, body) = compose(&records);
            match cfg.send(&subject, &body) {
                Ok(answer) => {
                    counters.sent.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(array = %a, events = records.len(), "alert sent: {answer}");
                    for (p, _) in batch {
                        let _ = std::fs::remove_file(p);
                    }
                }
                Err(e) => {
                    counters.send_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(array = %a, "alert not sent, will retry in {backoff:?}: {e}");
                    failed = true;
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
    use super::compose;

    #[test]
    fn a_mail_with_the_arrays_failure_says_so_in_its_subject() {
        let mut member = crate::eventlog::record_for_test();
        member.event = "member_failed".into();
        member.severity = "critical".into();
        member.array_state = "degraded".into();
        let mut array = member.clone();
        array.event = "array_failed".into();
        array.array_state = "failed".into();
        let (subject, _) = compose(&[member.clone(), array]);
        assert!(
            subject.contains("failed: array failed (critical) (+1 more)"),
            "{subject}"
        );
        let (subject, _) = compose(&[member]);
        assert!(
            subject.contains("degraded: member failed (critical)"),
            "{subject}"
        );
    }
}
