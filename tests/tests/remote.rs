//! Members on other hosts: arrays whose members are NBD exports (nbdkit,
//! qemu-nbd), a member that goes away (its server killed, its host's link
//! cut) failing the member with an alert and coming back by re-add with
//! only what changed resynced, hosts as network namespaces joined by veth
//! links. TLS on the export and on members: remote_tls.rs.

use raid_e2e::hosts::{unix_server, wait_for, Hosts, Server};
use raid_e2e::{file_hash, free_port, make_executable, need, qemu_io, World};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// nbdkit's file plugin serving `file` on a Unix socket.
fn nbdkit_unix(sock: &Path, file: &Path) -> Server {
    let mut c = Command::new("nbdkit");
    c.args(["-f", "-U"]).arg(sock).arg("file").arg(file);
    unix_server(c, sock)
}

/// `n` nbdkit exports of 32 MiB sparse files (`FILE{i}.img`, served on
/// `SOCK{i}.sock`): their files, sockets, servers and URIs.
fn exports(
    w: &World,
    file: &str,
    sock: &str,
    n: usize,
) -> (Vec<PathBuf>, Vec<PathBuf>, Vec<Server>, Vec<String>) {
    let files: Vec<PathBuf> = (0..n)
        .map(|i| w.sparse(&format!("{file}{i}.img"), 32 * MIB))
        .collect();
    let socks: Vec<PathBuf> = (0..n)
        .map(|i| w.dir.join(format!("{sock}{i}.sock")))
        .collect();
    let servers = (0..n).map(|i| nbdkit_unix(&socks[i], &files[i])).collect();
    let uris = socks
        .iter()
        .map(|s| format!("nbd+unix:///?socket={}", s.display()))
        .collect();
    (files, socks, servers, uris)
}

/// The daemon's config: network members given up after `timeout` s, and
/// alerts to a hook that appends "EVENT SEVERITY ARRAY MEMBER" to
/// `hook.out` (mail goes to a port nobody listens on: it is queued).
fn config(w: &World, timeout: f64) -> PathBuf {
    let hook = w.dir.join("hook.sh");
    let out = w.dir.join("hook.out");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\necho \"$RAIDCTL_EVENT $RAIDCTL_SEVERITY $RAIDCTL_ARRAY $RAIDCTL_MEMBER\" >> {}\n",
            out.display()
        ),
    )
    .unwrap();
    make_executable(&hook);
    std::fs::create_dir_all(w.state()).unwrap();
    std::fs::write(
        w.state().join("raidctl.toml"),
        format!(
            "[remote]\ntimeout_seconds = {timeout}\n\n[alerts]\nsmtp_host = \"127.0.0.1\"\nsmtp_port = {}\nsecurity = \"plain\"\nfrom = \"raid@localhost\"\nto = [\"ops@example.com\"]\nhook = \"{}\"\n",
            free_port(),
            hook.display()
        ),
    )
    .unwrap();
    out
}

/// (rows copied, rows) of each finished rebuild or resync in the array's
/// event log.
fn resyncs(w: &World, name: &str) -> Vec<(u64, u64)> {
    let log = std::fs::read_to_string(w.state().join("events").join(format!("{name}.jsonl")))
        .unwrap_or_default();
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "rebuild_finished")
        .filter_map(|v| {
            // "rebuild of slot 1 finished: 64 of 4080 rows copied"
            let m = v["message"].as_str()?.to_string();
            let tail = m.split(": ").nth(1)?;
            let mut it = tail.split_whitespace();
            let copied = it.next()?.parse().ok()?;
            let rows = it.nth(1)?.parse().ok()?;
            Some((copied, rows))
        })
        .collect()
}

fn state(w: &World, name: &str) -> String {
    let o = w.run(&["status", name, "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v["state"].as_str().unwrap_or("?").to_string()
}

/// A RAID5 of three nbdkit exports on Unix sockets. One server is killed
/// while the array is written: the member is given up after the timeout,
/// failed, and alerted; the writes complete. The server comes back: the
/// daemon re-adds the member, which resyncs only the regions written
/// meanwhile; then with another member killed, every byte reads back as
/// written (so the resynced member holds the right data).
#[test]
fn a_member_whose_server_dies_fails_and_comes_back_by_re_add() {
    need("nbdkit");
    let w = World::new("nbdmember");
    let hook_out = config(&w, 2.0);
    let files: Vec<PathBuf> = (0..3)
        .map(|i| w.sparse(&format!("host{i}.img"), 64 * MIB))
        .collect();
    let socks: Vec<PathBuf> = (0..3)
        .map(|i| w.dir.join(format!("host{i}.sock")))
        .collect();
    let mut servers: Vec<Server> = (0..3).map(|i| nbdkit_unix(&socks[i], &files[i])).collect();
    let uris: Vec<String> = socks
        .iter()
        .map(|s| format!("nbd+unix:///?socket={}", s.display()))
        .collect();
    w.ok(&[
        "create", "net5", "--level", "5", "--chunk", "64K", &uris[0], &uris[1], &uris[2],
    ]);
    let sock = w.dir.join("net5.sock");
    w.ok(&[
        "start",
        "net5",
        "--nbd",
        &format!("unix:{}", sock.display()),
    ]);
    assert_eq!(state(&w, "net5"), "optimal");
    let (ok, out) = qemu_io(&sock, "net5", &["write -P 0x11 0 16M"]);
    assert!(ok, "{out}");

    // The server of slot 1 dies (SIGKILL: no goodbye).
    servers[1].kill();
    let t = Instant::now();
    let (ok, out) = qemu_io(&sock, "net5", &["write -P 0x22 0 8M", "read -P 0x22 0 8M"]);
    assert!(
        ok,
        "writes with a member gone must complete degraded: {out}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "the member was not given up in time: {:?}",
        t.elapsed()
    );
    assert_eq!(state(&w, "net5"), "degraded");
    let alerted = format!("member_failed critical net5 {}", uris[1]);
    wait_for(&format!("the alert '{alerted}'"), 20, || {
        std::fs::read_to_string(&hook_out).is_ok_and(|a| a.contains(&alerted))
    });

    // It comes back: re-added and resynced by the daemon, no command.
    servers[1] = nbdkit_unix(&socks[1], &files[1]);
    wait_for("the member's re-add and resync", 60, || {
        state(&w, "net5") == "optimal" && !resyncs(&w, "net5").is_empty()
    });
    let r = resyncs(&w, "net5");
    let (copied, rows) = r[0];
    assert!(
        copied > 0 && copied * 4 <= rows,
        "a re-add resyncs the regions written while away, not the whole member: {copied} of {rows} rows"
    );
    let events = std::fs::read_to_string(w.state().join("events/net5.jsonl")).unwrap();
    assert!(events.contains("member_re_added"), "{events}");

    // Slot 0 dies now: reads need slot 1's resynced data.
    servers[0].kill();
    let (ok, out) = qemu_io(&sock, "net5", &["read -P 0x22 0 8M", "read -P 0x11 8M 8M"]);
    assert!(ok, "data read through the resynced member is wrong: {out}");
    w.ok(&["stop", "net5"]);
}

/// A hot spare whose server is gone is dropped by the array with a
/// `spare_dropped` warning (an alert: it used to be an info event, or a
/// log line only), the array's record stops naming it (a restart would
/// offer it again), and the other spare takes the failed slot.
#[test]
fn a_spare_whose_server_is_gone_is_dropped_with_an_alert() {
    need("nbdkit");
    let w = World::new("dropspare");
    let hook_out = config(&w, 2.0);
    let (_files, _socks, mut servers, uris) = exports(&w, "d", "d", 5);
    w.ok(&[
        "create", "ds", "--level", "5", "--chunk", "64K", &uris[0], &uris[1], &uris[2],
    ]);
    w.ok(&["start", "ds"]);
    w.ok(&["add", "ds", &uris[3]]);
    w.ok(&["add", "ds", &uris[4]]);
    servers[3].kill();
    w.ok(&["fail", "ds", &uris[1]]);
    let alerted = format!("spare_dropped warning ds {}", uris[3]);
    wait_for(&format!("the alert '{alerted}'"), 30, || {
        std::fs::read_to_string(&hook_out).is_ok_and(|a| a.contains(&alerted))
    });
    wait_for("the other spare rebuilt into the slot", 60, || {
        state(&w, "ds") == "optimal"
    });
    let rec = std::fs::read_to_string(w.state().join("arrays/ds.toml")).unwrap();
    let rec: toml::Value = toml::from_str(&rec).unwrap();
    assert_eq!(rec["members"][1].as_str(), Some(uris[4].as_str()), "{rec}");
    let spares = rec["spares"].as_array().map(Vec::len).unwrap_or(0);
    assert_eq!(spares, 0, "the dropped spare is still recorded: {rec}");
    w.ok(&["stop", "ds"]);
}

/// A member's server restarted on an older image of its disk (taken
/// before the array last started) is not trusted: it used to be taken back
/// on reconnecting, with no resync, and the array served old and new data
/// mixed. Now the reconnection finds older metadata than the member last
/// wrote and fails the member, left to the operator (the daemon does not
/// take it back by itself); the operator's re-add copies it whole, and
/// every byte then reads back as last written through that member alone.
#[test]
fn a_server_restarted_on_an_older_image_is_copied_whole() {
    need("nbdkit");
    let w = World::new("nbdstale");
    config(&w, 2.0);
    let (files, socks, mut servers, uris) = exports(&w, "disk", "d", 2);
    w.ok(&["create", "st1", "--level", "1", &uris[0], &uris[1]]);
    let sock = w.dir.join("st1.sock");
    let export = format!("unix:{}", sock.display());
    w.ok(&["start", "st1", "--nbd", &export]);
    let (ok, out) = qemu_io(&sock, "st1", &["write -P 0xaa 0 30M", "flush"]);
    assert!(ok, "{out}");
    w.ok(&["stop", "st1"]);
    // Stopped, its network members are read for its status (it said
    // failed, every slot missing), and examine reads a URI.
    let st = w.status_json("st1");
    assert_eq!(st["health"], "optimal", "{st}");
    assert_eq!(st["members"][1]["path"], uris[1].as_str(), "{st}");
    let ex: serde_json::Value =
        serde_json::from_str(&w.ok(&["examine", &uris[1], "--format", "json"])).unwrap();
    assert_eq!(ex[0]["kind"], "member", "{ex}");
    assert_eq!(ex[0]["slot"], 1, "{ex}");
    let snapshot = w.dir.join("disk1-old.img");
    std::fs::copy(&files[1], &snapshot).unwrap();
    w.ok(&["start", "st1", "--nbd", &export]);
    let (ok, out) = qemu_io(&sock, "st1", &["write -P 0xbb 0 30M", "flush"]);
    assert!(ok, "{out}");
    // Member 1's server comes back at once, on the old image.
    servers[1].kill();
    std::fs::copy(&snapshot, &files[1]).unwrap();
    servers[1] = nbdkit_unix(&socks[1], &files[1]);
    let (ok, out) = qemu_io(&sock, "st1", &["write -P 0xbb 30M 1M", "flush"]);
    assert!(ok, "{out}");
    wait_for("the stale member's failure", 20, || {
        state(&w, "st1") == "degraded"
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        state(&w, "st1"),
        "degraded",
        "the old image was taken back by itself"
    );
    let out = w.ok(&["re-add", "st1", &uris[1]]);
    assert!(out.contains("copying it whole"), "{out}");
    wait_for("the stale member's whole copy", 60, || {
        state(&w, "st1") == "optimal" && resyncs(&w, "st1").iter().any(|(c, r)| c == r)
    });
    let events = std::fs::read_to_string(w.state().join("events/st1.jsonl")).unwrap();
    assert!(events.contains("copied whole"), "{events}");
    // Member 0 goes: every byte comes from the copied member now.
    servers[0].kill();
    let (ok, out) = qemu_io(&sock, "st1", &["read -P 0xbb 0 31M"]);
    assert!(ok, "the re-added member holds old data: {out}");
    w.ok(&["stop", "st1"]);
}

/// A member's server restarted on an image of its disk copied while the
/// array ran (idle, its bitmap clean): its metadata event is the one the
/// member had when it went, since writes move no event, but the writes made
/// after the copy had their bitmap bits cleared since. It used to be taken
/// back by itself with only the marked regions resynced, and those writes
/// read back old (found by an operator audit). Now the bitmap's stamp shows
/// the image older: the daemon leaves it to the operator, whose re-add
/// copies it whole.
#[test]
fn a_server_restarted_on_an_image_copied_while_running_is_not_taken_back() {
    need("nbdkit");
    let w = World::new("nbdrunimg");
    config(&w, 2.0);
    // Bits cleared at the first flush after their writes: the flush after
    // the writes made once the image was copied clears their bits, so the
    // image lacks writes no bit marks. (Where bits linger, as by default,
    // those regions stay marked past that flush: the image's stamp is then
    // current, and the resync of the marked regions that the daemon's own
    // re-add does brings it up to date.)
    let toml = w.state().join("raidctl.toml");
    let mut text = std::fs::read_to_string(&toml).unwrap();
    text.push_str("\n[bitmap]\nlinger_seconds = 0\n");
    std::fs::write(&toml, text).unwrap();
    let (files, socks, mut servers, uris) = exports(&w, "disk", "r", 3);
    w.ok(&[
        "create", "ri5", "--level", "5", &uris[0], &uris[1], &uris[2],
    ]);
    let sock = w.dir.join("ri5.sock");
    w.ok(&["start", "ri5", "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, out) = qemu_io(&sock, "ri5", &["write -P 0xaa 0 16M", "flush"]);
    assert!(ok, "{out}");
    let snapshot = w.dir.join("disk1-running.img");
    std::fs::copy(&files[1], &snapshot).unwrap();
    let (ok, out) = qemu_io(&sock, "ri5", &["write -P 0xbb 0 8M", "flush"]);
    assert!(ok, "{out}");
    servers[1].kill();
    wait_for("the member given up", 30, || state(&w, "ri5") == "degraded");
    std::fs::copy(&snapshot, &files[1]).unwrap();
    servers[1] = nbdkit_unix(&socks[1], &files[1]);
    // Several tries of the daemon's (every 2 s): none takes it back.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        state(&w, "ri5"),
        "degraded",
        "the old image was taken back by itself"
    );
    let out = w.ok(&["re-add", "ri5", &uris[1]]);
    assert!(out.contains("copying it whole"), "{out}");
    wait_for("the whole copy", 60, || state(&w, "ri5") == "optimal");
    // Slot 0 goes: the 0xbb blocks need slot 1's copy.
    servers[0].kill();
    let (ok, out) = qemu_io(&sock, "ri5", &["read -P 0xbb 0 8M", "read -P 0xaa 8M 8M"]);
    assert!(ok, "the re-added member holds old data: {out}");
    w.ok(&["stop", "ri5"]);
}

/// The operator names a network member by its URI in fail, remove and
/// replace (the URI was taken for a file path under the current folder,
/// and no command could reach the member). A member the daemon gave up
/// that the operator then fails stays out when its server comes back.
#[test]
fn the_operator_names_a_network_member_by_its_uri() {
    need("nbdkit");
    let w = World::new("nbdname");
    config(&w, 1.0);
    let (files, socks, mut servers, uris) = exports(&w, "n", "n", 3);
    w.ok(&["create", "nm", "--level", "5", &uris[0], &uris[1], &uris[2]]);
    let sock = w.dir.join("nm.sock");
    w.ok(&["start", "nm", "--nbd", &format!("unix:{}", sock.display())]);
    // Given up while away, then failed by the operator: kept out.
    servers[2].kill();
    let (ok, out) = qemu_io(&sock, "nm", &["write -P 0x5c 0 4M", "flush"]);
    assert!(ok, "{out}");
    assert_eq!(state(&w, "nm"), "degraded");
    let out = w.ok(&["fail", "nm", &uris[2]]);
    assert!(out.contains("stays out"), "{out}");
    servers[2] = nbdkit_unix(&socks[2], &files[2]);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        state(&w, "nm"),
        "degraded",
        "a member the operator failed came back by itself"
    );
    // Removed by its URI, and its slot filled by replace naming it.
    let out = w.ok(&["remove", "nm", &uris[2]]);
    assert!(out.contains("removed"), "{out}");
    let local = w.sparse("local.img", 32 * MIB);
    let out = w.ok(&["replace", "nm", &uris[2], local.to_str().unwrap()]);
    assert!(out.contains("rebuild"), "{out}");
    w.ok(&["wait", "nm", "--timeout", "60"]);
    // And fail of an active network member by its URI.
    let out = w.ok(&["fail", "nm", &uris[1]]);
    assert!(out.contains("marked failed"), "{out}");
    let (ok, out) = qemu_io(&sock, "nm", &["read -P 0x5c 0 4M"]);
    assert!(ok, "{out}");
    w.ok(&["stop", "nm"]);
}

/// A server restarted on the same disk while idle is reconnected, also
/// by a metadata write: the write is sent after the connection went, so
/// the disk still carries the metadata before it. Counting that write as
/// on the disk already gave the member up, and failing another member
/// (whose failure is written to this one) failed the whole array.
#[test]
fn an_idle_server_restart_survives_a_metadata_write() {
    need("nbdkit");
    let w = World::new("nbdidle");
    config(&w, 5.0);
    let (files, socks, mut servers, uris) = exports(&w, "i", "i", 3);
    w.ok(&[
        "create", "id5", "--level", "5", &uris[0], &uris[1], &uris[2],
    ]);
    let sock = w.dir.join("id5.sock");
    w.ok(&["start", "id5", "--nbd", &format!("unix:{}", sock.display())]);
    servers[2].kill();
    servers[2] = nbdkit_unix(&socks[2], &files[2]);
    // The first write of the run marks the array in use on every member
    // first: a metadata write is the first I/O the restarted server sees.
    let (ok, out) = qemu_io(&sock, "id5", &["write -P 0x3e 0 8M", "flush"]);
    assert!(ok, "{out}");
    assert_eq!(state(&w, "id5"), "optimal");
    w.ok(&["fail", "id5", &uris[0]]);
    assert_eq!(state(&w, "id5"), "degraded");
    let (ok, out) = qemu_io(&sock, "id5", &["read -P 0x3e 0 8M"]);
    assert!(ok, "{out}");
    w.ok(&["stop", "id5"]);
}

/// A member's host that goes away while the array sits idle is found by
/// the daemon's probe (NBD has no keepalive): the member is failed and the
/// hook told within the probe interval and the member timeout, with no
/// request sent to the array (it stayed "optimal" until the next one).
#[test]
fn a_host_gone_while_the_array_is_idle_is_found() {
    need("nbdkit");
    let w = World::new("nbdprobe");
    let hook_out = config(&w, 1.0);
    let (_, _, mut servers, uris) = exports(&w, "p", "p", 3);
    w.ok(&[
        "create", "pr5", "--level", "5", &uris[0], &uris[1], &uris[2],
    ]);
    w.ok(&["start", "pr5"]);
    assert_eq!(state(&w, "pr5"), "optimal");
    servers[1].kill();
    wait_for("the idle array to find its member gone", 30, || {
        state(&w, "pr5") == "degraded"
    });
    let alerted = format!("member_failed critical pr5 {}", uris[1]);
    wait_for(&format!("the hook's '{alerted}'"), 20, || {
        std::fs::read_to_string(&hook_out).is_ok_and(|a| a.contains(&alerted))
    });
    w.ok(&["stop", "pr5"]);
    // Stopped, the gone member's slot says why it could not be read.
    let st = w.status_json("pr5");
    let warning = st["members"][1]["warning"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(warning.contains("cannot be read"), "{st}");
}

/// Options the array refuses, with what to do instead.
#[test]
fn wrong_remote_members_are_refused_with_the_fix() {
    need("nbdkit");
    let w = World::new("nbdbad");
    let (code, _, err) = w.code(&["create", "x", "--level", "1", "nbd+unix:///", "/dev/null"]);
    assert_ne!(code, 0);
    assert!(err.contains("socket=PATH"), "{err}");
    let (code, _, err) = w.code(&[
        "create",
        "x",
        "--level",
        "1",
        "nbd://127.0.0.1:1/a",
        "nbd://127.0.0.1:1/b",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("127.0.0.1:1"), "{err}");
    // A read-only export cannot be a member.
    let f = w.sparse("ro.img", 16 * MIB);
    let sock = w.dir.join("ro.sock");
    let _ro = {
        let c = Command::new("nbdkit")
            .args(["-f", "-r", "-U"])
            .arg(&sock)
            .arg("file")
            .arg(&f)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for("nbdkit", 10, || sock.exists());
        Server(c)
    };
    let g = w.sparse("rw.img", 16 * MIB);
    let (code, _, err) = w.code(&[
        "create",
        "x",
        "--level",
        "1",
        &format!("nbd+unix:///?socket={}", sock.display()),
        g.to_str().unwrap(),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("read-only"), "{err}");
    // A socket that takes the connection and says nothing: named as such
    // (it was "Resource temporarily unavailable (os error 11)").
    let mute = w.dir.join("mute.sock");
    let listener = std::os::unix::net::UnixListener::bind(&mute).unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in listener.incoming().take(4) {
            held.push(c);
        }
        std::thread::sleep(Duration::from_secs(30));
    });
    let (code, _, err) = w.code(&[
        "create",
        "x",
        "--level",
        "1",
        &format!("nbd+unix:///?socket={}", mute.display()),
        g.to_str().unwrap(),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("no answer within"), "{err}");
    assert!(!w.state().join("arrays/x.json").exists());
}

/// A member whose server is down when the array starts comes back by
/// itself once its server answers, as one lost while the array runs does,
/// resyncing only the regions written meanwhile (it used to wait for an
/// operator's re-add).
#[test]
fn a_member_down_at_the_start_comes_back_by_itself() {
    need("nbdkit");
    let w = World::new("nbdatstart");
    config(&w, 1.0);
    let (files, socks, mut servers, uris) = exports(&w, "s", "s", 3);
    w.ok(&[
        "create", "ds", "--level", "5", "--chunk", "64K", &uris[0], &uris[1], &uris[2],
    ]);
    let sock = w.dir.join("ds.sock");
    let nbd = format!("unix:{}", sock.display());
    w.ok(&["start", "ds", "--nbd", &nbd]);
    let (ok, out) = qemu_io(&sock, "ds", &["write -P 0x31 0 16M"]);
    assert!(ok, "{out}");
    w.ok(&["stop", "ds"]);
    servers[2].kill();
    w.ok(&["start", "ds", "--nbd", &nbd]);
    assert_eq!(state(&w, "ds"), "degraded");
    let (ok, out) = qemu_io(&sock, "ds", &["write -P 0x32 0 2M"]);
    assert!(ok, "{out}");
    servers[2] = nbdkit_unix(&socks[2], &files[2]);
    wait_for("the member's return", 60, || {
        state(&w, "ds") == "optimal" && !resyncs(&w, "ds").is_empty()
    });
    let (copied, rows) = resyncs(&w, "ds")[0];
    assert!(
        copied > 0 && copied * 4 <= rows,
        "only the regions written while it was away: {copied} of {rows} rows"
    );
    // The operator's fail keeps such a member out: down at the start,
    // failed, then back.
    w.ok(&["stop", "ds"]);
    servers[2].kill();
    w.ok(&["start", "ds", "--nbd", &nbd]);
    let out = w.ok(&["fail", "ds", &uris[2]]);
    assert!(out.contains("stays out"), "{out}");
    servers[2] = nbdkit_unix(&socks[2], &files[2]);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        state(&w, "ds"),
        "degraded",
        "taken back after the operator's fail"
    );
    w.ok(&["re-add", "ds", &uris[2]]);
    w.ok(&["wait", "ds", "--timeout", "60"]);
    // Nor is one the operator's own member list left out.
    w.ok(&["stop", "ds"]);
    w.ok(&[
        "start",
        "ds",
        "--nbd",
        &nbd,
        "--force",
        "--members",
        &uris[0],
        &uris[1],
    ]);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        state(&w, "ds"),
        "degraded",
        "a member left out of --members came back"
    );
    w.ok(&["re-add", "ds", &uris[2]]);
    w.ok(&["wait", "ds", "--timeout", "60"]);
    // Slot 0 gone: the reads need the returned member's data.
    servers[0].kill();
    let (ok, out) = qemu_io(&sock, "ds", &["read -P 0x32 0 2M", "read -P 0x31 2M 14M"]);
    assert!(ok, "{out}");
    w.ok(&["stop", "ds"]);
}

/// A server that answers but not within the member timeout (nbdkit's delay
/// filter) made its member come back and be lost again every few seconds,
/// each time with a failure alert and a resync, for as long as the server
/// was slow. Now after three returns within ten minutes the member is left
/// to the operator, with a `member_kept_out` alert, and the operator's
/// re-add takes it back.
#[test]
fn a_member_lost_again_at_each_return_is_left_to_the_operator() {
    need("nbdkit");
    let w = World::new("nbdflap");
    let hook_out = config(&w, 1.0);
    let (files, socks, mut servers, uris) = exports(&w, "f", "f", 3);
    w.ok(&["create", "fl", "--level", "5", &uris[0], &uris[1], &uris[2]]);
    w.ok(&["start", "fl"]);
    servers[1].kill();
    // Found gone by the daemon's probe of idle members.
    let failed = format!("member_failed critical fl {}", uris[1]);
    wait_for(&format!("the alert '{failed}'"), 30, || {
        std::fs::read_to_string(&hook_out).is_ok_and(|a| a.contains(&failed))
    });
    // Back, slow on writes: each return's metadata write times out.
    let slow = {
        let _ = std::fs::remove_file(&socks[1]);
        let c = Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(&socks[1])
            .args(["--filter=delay", "file"])
            .arg(&files[1])
            .arg("wdelay=3")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for("nbdkit", 10, || socks[1].exists());
        Server(c)
    };
    servers[1] = slow;
    let kept_out = format!("member_kept_out warning fl {}", uris[1]);
    let t = Instant::now();
    while !std::fs::read_to_string(&hook_out).is_ok_and(|a| a.contains(&kept_out)) {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "no '{kept_out}' within 90 s; alerts: {}; events: {}",
            std::fs::read_to_string(&hook_out).unwrap_or_default(),
            w.ok(&["events", "fl"])
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let count = |what: &str| {
        std::fs::read_to_string(&hook_out)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(what))
            .count()
    };
    let returns = count("member_re_added");
    assert_eq!(
        returns,
        3,
        "{}",
        std::fs::read_to_string(&hook_out).unwrap()
    );
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        count("member_re_added"),
        returns,
        "taken back again after it was left to the operator"
    );
    assert_eq!(state(&w, "fl"), "degraded");
    // The server set right, the operator's re-add takes it back.
    servers[1] = nbdkit_unix(&socks[1], &files[1]);
    let out = w.ok(&["re-add", "fl", &uris[1]]);
    assert!(out.contains("re-added"), "{out}");
    w.ok(&["wait", "fl", "--timeout", "60"]);
    assert_eq!(state(&w, "fl"), "optimal");
    w.ok(&["stop", "fl"]);
}

/// A member's server back with a blank disk behind the same URI: the
/// daemon leaves it to the operator with an alert, and re-add and replace
/// each name the one way on (remove, then replace onto it) rather than
/// sending the operator from one to the other.
#[test]
fn a_blank_disk_behind_a_members_uri_is_rebuilt_after_remove() {
    need("nbdkit");
    let w = World::new("nbdblank");
    let hook_out = config(&w, 1.0);
    let (files, socks, mut servers, uris) = exports(&w, "b", "b", 3);
    w.ok(&["create", "bl", "--level", "5", &uris[0], &uris[1], &uris[2]]);
    w.ok(&["start", "bl"]);
    servers[2].kill();
    let failed = format!("member_failed critical bl {}", uris[2]);
    wait_for(&format!("the alert '{failed}'"), 30, || {
        std::fs::read_to_string(&hook_out).is_ok_and(|a| a.contains(&failed))
    });
    std::fs::remove_file(&files[2]).unwrap();
    let blank = w.sparse("b2.img", 32 * MIB);
    servers[2] = nbdkit_unix(&socks[2], &blank);
    let kept_out = format!("member_kept_out warning bl {}", uris[2]);
    wait_for(&format!("the alert '{kept_out}'"), 30, || {
        std::fs::read_to_string(&hook_out).is_ok_and(|a| a.contains(&kept_out))
    });
    let remove_then_replace = format!("raidctl remove bl {}", uris[2]);
    let (code, _, err) = w.code(&["re-add", "bl", &uris[2]]);
    assert_ne!(code, 0);
    assert!(err.contains(&remove_then_replace), "{err}");
    let (code, _, err) = w.code(&["replace", "bl", &uris[2], &uris[2]]);
    assert_ne!(code, 0);
    assert!(
        err.contains("no metadata") && err.contains(&remove_then_replace),
        "{err}"
    );
    w.ok(&["remove", "bl", &uris[2]]);
    let out = w.ok(&["replace", "bl", &uris[2], &uris[2]]);
    assert!(out.contains("rebuild"), "{out}");
    w.ok(&["wait", "bl", "--timeout", "60"]);
    assert_eq!(state(&w, "bl"), "optimal");
    w.ok(&["stop", "bl"]);
}

/// One export under two URIs (here a second path to its socket) is one
/// device: create over both, or adding or replacing with the second name
/// of a member in use, would write one member over another. Each is
/// refused, naming both, and the export is left as it was.
#[test]
fn one_export_by_two_uris_is_one_device() {
    need("nbdkit");
    let w = World::new("nbdalias");
    let (files, socks, _servers, uris) = exports(&w, "a", "a", 4);
    let link = w.dir.join("second-name.sock");
    std::os::unix::fs::symlink(&socks[1], &link).unwrap();
    let second = format!("nbd+unix:///?socket={}", link.display());
    let before = file_hash(&files[1]);
    let (code, _, err) = w.code(&["create", "al", "--level", "5", &uris[0], &uris[1], &second]);
    assert_ne!(code, 0);
    assert!(
        err.contains("same device") && err.contains(&second),
        "{err}"
    );
    assert_eq!(
        file_hash(&files[1]),
        before,
        "a refused create changed the export"
    );
    assert!(!w.state().join("arrays/al.json").exists());
    w.ok(&["create", "al", "--level", "5", &uris[0], &uris[1], &uris[2]]);
    w.ok(&["start", "al"]);
    for args in [
        vec!["add", "al", second.as_str()],
        vec!["replace", "al", uris[2].as_str(), second.as_str()],
    ] {
        let (code, _, err) = w.code(&args);
        assert_ne!(code, 0, "{args:?}");
        assert!(
            err.contains("slot 1") && err.contains("another name"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(state(&w, "al"), "optimal");
    // The fourth export is a device of its own.
    w.ok(&["add", "al", &uris[3]]);
    w.ok(&["stop", "al"]);
}

/// fio writes with verification through the array's export; returns
/// fio's output, after asserting it wrote and verified everything.
fn fio_verify(uri: &str, size: u64, tag: &str) -> String {
    let o = Command::new("fio")
        .args([
            &format!("--name={tag}"),
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=64k",
            "--iodepth=8",
            &format!("--size={size}"),
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--randrepeat=1",
            "--output-format=json",
        ])
        .output()
        .expect("fio");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr);
    let json = &out[out.find('{').unwrap_or_else(|| panic!("fio: {out}{err}"))..];
    let v: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("fio JSON ({e}): {out}{err}"));
    let job = &v["jobs"][0];
    assert_eq!(
        job["error"], 0,
        "fio found wrong data or failed: {out}{err}"
    );
    assert!(job["write"]["io_bytes"].as_u64().unwrap() >= size, "{out}");
    assert!(job["read"]["io_bytes"].as_u64().unwrap() >= size, "{out}");
    out
}

/// Four member hosts and the array's host as network namespaces. A RAID5
/// over hosts 1-3 and a RAID6 over hosts 1-4, both run by a daemon on host
/// 0: hosts 1-3 serve nbdkit file exports, host 4 serves a RAID1 of its own
/// through another raidctl's export. Under fio writes with verification, host
/// 2's link is cut: both arrays degrade, fio finds no wrong data, and an
/// alert is sent for each. The link returns: both members are re-added
/// and resync only the regions written while it was away (counted), and
/// a scrub finds parity consistent.
#[test]
fn arrays_across_hosts_survive_a_cut_link() {
    need("nbdkit");
    need("fio");
    let Some(mut net) = Hosts::new(5) else {
        return;
    };
    let w = World::new("hosts");
    let hook_out = config(&w, 3.0);
    // Host 4: another raidctl, serving a RAID1 of two files.
    let w4 = World::new("host4");
    let m4: Vec<PathBuf> = (0..2)
        .map(|i| w4.sparse(&format!("m{i}.img"), 96 * MIB))
        .collect();
    w4.ok(&[
        "create",
        "local4",
        "--level",
        "1",
        m4[0].to_str().unwrap(),
        m4[1].to_str().unwrap(),
    ]);
    let o = w4.run_in(
        &["ip", "netns", "exec", &net.ns(4)],
        &[
            "start",
            "local4",
            "--nbd",
            &format!("tcp:{}:10810", net.addr(4)),
            "--insecure",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Hosts 1-3 serve two exports each: one for each array.
    for h in 1..=3 {
        for (k, port) in [(5, 10809), (6, 10810)] {
            let f = w.sparse(&format!("h{h}-raid{k}.img"), 96 * MIB);
            let (addr, port_s) = (net.addr(h), port.to_string());
            net.serve(
                h,
                &[
                    "nbdkit",
                    "-f",
                    "-i",
                    &addr,
                    "-p",
                    &port_s,
                    "file",
                    f.to_str().unwrap(),
                ],
            );
        }
    }
    for h in 1..=4 {
        wait_for("nbdkit on every host", 20, || {
            net.reaches(0, h, 10810) && (h == 4 || net.reaches(0, h, 10809))
        });
    }
    let host0 = ["ip", "netns", "exec", &net.ns(0)];
    let uri = |h: usize, port: u16| format!("nbd://{}:{port}/", net.addr(h));
    let r5: Vec<String> = (1..=3).map(|h| uri(h, 10809)).collect();
    let mut r6: Vec<String> = (1..=3).map(|h| uri(h, 10810)).collect();
    r6.push(format!("nbd://{}:10810/local4", net.addr(4)));
    let run = |args: &[&str]| {
        let o = w.run_in(&host0, args, &[]);
        assert!(
            o.status.success(),
            "raidctl {args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let mut a = vec!["create", "across5", "--level", "5", "--chunk", "64K"];
    a.extend(r5.iter().map(String::as_str));
    run(&a);
    let mut a = vec!["create", "across6", "--level", "6", "--chunk", "64K"];
    a.extend(r6.iter().map(String::as_str));
    run(&a);
    let socks: Vec<PathBuf> = ["across5", "across6"]
        .iter()
        .map(|n| w.dir.join(format!("{n}.sock")))
        .collect();
    for (n, s) in ["across5", "across6"].iter().zip(&socks) {
        run(&["start", n, "--nbd", &format!("unix:{}", s.display())]);
        assert_eq!(state(&w, n), "optimal");
    }
    // Under verified writes on both arrays, host 2's link is cut.
    let fios: Vec<_> = ["across5", "across6"]
        .iter()
        .zip(&socks)
        .map(|(n, s)| {
            let uri = format!("nbd+unix:///{n}?socket={}", s.display());
            let tag = n.to_string();
            std::thread::spawn(move || fio_verify(&uri, 48 * MIB, &tag))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    net.link(2, false);
    for f in fios {
        f.join().expect("fio with verification through the cut");
    }
    // A fio that ended before the cut (a fast run) left the cut member
    // untouched since: one more write across every member makes each
    // array meet it (a member is found gone by its I/O, as md finds it).
    for (n, s) in ["across5", "across6"].iter().zip(&socks) {
        let (ok, text) = qemu_io(s, n, &["write -P 0x3c 0 1M"]);
        assert!(ok, "{text}");
    }
    wait_for("both arrays degraded", 30, || {
        state(&w, "across5") == "degraded" && state(&w, "across6") == "degraded"
    });
    for (n, m) in [("across5", &r5[1]), ("across6", &r6[1])] {
        let alerted = format!("member_failed critical {n} {m}");
        wait_for(&format!("the alert '{alerted}'"), 20, || {
            std::fs::read_to_string(&hook_out).is_ok_and(|a| a.contains(&alerted))
        });
    }
    // Written while degraded: what the resync must bring to host 2.
    let (ok, out) = qemu_io(&socks[0], "across5", &["write -P 0x77 64M 4M"]);
    assert!(ok, "{out}");
    net.link(2, true);
    wait_for("both members re-added and resynced", 60, || {
        ["across5", "across6"]
            .iter()
            .all(|n| state(&w, n) == "optimal" && !resyncs(&w, n).is_empty())
    });
    for n in ["across5", "across6"] {
        let (copied, rows) = resyncs(&w, n)[0];
        println!("{n}: resynced {copied} of {rows} rows after the link returned");
        assert!(
            copied > 0 && copied < rows,
            "{n}: a re-add copies only what changed: {copied} of {rows} rows"
        );
        let o = w.run(&["scrub", n]);
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "scrub of {n}: {text}{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // Host 1 goes away for good: reads need host 2's resynced data.
    net.link(1, false);
    let (ok, out) = qemu_io(&socks[0], "across5", &["read -P 0x77 64M 4M"]);
    assert!(ok, "{out}");
    for n in ["across5", "across6"] {
        w.run(&["stop", n]);
    }
    w4.run(&["stop", "local4"]);
}
