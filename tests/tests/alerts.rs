//! Alerts against a real SMTP server on loopback (Debian's python3-aiosmtpd,
//! started by the test): a member failure arrives as one message with the
//! fields an operator needs; a server that is down then up gets the alert
//! exactly once; STARTTLS with a self-signed certificate; a wrong password
//! is a clear error that does not show the password.

use raid_e2e::{free_port, make_executable, World};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// The SMTP sink; killed on drop.
struct Sink {
    child: Child,
    dir: PathBuf,
}

impl Sink {
    fn start(port: u16, dir: &Path, extra: &[&str]) -> Sink {
        std::fs::create_dir_all(dir).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("support/smtp_sink.py");
        // Debian's interpreter: python3-aiosmtpd is installed for it.
        let mut child = Command::new("/usr/bin/python3")
            .arg(script)
            .arg(port.to_string())
            .arg(dir)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("/usr/bin/python3 with python3-aiosmtpd (scripts/install-test-deps.sh)");
        let mut out = child.stdout.take().unwrap();
        let mut buf = [0u8; 6];
        use std::io::Read;
        out.read_exact(&mut buf)
            .expect("the SMTP sink did not start: is python3-aiosmtpd installed?");
        assert_eq!(&buf, b"ready\n");
        Sink {
            child,
            dir: dir.to_path_buf(),
        }
    }

    fn messages(&self) -> Vec<String> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "eml"))
            .collect();
        v.sort();
        v.iter()
            .map(|p| unfold(&std::fs::read_to_string(p).unwrap()))
            .collect()
    }

    /// The envelope's recipients of the `i`th message (from 0).
    fn rcpts(&self, i: usize) -> Vec<String> {
        std::fs::read_to_string(self.dir.join(format!("{}.rcpt", i + 1)))
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn wait_for(&self, n: usize, secs: u64) -> Vec<String> {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(secs) {
            let m = self.messages();
            if m.len() >= n {
                return m;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.messages()
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Undoes quoted-printable soft line breaks and =3D.
fn unfold(s: &str) -> String {
    s.replace("=\r\n", "")
        .replace("=\n", "")
        .replace("=3D", "=")
}

fn write_config(w: &World, port: u16, extra: &str) {
    std::fs::create_dir_all(w.state()).unwrap();
    std::fs::write(
        w.state().join("raidctl.toml"),
        format!(
            "[alerts]\nsmtp_host = \"127.0.0.1\"\nsmtp_port = {port}\nfrom = \"raid@localhost\"\nto = [\"ops@example.com\", \"oncall@example.com\"]\ncoalesce_seconds = 1\n{extra}"
        ),
    )
    .unwrap();
}

fn array(w: &World, name: &str) -> Vec<PathBuf> {
    let m: Vec<PathBuf> = (0..3)
        .map(|i| w.sparse(&format!("{name}{i}.img"), 32 * MIB))
        .collect();
    let p: Vec<&str> = m.iter().map(|p| p.to_str().unwrap()).collect();
    w.ok(&["create", name, "--level", "5", p[0], p[1], p[2]]);
    m
}

#[test]
fn member_failure_arrives_as_one_message_with_what_to_do() {
    let w = World::new("mail");
    let port = free_port();
    let sink = Sink::start(port, &w.dir.join("mail"), &[]);
    // A hook that appends what it is told to a file.
    let hook = w.dir.join("hook.sh");
    let hook_out = w.dir.join("hook.out");
    // It takes its time over the failure, so that a hook run for the
    // next event beside it (not after it) would write first.
    std::fs::write(&hook, format!("#!/bin/sh\n[ \"$RAIDCTL_EVENT\" = member_failed ] && sleep 0.5\necho \"$RAIDCTL_EVENT $RAIDCTL_SEVERITY $RAIDCTL_ARRAY $RAIDCTL_MEMBER\" >> {}\n", hook_out.display())).unwrap();
    make_executable(&hook);
    write_config(
        &w,
        port,
        &format!("security = \"plain\"\nhook = \"{}\"\n", hook.display()),
    );
    let m = array(&w, "mailarr");
    w.ok(&["start", "mailarr"]);
    let victim = m[1].to_str().unwrap();
    w.ok(&["fail", "mailarr", victim]);
    let msgs = sink.wait_for(1, 30);
    assert_eq!(
        msgs.len(),
        1,
        "member failure + degraded should coalesce into one message: {msgs:#?}"
    );
    let msg = &msgs[0];
    let subject = msg.lines().find(|l| l.starts_with("Subject:")).unwrap();
    assert!(
        subject.contains("array mailarr degraded: member failed") && subject.contains("critical"),
        "{subject}"
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert!(
        subject.contains(host.trim()),
        "subject lacks the host: {subject}"
    );
    assert!(
        msg.contains("To: ops@example.com, oncall@example.com"),
        "{msg}"
    );
    assert!(msg.contains(&format!("member: {victim}")), "{msg}");
    // The same for the same events: a copy sent again after a restart can
    // be told for one.
    assert!(msg.contains("Message-ID: <raidctl.mailarr."), "{msg}");
    assert!(msg.contains("member uuid: "), "{msg}");
    assert!(msg.contains("Array state: degraded"), "{msg}");
    assert!(
        msg.contains(&format!(
            "next: raidctl replace mailarr {victim} NEW_DEVICE"
        )),
        "{msg}"
    );
    assert!(msg.contains("array_degraded"), "{msg}");
    // The event log has them too.
    let ev: serde_json::Value =
        serde_json::from_str(&w.ok(&["events", "mailarr", "--format", "json"])).unwrap();
    let kinds: Vec<&str> = ev
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"member_failed") && kinds.contains(&"array_degraded"),
        "{kinds:?}"
    );
    // The hook ran for every event, one after another in the log's order.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let hooked = loop {
        let h = std::fs::read_to_string(&hook_out).unwrap_or_default();
        if h.lines().count() >= kinds.len() || std::time::Instant::now() > deadline {
            break h;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        hooked.contains(&format!("member_failed critical mailarr {victim}")),
        "hook saw: {hooked}"
    );
    let hook_kinds: Vec<&str> = hooked
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(hook_kinds, kinds, "the hook's order against the log's");
    w.ok(&["stop", "mailarr"]);
}

#[test]
fn server_down_then_up_delivers_exactly_once() {
    let w = World::new("retry");
    let port = free_port();
    write_config(&w, port, "security = \"plain\"\n");
    let m = array(&w, "retryarr");
    w.ok(&["start", "retryarr"]);
    w.ok(&["fail", "retryarr", m[0].to_str().unwrap()]);
    // Nobody listens yet: the alert waits in the queue.
    std::thread::sleep(Duration::from_secs(3));
    let queued = std::fs::read_dir(w.state().join("alerts/queue"))
        .unwrap()
        .count();
    assert!(queued >= 1, "the alert is not queued");
    // The array stopped, the daemon has nothing to serve, but an alert to
    // send: it stays up for it (an idle daemon used to exit with it
    // queued, sent only at some later start).
    w.ok(&["stop", "retryarr"]);
    std::thread::sleep(Duration::from_secs(7));
    let daemon = format!("--state-dir {} daemon", w.state().display());
    let alive = || {
        std::process::Command::new("pgrep")
            .args(["-f", "--", &daemon])
            .status()
            .unwrap()
            .success()
    };
    assert!(alive(), "the idle daemon exited with an alert queued");
    let sink = Sink::start(port, &w.dir.join("mail"), &[]);
    let msgs = sink.wait_for(1, 60);
    assert_eq!(msgs.len(), 1);
    // And no second copy comes later.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(sink.messages().len(), 1, "delivered more than once");
    assert!(msgs[0].contains("member failed"));
    // Sent: the daemon may go.
    raid_e2e::eventually("the idle daemon exits once its alerts are sent", || {
        !alive()
    });
}

#[test]
fn starttls_with_a_self_signed_certificate() {
    let w = World::new("tls");
    let (cert, key) = (w.dir.join("cert.pem"), w.dir.join("key.pem"));
    let o = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
        ])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        // A server certificate, not a CA: rustls refuses a CA certificate
        // presented as the server's own.
        .args([
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "extendedKeyUsage=serverAuth",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let port = free_port();
    let sink = Sink::start(
        port,
        &w.dir.join("mail"),
        &["--tls", cert.to_str().unwrap(), key.to_str().unwrap()],
    );
    // Without trusting the certificate, STARTTLS must fail: never plain text.
    write_config(&w, port, "security = \"starttls\"\n");
    let o = w.run(&["alert", "test"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Trusting it, the message goes through.
    write_config(
        &w,
        port,
        &format!(
            "security = \"starttls\"\nca_file = \"{}\"\n",
            cert.display()
        ),
    );
    let out = w.ok(&["alert", "test"]);
    assert!(out.contains("250"), "{out}");
    let msgs = sink.wait_for(1, 10);
    assert_eq!(msgs.len(), 1);
    assert!(msgs[0].contains("test message"), "{}", msgs[0]);
}

#[test]
fn a_wrong_password_is_a_clear_error_and_stays_secret() {
    let w = World::new("auth");
    let port = free_port();
    let _sink = Sink::start(
        port,
        &w.dir.join("mail"),
        &["--auth", "raid", "right-horse"],
    );
    let pw = w.dir.join("password");
    std::fs::write(&pw, "wrong-battery\n").unwrap();
    write_config(
        &w,
        port,
        &format!(
            "security = \"plain\"\nusername = \"raid\"\npassword_file = \"{}\"\n",
            pw.display()
        ),
    );
    let o = w.run(&["alert", "test"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("refused the login for user 'raid'") && err.contains(pw.to_str().unwrap()),
        "{err}"
    );
    assert!(!err.contains("wrong-battery"), "the password leaked: {err}");
    std::fs::write(&pw, "right-horse\n").unwrap();
    let out = w.ok(&["alert", "test"]);
    assert!(out.contains("250"), "{out}");
}

/// A mail server that takes the connection and never answers: `alert
/// test` says it did not answer in time (it said "network error: Resource
/// temporarily unavailable").
#[test]
fn a_server_that_never_answers_is_said_to_time_out() {
    let w = World::new("mute");
    // Bound and listening (the kernel completes the connection), never
    // accepted: no greeting ever comes.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = mute.local_addr().unwrap().port();
    write_config(&w, port, "security = \"plain\"\n");
    let (code, _, err) = w.code(&["alert", "test"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("did not answer within"), "{err}");
    drop(mute);
}

fn queued(w: &World) -> usize {
    std::fs::read_dir(w.state().join("alerts/queue"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .count()
        })
        .unwrap_or(0)
}

/// One address the server refuses for good does not keep the alert from
/// the others, nor is the alert sent again and again: a refused
/// transaction is all or nothing, so the daemon then sends to each
/// recipient on its own. It used to retry the whole message every minute,
/// for ever, and nobody got the drive failure. The refusal's text says
/// "authorized", as a relay refusal does: it is no login failure (which
/// would hold for every recipient).
#[test]
fn a_refused_recipient_does_not_keep_the_alert_from_the_others() {
    let w = World::new("rcpt");
    let port = free_port();
    let sink = Sink::start(
        port,
        &w.dir.join("mail"),
        &["--reject", "oncall@example.com"],
    );
    write_config(&w, port, "security = \"plain\"\n");
    let o = w.run(&["alert", "test"]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        out.contains("test message sent to ops@example.com"),
        "{out}"
    );
    assert!(
        err.contains("oncall@example.com") && err.contains("550"),
        "{err}"
    );
    let msgs = sink.wait_for(1, 10);
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert_eq!(sink.rcpts(0), ["ops@example.com"]);
    // What receiving servers and filters look for.
    assert!(
        msgs[0].contains("Message-ID: <") && msgs[0].contains("MIME-Version: 1.0"),
        "{}",
        msgs[0]
    );
    let json: serde_json::Value = serde_json::from_str(&String::from_utf8_lossy(
        &w.run(&["--format", "json", "alert", "test"]).stdout,
    ))
    .unwrap();
    let sent: Vec<bool> = json["recipients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["sent"].as_bool().unwrap())
        .collect();
    assert_eq!(sent, [true, false], "{json}");
    assert_eq!(sink.wait_for(2, 10).len(), 2);

    let m = array(&w, "rcptarr");
    w.ok(&["start", "rcptarr"]);
    w.ok(&["fail", "rcptarr", m[1].to_str().unwrap()]);
    let msgs = sink.wait_for(3, 30);
    assert_eq!(msgs.len(), 3, "{msgs:#?}");
    assert!(msgs[2].contains("member failed"), "{}", msgs[2]);
    assert_eq!(sink.rcpts(2), ["ops@example.com"]);
    // Done with: the refusal is final, so the alert leaves the queue and
    // no copy follows.
    raid_e2e::eventually("the alert leaves the queue", || queued(&w) == 0);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(sink.messages().len(), 3, "sent again");
    w.ok(&["stop", "rcptarr"]);
}

/// A fix to the alert settings reaches the alerts already queued: the
/// daemon reads them again before each try. It used to keep the settings
/// it started with, and stayed up while alerts were queued, so `stop` and
/// `start` (what `alert test` advised) did not renew them either.
#[test]
fn a_fixed_setting_reaches_the_alerts_already_queued() {
    let w = World::new("refix");
    // Nothing listens there.
    let dead = free_port();
    write_config(&w, dead, "security = \"plain\"\n");
    let m = array(&w, "refixarr");
    w.ok(&["start", "refixarr"]);
    w.ok(&["fail", "refixarr", m[0].to_str().unwrap()]);
    std::thread::sleep(Duration::from_secs(3));
    assert!(queued(&w) >= 1, "the alert is not queued");
    let (code, out, _) = w.code(&["alert", "test"]);
    assert_eq!(code, 1);
    assert!(
        out.contains("queued") && out.contains("reads its config again"),
        "{out}"
    );
    let port = free_port();
    let sink = Sink::start(port, &w.dir.join("mail"), &[]);
    write_config(&w, port, "security = \"plain\"\n");
    let msgs = sink.wait_for(1, 90);
    assert_eq!(
        msgs.len(),
        1,
        "the queued alert did not go out with the fixed settings"
    );
    assert!(msgs[0].contains("member failed"), "{}", msgs[0]);
    w.ok(&["stop", "refixarr"]);
}

/// A mailbox full for now (452) is retried, and meanwhile the others have
/// the alert, once: the refused transaction is all or nothing, so a
/// refusal for now of one recipient used to hold the alert from everyone.
#[test]
fn a_full_mailbox_does_not_keep_the_alert_from_the_others() {
    let w = World::new("full");
    let port = free_port();
    let sink = Sink::start(
        port,
        &w.dir.join("mail"),
        &["--defer", "oncall@example.com"],
    );
    write_config(&w, port, "security = \"plain\"\n");
    let m = array(&w, "fullarr");
    w.ok(&["start", "fullarr"]);
    w.ok(&["fail", "fullarr", m[1].to_str().unwrap()]);
    let msgs = sink.wait_for(1, 30);
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert!(msgs[0].contains("member failed"), "{}", msgs[0]);
    assert_eq!(sink.rcpts(0), ["ops@example.com"]);
    // Still owed to the full mailbox, retried: no copy to the other.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(sink.messages().len(), 1, "sent again to ops");
    assert!(queued(&w) >= 1, "given up on the full mailbox");
    w.ok(&["stop", "fullarr"]);
}

/// A member failed and taken back before its alert went out: the message
/// says so (the re-add goes with the alert, though below the threshold),
/// gives the array's state after it, and asks for no replace of a member
/// back in its slot.
#[test]
fn a_member_back_in_service_before_its_alert_left_is_said_so() {
    let w = World::new("mail-back");
    let port = free_port();
    let sink = Sink::start(port, &w.dir.join("mail"), &[]);
    std::fs::create_dir_all(w.state()).unwrap();
    std::fs::write(
        w.state().join("raidctl.toml"),
        format!("[alerts]\nsmtp_host = \"127.0.0.1\"\nsmtp_port = {port}\nsecurity = \"plain\"\nfrom = \"raid@localhost\"\nto = [\"ops@example.com\"]\ncoalesce_seconds = 10\n"),
    )
    .unwrap();
    let m = array(&w, "backarr");
    w.ok(&["start", "backarr"]);
    let victim = m[1].to_str().unwrap();
    w.ok(&["fail", "backarr", victim]);
    w.ok(&["re-add", "backarr", victim]);
    w.ok(&["wait", "backarr"]);
    let msgs = sink.wait_for(1, 40);
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    let msg = &msgs[0];
    assert!(msg.contains("member_failed"), "{msg}");
    assert!(msg.contains("member_re_added"), "{msg}");
    assert!(
        !msg.contains("next: raidctl replace"),
        "a replace asked for a member back in service: {msg}"
    );
    assert!(
        msg.contains("next: nothing: the slot is back in service since (below)"),
        "{msg}"
    );
    assert!(!msg.contains("Array state: degraded"), "{msg}");
    w.ok(&["stop", "backarr"]);
}
