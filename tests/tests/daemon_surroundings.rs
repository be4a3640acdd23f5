//! The daemon against its own surroundings: a config it cannot load (or
//! that names an array twice, or holds a secret), a state folder that is
//! full, read-only or readable by others, a log it cannot write or that
//! is rotated under it (SIGHUP), an array among several that fails to
//! start. Each is said plainly, changes nothing on the devices, and what
//! lags (a record) catches up once the room is back.

use raid_e2e::World;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A start that would spawn the daemon over a config it cannot load says
/// why, naming the line, with the usage exit code (it said only that the
/// daemon did not come up, exit 5, the reason left in the daemon's log).
#[test]
fn a_start_over_a_bad_config_names_the_line() {
    let w = World::new("bad-config");
    let m = w.sparse_members("bc", 3, 32 * MIB);
    w.ok(&["create", "bc", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    std::fs::write(w.state().join("raidctl.toml"), "[scrub\nevery_hours = 1\n").unwrap();
    let (code, _, err) = w.code(&["start", "bc"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a valid config: line 1"), "{err}");
    std::fs::remove_file(w.state().join("raidctl.toml")).unwrap();
    w.ok(&["start", "bc"]);
    w.ok(&["stop", "bc"]);
}

/// A tmpfs of `size` mounted at `dir` (a world's state folder) for a test,
/// lazily unmounted when dropped. Declared before the `World`, it outlives
/// the world's `stop`; the world cannot remove its folder while the mount
/// is in it, so this removes it once unmounted.
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(dir: &Path, size: &str) -> SmallFs {
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                s(dir),
            ])
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount a tmpfs at {}", dir.display());
        SmallFs(dir.to_path_buf())
    }

    /// Fills it: a file of zeros until no space is left.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).unwrap();
        let zeros = vec![0u8; 4096];
        while f.write_all(&zeros).is_ok() {}
    }

    /// Remounts it read-only: again while it is busy (a daemon just
    /// killed is gone from `pgrep` before its last files are closed, and a
    /// loaded machine widens that moment).
    fn read_only(&self) {
        raid_e2e::eventually("the state folder remounted read-only", || {
            std::process::Command::new("mount")
                .args(["-o", "remount,ro", s(&self.0)])
                .status()
                .unwrap()
                .success()
        });
    }

    fn free(&self) {
        std::fs::remove_file(self.0.join("filler")).unwrap();
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .args(["-l", s(&self.0)])
            .status();
        if let Some(world) = self.0.parent() {
            let _ = std::fs::remove_dir_all(world);
        }
    }
}

/// A state folder that is full: a command that would change membership
/// changes nothing and says so (it used to apply the change, then fail on
/// the record, and the next start left the new member out); a change the
/// daemon makes by itself meanwhile (a hot replace's switch) is shown as
/// not recorded, and recorded once there is room, so a restart keeps it.
#[test]
fn a_full_state_folder_changes_nothing_and_a_lagging_record_catches_up() {
    let mut fs = None;
    let w = World::new("state-full");
    let fs = fs.insert(SmallFs::mount(&w.state(), "4M"));
    let m = w.sparse_members("sf", 4, 8 * MIB);
    let (new, spare, hot) = (
        w.sparse("sf-new.img", 8 * MIB),
        w.sparse("sf-spare.img", 8 * MIB),
        w.sparse("sf-hot.img", 8 * MIB),
    );
    w.ok(&[
        "create",
        "sf",
        "--level",
        "5",
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
        s(&m[3]),
    ]);
    w.ok(&["start", "sf"]);
    fs.fill();
    w.ok(&["fail", "sf", s(&m[2])]);
    for args in [
        vec!["replace", "sf", s(&m[2]), s(&new)],
        vec!["add", "sf", s(&spare)],
    ] {
        let (code, _, err) = w.code(&args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains("nothing changed"), "{err}");
    }
    let st = w.status_json("sf");
    assert_eq!(st["members"][2]["state"], "failed", "{st}");
    assert_eq!(st["spares"].as_array().unwrap().len(), 0, "{st}");
    assert!(!w.carries(&new, "sf") && !w.carries(&spare, "sf"));
    // Nor is an array created on devices whose record cannot be written.
    let g = w.sparse_members("sg", 3, 8 * MIB);
    let (code, _, err) = w.code(&["create", "sg", "--level", "5", s(&g[0]), s(&g[1]), s(&g[2])]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("nothing written"), "{err}");
    assert!(g.iter().all(|d| !w.carries(d, "sg")));
    // With room, the same command runs.
    fs.free();
    w.ok(&["replace", "sf", s(&m[2]), s(&new)]);
    w.ok(&["wait", "sf"]);
    // A hot replace whose switch comes while the folder is full.
    w.ok(&["rate", "sf", "--rebuild", "4M"]);
    w.ok(&["replace", "sf", s(&m[1]), s(&hot)]);
    fs.fill();
    raid_e2e::eventually("the hot replace switches", || {
        w.status_json("sf")["members"][1]["path"] == s(&hot)
    });
    let st = w.status_json("sf");
    assert!(st["record_lags"].is_string(), "{st}");
    assert!(w.ok(&["status", "sf"]).contains("record not written"));
    fs.free();
    raid_e2e::eventually("the record is written again", || {
        w.status_json("sf")["record_lags"].is_null()
    });
    w.ok(&["stop", "sf"]);
    w.ok(&["start", "sf"]);
    let st = w.status_json("sf");
    assert_eq!(st["state"], "optimal", "{st}");
    assert_eq!(st["members"][1]["path"], s(&hot), "{st}");
    assert_eq!(st["members"][2]["path"], s(&new), "{st}");
    w.ok(&["stop", "sf"]);
    // A read-only state folder: no daemon can run from it (its socket and
    // log live there), said as such with exit 5, not as a file error.
    w.kill_daemon();
    fs.read_only();
    let (code, _, err) = w.code(&["start", "sf"]);
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains("cannot start the daemon") && err.contains("make that folder writable"),
        "{err}"
    );
}

/// A daemon whose log cannot be written (its state folder full or
/// read-only; here its stderr is /dev/full, where every write fails)
/// still answers every command: a log line that fails used to panic the
/// thread that logged it, so `fail` was applied but answered as if no
/// array ran, and `stop` then said the same.
#[test]
fn a_daemon_whose_log_cannot_be_written_still_answers() {
    let w = World::new("log-full");
    std::fs::create_dir_all(w.state()).unwrap();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let mut daemon = std::process::Command::new(raid_e2e::raidctl_path())
        .env("RAIDCTL_STATE_DIR", w.state())
        .args(["daemon", "--exit-when-idle"])
        .stdout(full.try_clone().unwrap())
        .stderr(full)
        .spawn()
        .unwrap();
    raid_e2e::eventually("the daemon listens", || {
        w.state().join("raidctl.sock").exists()
    });
    let m = w.sparse_members("lf", 4, 8 * MIB);
    let spare = w.sparse("lf-spare.img", 8 * MIB);
    w.ok(&[
        "create",
        "lf",
        "--level",
        "5",
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
        s(&m[3]),
    ]);
    w.ok(&["start", "lf"]);
    w.ok(&["add", "lf", s(&spare)]);
    let out = w.ok(&["fail", "lf", s(&m[3])]);
    assert!(out.contains("marked failed"), "{out}");
    w.ok(&["wait", "lf"]);
    // The failure's next step is to wait for the spare, not a replace
    // (which the spare's slot refuses).
    let events: serde_json::Value =
        serde_json::from_str(&w.ok(&["events", "lf", "--format", "json"])).unwrap();
    let failed = events
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"] == "member_failed")
        .cloned()
        .expect("the failure is logged");
    assert!(
        failed["next"]
            .as_str()
            .unwrap()
            .starts_with("raidctl wait lf"),
        "{failed}"
    );
    // The daemon that served all this is the one started here, not one
    // `start` had to spawn in its place.
    assert!(
        daemon.try_wait().unwrap().is_none(),
        "the daemon whose log fails died"
    );
    let st = w.status_json("lf");
    assert_eq!(st["state"], "optimal", "{st}");
    assert_eq!(st["members"][3]["path"], s(&spare), "{st}");
    // The record, which the next start opens, names the spare in the slot
    // it took and no longer as a spare.
    let rec = std::fs::read_to_string(w.state().join("arrays/lf.toml")).unwrap();
    let rec: toml::Value = toml::from_str(&rec).unwrap();
    assert_eq!(rec["members"][3].as_str(), Some(s(&spare)), "{rec}");
    assert_eq!(rec["spares"].as_array().map(Vec::len), Some(0), "{rec}");
    w.ok(&["stop", "lf"]);
    let end = std::time::Instant::now();
    while daemon.try_wait().unwrap().is_none() {
        assert!(
            end.elapsed().as_secs() < 30,
            "the daemon did not end once idle"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn the_state_directory_is_private() {
    let w = World::new("private");
    // The daemon's config (alert settings: an SMTP password), left
    // readable by everyone: tightened at start like the rest.
    let config = w.state().join("raidctl.toml");
    std::fs::create_dir_all(w.state()).unwrap();
    std::fs::write(&config, "# alert settings\n").unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (_m, _sock) = w.running_with_pattern("pv", "1", 2);
    let mode = |p: PathBuf| std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(config.clone()), 0o600);
    assert_eq!(mode(w.state()), 0o700);
    assert_eq!(mode(w.state().join("arrays")), 0o700);
    assert_eq!(mode(w.state().join("arrays/pv.toml")), 0o600);
    assert_eq!(mode(w.state().join("daemon.log")), 0o600);
    assert_eq!(mode(w.state().join("raidctl.sock")) & 0o077, 0);
    // Someone else asking gets "permission denied" and exit 5, not a
    // made-up answer.
    let o = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(raid_e2e::raidctl_path())
        .args(["--state-dir", s(&w.state()), "status", "pv"])
        .output()
        .expect("setpriv (util-linux)");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(err.contains("permission denied"), "{err}");
}

#[test]
fn sighup_reopens_the_log_and_the_daemon_lives_on() {
    let w = World::new("hup");
    let (_m, sock) = w.running_with_pattern("hu", "1", 2);
    let log = w.state().join("daemon.log");
    let rotated = w.state().join("daemon.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    let pid = w.daemon_pid();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    let t = Instant::now();
    while !log.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no new log after SIGHUP"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(w.status_json("hu")["state"], "optimal");
    assert_eq!(w.daemon_pid(), pid, "the daemon was replaced");
    raid_e2e::pattern_reads_back(&sock, "hu");
    assert_eq!(
        std::fs::metadata(&log).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

/// A daemon run in the foreground with its output sent to a file of the
/// operator's keeps logging there after SIGHUP (it used to move its log
/// to the state folder's daemon.log, out of the operator's sight).
#[test]
fn sighup_leaves_a_foreground_daemons_own_log_where_it_is() {
    let w = World::new("hup-fg");
    let m = w.sparse_members("f", 2, 16 * MIB);
    w.ok(&["create", "hf", "--level", "1", s(&m[0]), s(&m[1])]);
    let out = w.dir.join("out.log");
    let f = std::fs::File::create(&out).unwrap();
    let mut d = std::process::Command::new(raid_e2e::raidctl_path())
        .args(["--state-dir", s(&w.state()), "daemon"])
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !w.state().join("raidctl.sock").exists() {
        assert!(t.elapsed() < Duration::from_secs(20), "no daemon socket");
        std::thread::sleep(Duration::from_millis(50));
    }
    w.ok(&["start", "hf"]);
    assert_eq!(unsafe { libc::kill(d.id() as i32, libc::SIGHUP) }, 0);
    std::thread::sleep(Duration::from_millis(500));
    w.ok(&["stop", "hf"]);
    assert_eq!(unsafe { libc::kill(d.id() as i32, libc::SIGTERM) }, 0);
    d.wait().unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("nothing to reopen"), "{text}");
    assert!(
        text.contains("stopped"),
        "the lines after SIGHUP went elsewhere: {text}"
    );
}

#[test]
fn one_array_failing_to_start_does_not_stop_the_others() {
    let w = World::new("config");
    let good: Vec<PathBuf> = (0..2)
        .map(|i| w.sparse(&format!("g{i}.img"), 16 * MIB))
        .collect();
    w.ok(&["create", "good", "--level", "1", s(&good[0]), s(&good[1])]);
    let bad: Vec<PathBuf> = (0..3)
        .map(|i| w.sparse(&format!("b{i}.img"), 16 * MIB))
        .collect();
    w.ok(&[
        "create",
        "bad",
        "--level",
        "5",
        s(&bad[0]),
        s(&bad[1]),
        s(&bad[2]),
    ]);
    // Two of bad's three members gone: it cannot start.
    std::fs::remove_file(&bad[0]).unwrap();
    std::fs::remove_file(&bad[1]).unwrap();
    // Good's entry names one of its two members: `members` only imports
    // an array not yet recorded, so its record's two are used (the list
    // used to win, and left a healthy member out for good).
    let conf = w.dir.join("raidctl.toml");
    std::fs::write(
        &conf,
        format!(
            "[[array]]\nname = \"bad\"\n\n[[array]]\nname = \"good\"\nmembers = [\"{}\"]\n",
            s(&good[0])
        ),
    )
    .unwrap();
    let notify = w.dir.join("notify.sock");
    let ready = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    ready
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut d = std::process::Command::new(raid_e2e::raidctl_path())
        .env("RAIDCTL_STATE_DIR", w.state())
        .env("RAIDCTL_LOG", "warn")
        .env("NOTIFY_SOCKET", &notify)
        .args(["daemon", "--config", s(&conf)])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let state = loop {
        let (_, out, _) = w.code(&["status", "good", "--format", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        if v["running"] == true || t.elapsed() > Duration::from_secs(20) {
            break v;
        }
        if let Ok(Some(st)) = d.try_wait() {
            panic!("the daemon exited ({st}) because one array could not start");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(state["state"], "optimal", "{state}");
    // systemd's status line names the array left out.
    let mut buf = vec![0u8; 4096];
    let n = ready.recv(&mut buf).expect("READY=1 from the daemon");
    let msg = String::from_utf8_lossy(&buf[..n]);
    assert!(
        msg.contains("READY=1") && msg.contains("NOT started (see the log): bad"),
        "{msg}"
    );
    unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
    let _ = d.wait();
}

/// `raidctl daemon --config FILE`, FILE holding `text`: its exit code,
/// stdout and stderr.
fn daemon_with_config(w: &World, text: &str) -> (i32, String, String) {
    let conf = w.dir.join("raidctl.toml");
    std::fs::write(&conf, text).unwrap();
    w.code(&["daemon", "--config", s(&conf)])
}

/// A config with two entries for one array is refused, naming it.
#[test]
fn a_config_naming_an_array_twice_is_refused() {
    let w = World::new("twice");
    let (code, out, err) =
        daemon_with_config(&w, "[[array]]\nname = \"fa\"\n\n[[array]]\nname = \"fa\"\n");
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("array 'fa' has two [[array]] entries"),
        "{err}"
    );
}

/// A config error names its line, never the password on it.
#[test]
fn a_config_error_never_echoes_a_secret() {
    let w = World::new("secret");
    let (code, out, err) = daemon_with_config(
        &w,
        "[alerts]\nsmtp = \"127.0.0.1:25\"\nfrom = \"a@b\"\nto = [\"c@d\"]\npassword = \"s3cr3t-Pa55\nusername = \"x\"\n",
    );
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("line 5"), "{err}");
    assert!(!err.contains("s3cr3t"), "the password was echoed: {err}");
}
