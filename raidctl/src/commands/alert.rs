//! `raidctl alert test`: a test message to every recipient, each answer
//! said, and what is still queued for the arrays.

use crate::alerts::Outcome;
use crate::config::Config;
use crate::error::{CliError, Result};
use crate::protocol::{call, Request};
use crate::registry::StateDir;
use crate::Format;
use std::path::Path;

pub(super) fn test(st: &StateDir, config: Option<&Path>, fmt: Format) -> Result<()> {
    let c = Config::load(st, config)?;
    let a = c.alerts.ok_or_else(|| {
        CliError::not_found(format!(
            "no [alerts] section in {}: see docs/alerts.md",
            config.map(|p| p.display().to_string()).unwrap_or_else(|| st
                .root
                .join("raidctl.toml")
                .display()
                .to_string())
        ))
    })?;
    let r = crate::eventlog::record_for_test();
    let (subject, body) = crate::alerts::compose(&[r]);
    let deliveries = a.send_each(&a.to, &subject, &body, None)?;
    let queued = crate::alerts::queue_len(st);
    let daemon = call(&st.socket(), &Request::Ping).ok().flatten().is_some();
    let not_sent: Vec<&crate::alerts::Delivery> = deliveries
        .iter()
        .filter(|d| !matches!(d.outcome, Outcome::Sent(_)))
        .collect();
    if fmt == Format::Json {
        let v = serde_json::json!({
            "recipients": deliveries.iter().map(|d| serde_json::json!({
                "to": d.to,
                "sent": matches!(d.outcome, Outcome::Sent(_)),
                "answer": d.outcome.why(),
                "permanent": d.outcome.permanent(),
            })).collect::<Vec<_>>(),
            "queued": queued,
            "daemon_running": daemon,
        });
        out!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        // The others are said in the error, on stderr.
        for d in &deliveries {
            if let Outcome::Sent(answer) = &d.outcome {
                out!("test message sent to {}: server answered {answer}", d.to);
            }
        }
        // Said whether this test went or not: the queued alerts are what
        // the operator is waiting for.
        if queued > 0 {
            let who = if daemon {
                "the daemon reads its config again every few seconds, so a fix there takes effect for them at its next try (within a minute; one that every recipient refused for good is tried again after an hour, or once the server, login or sender changes)"
            } else {
                "no daemon runs: they go out when one next does (the next raidctl start)"
            };
            out!(
                "note: {queued} event(s) of the arrays are queued for alerts, not yet delivered: {who}; the daemon's log says why each failed"
            );
        } else {
            out!("no alerts of the arrays are waiting to be sent");
        }
    }
    if not_sent.is_empty() {
        Ok(())
    } else {
        // One reason for all (the server down, the login refused) is said
        // once.
        let mut whys: Vec<&str> = not_sent.iter().map(|d| d.outcome.why()).collect();
        whys.dedup();
        let to: Vec<&str> = not_sent.iter().map(|d| d.to.as_str()).collect();
        Err(CliError::failed(format!(
            "the test message did not reach {}: {}",
            to.join(", "),
            whys.join("; ")
        )))
    }
}
