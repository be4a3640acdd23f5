//! The daemon as a systemd service, checked without systemd running: the
//! notify protocol (READY, WATCHDOG, STOPPING) on a socket the test holds,
//! the journal's native protocol on a socket bound where the daemon looks
//! for journald (in a private mount namespace), and the install script's
//! files checked by the tools that read them (bash, man, systemd-analyze).

use raid_e2e::{raidctl_path, World};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Datagrams received within `secs` until `until` says enough.
fn collect(sock: &UnixDatagram, secs: u64, until: impl Fn(&[String]) -> bool) -> Vec<String> {
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let t = Instant::now();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while t.elapsed() < Duration::from_secs(secs) && !until(&got) {
        if let Ok(n) = sock.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    got
}

#[test]
fn the_daemon_says_ready_pings_the_watchdog_and_says_stopping() {
    let w = World::new("notify");
    std::fs::create_dir_all(w.state()).unwrap();
    let path = w.dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    let mut child = Command::new(raidctl_path())
        .env("RAIDCTL_STATE_DIR", w.state())
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "400000")
        .args(["daemon"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let got = collect(&sock, 20, |g| {
        g.iter().filter(|m| m.contains("WATCHDOG=1")).count() >= 3
    });
    let ready = got.iter().position(|m| m.contains("READY=1"));
    assert!(ready.is_some(), "no READY=1 in {got:?}");
    assert!(
        got[ready.unwrap()].contains("STATUS=serving 0 array(s)"),
        "{got:?}"
    );
    // Pinged at half the 0.4 s period: three within seconds.
    let pings = got.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert!(pings >= 3, "{got:?}");
    // Readiness comes after the socket listens: a CLI can talk to it now.
    let o = w.run(&["list"]);
    assert!(o.status.success());
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let got = collect(&sock, 20, |g| g.iter().any(|m| m.contains("STOPPING=1")));
    assert!(got.iter().any(|m| m.contains("STOPPING=1")), "{got:?}");
    assert!(child.wait().unwrap().success());
}

/// Fields of one native-protocol journal datagram (KEY=value lines, or
/// KEY\n<u64 le length><value>\n for values with newlines).
fn journal_fields(d: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < d.len() {
        let end = d[i..].iter().position(|&b| b == b'\n').map(|p| i + p);
        let Some(end) = end else { break };
        let line = &d[i..end];
        if let Some(eq) = line.iter().position(|&b| b == b'=') {
            out.push((
                String::from_utf8_lossy(&line[..eq]).into_owned(),
                String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
            ));
            i = end + 1;
        } else {
            let key = String::from_utf8_lossy(line).into_owned();
            let len = u64::from_le_bytes(d[end + 1..end + 9].try_into().unwrap()) as usize;
            let v = &d[end + 9..end + 9 + len];
            out.push((key, String::from_utf8_lossy(v).into_owned()));
            i = end + 9 + len + 1;
        }
    }
    out
}

#[test]
fn under_systemd_the_daemon_logs_to_the_journal_with_priorities() {
    // The journal's socket path is fixed (/run/systemd/journal/socket): the
    // test binds its own and mounts it there in a private mount namespace,
    // so the host's journal (if any) is never touched.
    let unshare = Command::new("unshare").arg("--version").output();
    if unshare.is_err() || unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root and unshare(1) for a private mount namespace");
        return;
    }
    let w = World::new("journal");
    std::fs::create_dir_all(w.state()).unwrap();
    let jdir = w.dir.join("journal");
    std::fs::create_dir_all(&jdir).unwrap();
    let sock = UnixDatagram::bind(jdir.join("socket")).unwrap();
    // systemd's JOURNAL_STREAM names the stream it gave the service's
    // stderr: here a file, by device and inode.
    let err_path = w.dir.join("stderr");
    let err = std::fs::File::create(&err_path).unwrap();
    let m = std::fs::metadata(&err_path).unwrap();
    let stream = format!(
        "{}:{}",
        std::os::unix::fs::MetadataExt::dev(&m),
        std::os::unix::fs::MetadataExt::ino(&m)
    );
    let member = w.sparse("j0.img", 16 << 20);
    let member1 = w.sparse("j1.img", 16 << 20);
    w.ok(&[
        "create",
        "jx",
        "--level",
        "1",
        member.to_str().unwrap(),
        member1.to_str().unwrap(),
    ]);
    let script = format!(
        "mkdir -p /run/systemd/journal && mount --bind '{}' /run/systemd/journal && exec '{}' start jx --foreground",
        jdir.display(),
        raidctl_path().display()
    );
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("RAIDCTL_STATE_DIR", w.state())
        .env("JOURNAL_STREAM", &stream)
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut got: Vec<Vec<(String, String)>> = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    let t = Instant::now();
    let started = |g: &[Vec<(String, String)>]| {
        g.iter().any(|f| {
            f.iter()
                .any(|(k, v)| k == "MESSAGE" && v.contains("array started"))
        })
    };
    while t.elapsed() < Duration::from_secs(20) && !started(&got) {
        // tracing-journald checks the socket with an empty datagram.
        if let Ok(n @ 1..) = sock.recv(&mut buf) {
            got.push(journal_fields(&buf[..n]));
        }
    }
    // A member failure logs at error or warning level.
    w.ok(&["fail", "jx", member1.to_str().unwrap()]);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        // tracing-journald checks the socket with an empty datagram.
        if let Ok(n @ 1..) = sock.recv(&mut buf) {
            got.push(journal_fields(&buf[..n]));
        }
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let field =
        |f: &[(String, String)], k: &str| f.iter().find(|(x, _)| x == k).map(|(_, v)| v.clone());
    assert!(
        !got.is_empty(),
        "nothing reached the journal socket; stderr:\n{stderr}"
    );
    for f in &got {
        assert_eq!(
            field(f, "SYSLOG_IDENTIFIER").as_deref(),
            Some("raidctl"),
            "{f:?}"
        );
    }
    let info = got
        .iter()
        .find(|f| field(f, "MESSAGE").is_some_and(|m| m.contains("daemon listening")))
        .unwrap_or_else(|| panic!("no 'daemon listening' in {got:?}"));
    let prio = |f: &[(String, String)]| field(f, "PRIORITY").unwrap().parse::<u8>().unwrap();
    assert!((5..=6).contains(&prio(info)), "{info:?}");
    let warn = got
        .iter()
        .find(|f| field(f, "MESSAGE").is_some_and(|m| m.contains("failed")) && prio(f) <= 4)
        .unwrap_or_else(|| panic!("no warning or error about the failure in {got:?}"));
    assert!(prio(warn) <= 4, "{warn:?}");
    // Nothing went to stderr instead.
    assert!(!stderr.contains("daemon listening"), "{stderr}");
}

#[test]
fn install_puts_binary_completions_man_pages_and_unit_in_place() {
    let w = World::new("install");
    let dest = w.dir.join("root");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install.sh");
    let o = Command::new("bash")
        .arg(&script)
        .env("DESTDIR", &dest)
        .env("PREFIX", "/usr")
        .env("RAIDCTL_BIN", raidctl_path())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let bin = dest.join("usr/bin/raidctl");
    assert!(Command::new(&bin)
        .arg("--version")
        .output()
        .unwrap()
        .status
        .success());
    // bash loads the completion and completes subcommands with it.
    let bash = dest.join("usr/share/bash-completion/completions/raidctl");
    let probe = format!(
        "source '{}'; COMP_WORDS=(raidctl ios); COMP_CWORD=1; COMP_LINE='raidctl ios'; COMP_POINT=11; _raidctl raidctl ios raidctl; echo \"${{COMPREPLY[@]}}\"",
        bash.display()
    );
    let o = Command::new("bash").args(["-c", &probe]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "iostat", "{o:?}");
    for (shell, file) in [
        ("zsh", "usr/share/zsh/site-functions/_raidctl"),
        ("fish", "usr/share/fish/vendor_completions.d/raidctl.fish"),
    ] {
        let text = std::fs::read_to_string(dest.join(file)).unwrap();
        assert!(text.contains("iostat"), "{shell}: {text}");
        if Command::new(shell).arg("--version").output().is_ok() {
            let flag = if shell == "fish" {
                "--no-execute"
            } else {
                "-n"
            };
            let o = Command::new(shell)
                .arg(flag)
                .arg(dest.join(file))
                .output()
                .unwrap();
            assert!(o.status.success(), "{shell}: {o:?}");
        }
    }
    // Every command has its page, and man renders it.
    let man1 = dest.join("usr/share/man/man1");
    for page in [
        "raidctl",
        "raidctl-iostat",
        "raidctl-create",
        "raidctl-daemon",
    ] {
        let p = man1.join(format!("{page}.1.gz"));
        assert!(p.exists(), "{page}");
        if Command::new("man").arg("--version").output().is_ok() {
            let o = Command::new("man")
                .arg("-l")
                .arg(&p)
                .env("MANPAGER", "cat")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(
                o.status.success() && text.contains("SYNOPSIS"),
                "{page}: {text}"
            );
        }
    }
    let unit = std::fs::read_to_string(dest.join("etc/systemd/system/raidctl.service")).unwrap();
    for want in [
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "RuntimeDirectory=raidctl",
        "ExecStart=/usr/bin/raidctl daemon --config /etc/raidctl/raidctl.toml",
    ] {
        assert!(unit.contains(want), "{want} not in\n{unit}");
    }
    assert!(dest.join("etc/logrotate.d/raidctl").exists());
    // The example config is one the daemon accepts.
    let cfg = dest.join("etc/raidctl/raidctl.toml");
    let o = Command::new(raidctl_path())
        .env("RAIDCTL_STATE_DIR", w.dir.join("state"))
        .args(["alert", "test", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("not a valid config"), "{err}");
    // systemd checks the unit (against the installed binary and pages).
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        let local = w.dir.join("raidctl.service");
        std::fs::write(
            &local,
            unit.replace("/usr/bin/raidctl", bin.to_str().unwrap()),
        )
        .unwrap();
        let o = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&local)
            .env("MANPATH", dest.join("usr/share/man"))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "systemd-analyze verify: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    } else {
        eprintln!("systemd-analyze not installed: the unit's syntax was not checked");
    }
}
