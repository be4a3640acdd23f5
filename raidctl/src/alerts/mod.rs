//! Alerts: email straight to an SMTP server (no local MTA), through an
//! on-disk queue that survives a down server and a daemon restart
//! (`queue`), plus an optional program hook per event (like mdadm's
//! PROGRAM).
//!
//! Delivery: each event worth alerting is queued before anything is sent;
//! a sender thread mails an array's queued events in one message (a
//! flapping member makes one message, not a storm), to each recipient on
//! its own, and retries what did not go with exponential backoff.

use crate::error::{CliError, Result};
use crate::eventlog::EventRecord;
use lettre::address::Envelope;
use lettre::message::{Mailbox, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{Message, SmtpTransport, Transport};
pub use queue::{enqueue, queue_is_empty, queue_len, queued_for, sender, Reload};
use raid_core::array::Severity;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod queue;

/// How to reach the SMTP server.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Hash)]
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

    /// Sends one message to each of `to` and says what became of each.
    /// One transaction for all first; where the server refuses it, one per
    /// recipient, so that one address it refuses (a mailbox gone, 550, or
    /// full, 452) does not keep the message from the others (a
    /// transaction is all or nothing). Where the server cannot be reached
    /// or refuses the login, every recipient shares that answer. The
    /// headers name every recipient of the settings, `to` or not.
    ///
    /// `id`: the message's Message-ID, the same for the same events (a
    /// copy sent again after a restart can then be told for one by the
    /// receiver); None for a fresh one.
    pub fn send_each(
        &self,
        to: &[String],
        subject: &str,
        body: &str,
        id: Option<String>,
    ) -> Result<Vec<Delivery>> {
        let (from, all) = self.addresses()?;
        let mut b = Message::builder()
            .from(from.clone())
            .subject(subject)
            // Some receiving servers refuse mail without an id (Gmail's
            // MX among them) and filters score it as spam.
            .message_id(id);
        for m in all {
            b = b.to(m);
        }
        let rcpts = to
            .iter()
            .map(|t| {
                t.parse::<Mailbox>()
                    .map(|m| m.email)
                    .map_err(|e| CliError::usage(format!("recipient '{t}': {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        // `singlepart` sets MIME-Version beside the Content-Type and the
        // transfer encoding, as RFC 2045 asks.
        let msg = b
            .singlepart(SinglePart::plain(body.to_string()))
            .map_err(|e| CliError::failed(format!("building the message: {e}")))?;
        let bytes = msg.formatted();
        let t = self.transport()?;
        let sent = |r: lettre::transport::smtp::response::Response| {
            Outcome::Sent(format!(
                "{} {}",
                r.code(),
                r.message().collect::<Vec<_>>().join(" ")
            ))
        };
        let everyone = |outcome: Outcome| {
            to.iter()
                .map(|t| Delivery {
                    to: t.clone(),
                    outcome: outcome.clone(),
                })
                .collect()
        };
        if to.len() > 1 {
            let envelope = Envelope::new(Some(from.email.clone()), rcpts.clone())
                .map_err(|e| CliError::failed(format!("envelope: {e}")))?;
            match t.send_raw(&envelope, &bytes) {
                Ok(r) => return Ok(everyone(sent(r))),
                // An answer of the server's, for good or for now: maybe
                // about one recipient (a transaction stops at the first
                // refused), so each is tried on its own.
                Err(e) => match explain(&e, self, &to.join(", ")) {
                    Outcome::Refused(_) | Outcome::Failed(_) => {}
                    o => return Ok(everyone(o)),
                },
            }
        }
        let mut out: Vec<Delivery> = Vec::new();
        for (addr, rcpt) in to.iter().zip(rcpts) {
            if let Some(shared) = out.iter().find(|d| d.outcome.shared()) {
                out.push(Delivery {
                    to: addr.clone(),
                    outcome: shared.outcome.clone(),
                });
                continue;
            }
            let envelope = Envelope::new(Some(from.email.clone()), vec![rcpt])
                .map_err(|e| CliError::failed(format!("envelope to {addr}: {e}")))?;
            let outcome = match t.send_raw(&envelope, &bytes) {
                Ok(r) => sent(r),
                Err(e) => explain(&e, self, addr),
            };
            out.push(Delivery {
                to: addr.clone(),
                outcome,
            });
        }
        Ok(out)
    }

    /// A fingerprint of what decides whether a message goes: the server,
    /// the login (the password too, read where it lives) and the sender.
    /// A recipient the server refused is tried again only once this
    /// changes. Kept in memory only.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (
            &self.smtp_host,
            self.port(),
            self.security,
            &self.username,
            self.password().ok().flatten(),
            &self.ca_file,
            &self.from,
        )
            .hash(&mut h);
        h.finish()
    }
}

/// What became of a message for one recipient.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub to: String,
    pub outcome: Outcome,
}

#[derive(Clone, Debug)]
pub enum Outcome {
    /// Accepted: the server's answer.
    Sent(String),
    /// Refused for good (a 5xx answer): trying again with the same
    /// settings gets the same answer.
    Refused(String),
    /// Not sent this time (the server down or slow, a 4xx answer): to be
    /// tried again.
    Failed(String),
    /// Not sent, for a reason that holds for every recipient (no
    /// connection, the login refused): to be tried again, once the
    /// settings change where the login was refused.
    FailedForAll { why: String, permanent: bool },
}

impl Outcome {
    fn shared(&self) -> bool {
        matches!(self, Outcome::FailedForAll { .. })
    }

    /// Whether trying again with the same settings can go otherwise.
    pub fn permanent(&self) -> bool {
        matches!(
            self,
            Outcome::Refused(_)
                | Outcome::FailedForAll {
                    permanent: true,
                    ..
                }
        )
    }

    pub fn why(&self) -> &str {
        match self {
            Outcome::Sent(s) | Outcome::Refused(s) | Outcome::Failed(s) => s,
            Outcome::FailedForAll { why, .. } => why,
        }
    }
}

/// How long the mail server may take to answer each step.
const SMTP_TIMEOUT: Duration = Duration::from_secs(20);

/// Turns lettre's error for the message to `to` into what the operator
/// should check.
fn explain(e: &lettre::transport::smtp::Error, c: &AlertConfig, to: &str) -> Outcome {
    let text = e.to_string();
    let server = format!("{}:{}", c.smtp_host, c.port());
    // Decided by the reply code, never by its text (an address or a
    // relay refusal may well say "auth").
    match e.status().map(u16::from) {
        // Authentication required, too weak, or refused (RFC 4954).
        Some(530 | 534 | 535 | 538) => {
            return Outcome::FailedForAll {
                why: match &c.username {
                    Some(u) => format!(
                        "SMTP server {server} refused the login for user '{u}': {text} (check the password in {})",
                        c.password_file.as_ref().map(|p| p.display().to_string()).or(c.password_env.as_ref().map(|v| format!("${v}"))).unwrap_or_default()
                    ),
                    None => format!(
                        "SMTP server {server} asks for a login: {text} (set username and password_file in [alerts])"
                    ),
                },
                permanent: true,
            }
        }
        Some(code) if code >= 500 => {
            return Outcome::Refused(format!(
                "SMTP server {server} refused the message to {to}: {text} (where it names the address: check it, or take it out of `to`)"
            ))
        }
        Some(_) => {
            return Outcome::Failed(format!(
                "SMTP server {server} put off the message to {to}: {text}"
            ))
        }
        None => {}
    }
    // A read that waited its whole timeout shows as EAGAIN ("Resource
    // temporarily unavailable"): said as what it is.
    let io = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .map(|io| io.kind());
    let why = if e.is_timeout()
        || matches!(
            io,
            Some(std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
        ) {
        format!(
            "SMTP server {server} did not answer within {} s: is it up and reachable, and is the port ({}) and security ({:?}) right?",
            SMTP_TIMEOUT.as_secs(),
            c.port(),
            c.security
        )
    } else {
        // A reply that is no SMTP (a web server on that port) lands here.
        format!(
            "cannot deliver through {server} ({:?}): {text} (is that an SMTP server, and are the port and security right?)",
            c.security
        )
    };
    Outcome::FailedForAll {
        why,
        permanent: false,
    }
}

/// The subject and body of a message about some events of one array.
/// Events that put a slot back in service, or on its way there (a
/// re-added member, a spare taken, a rebuild onto a new device): below
/// the alerts' threshold, they go out with the alerts of their array still
/// queued (`follows_up`), so that a message sent after them says so, and
/// gives no `replace` for a member back in its slot.
const IN_SERVICE_AGAIN: [&str; 5] = [
    "member_re_added",
    "spare_activated",
    "rebuild_started",
    "rebuild_finished",
    "hot_replace_finished",
];

/// Whether `event`, below the alerts' threshold, goes out all the same:
/// it puts a slot back in service while alerts of its array wait.
pub fn follows_up(event: &str) -> bool {
    IN_SERVICE_AGAIN.contains(&event)
}

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
    // The next steps of events before the array failed were for an array
    // that still served: a replace they name is refused now. Only the
    // failure's own (and those after it) are given.
    let failed_at = events.iter().rposition(|e| e.event == "array_failed");
    for (i, e) in events.iter().enumerate() {
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
        // The slot back in service since, by an event below: its `next`
        // (replace the member, most often) is done or no longer wanted.
        let served_again = e.slot.is_some_and(|slot| {
            events[i + 1..]
                .iter()
                .any(|l| l.slot == Some(slot) && follows_up(&l.event))
        });
        match &e.next {
            Some(_) if failed_at.is_some_and(|f| i < f) => {
                body.push_str("  next: see below (the array failed since)\n")
            }
            Some(_) if served_again => {
                body.push_str("  next: nothing: the slot is back in service since (below)\n")
            }
            Some(n) => body.push_str(&format!("  next: {n}\n")),
            None => {}
        }
    }
    body.push_str("\n-- raidctl\n");
    (subject, body)
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
        member.next = Some("raidctl replace a /dev/x NEW_DEVICE".into());
        array.next = Some("raidctl stop a; ...".into());
        let (subject, body) = compose(&[member.clone(), array]);
        assert!(
            subject.contains("failed: array failed (critical) (+1 more)"),
            "{subject}"
        );
        // The member's step (a replace, refused on a failed array) is not
        // given; the failure's is.
        assert!(
            !body.contains("raidctl replace") && body.contains("next: raidctl stop a"),
            "{body}"
        );
        let (subject, _) = compose(&[member]);
        assert!(
            subject.contains("degraded: member failed (critical)"),
            "{subject}"
        );
    }
}
