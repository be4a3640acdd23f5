//! Helpers for the end-to-end tests in `tests/tests/`: they drive the real
//! `raidctl` binary (built by the same `cargo test` run) in a private state
//! directory, with sparse member files in a temporary folder.

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod hosts;
pub mod nbd_client;

/// The `raidctl` binary of the profile these tests were built with, or the
/// one `RAIDCTL_BIN` names (to run a test against another build, e.g. to
/// show that a regression test fails on an older one).
pub fn raidctl_path() -> PathBuf {
    if let Some(p) = std::env::var_os("RAIDCTL_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> -> target/<profile>/raidctl
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>");
    let bin = dir.join("raidctl");
    if !bin.exists() {
        let release = dir.ends_with("release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "raidctl"]);
        if release {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().expect("cargo build").success(),
            "building raidctl failed"
        );
    }
    bin
}

/// Runs raidctl with arguments (no state dir of its own).
pub fn raidctl(args: &[&str]) -> Output {
    Command::new(raidctl_path())
        .args(args)
        .output()
        .expect("run raidctl")
}

/// A test's world: a temporary folder for members and a private state dir.
/// Dropping it stops any array still running and removes the folder.
pub struct World {
    pub dir: PathBuf,
    started: std::sync::Mutex<Vec<String>>,
}

impl World {
    pub fn new(tag: &str) -> World {
        World::under(&std::env::temp_dir(), tag)
    }

    /// A world whose folder is in memory (/dev/shm, tmpfs), where there is
    /// one: members there are copies in memory, which the array serves
    /// differently (reads copied in the thread that asked for them).
    pub fn in_memory(tag: &str) -> Option<World> {
        let shm = Path::new("/dev/shm");
        shm.is_dir().then(|| World::under(shm, tag))
    }

    /// A world whose folder is in `base`.
    pub fn under(base: &Path, tag: &str) -> World {
        let dir = base.join(format!("raid-e2e-{tag}-{}-{}", std::process::id(), nanos()));
        std::fs::create_dir_all(&dir).unwrap();
        World {
            dir,
            started: Default::default(),
        }
    }

    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// `n` sparse files of `size` bytes, named `{tag}0.img`, `{tag}1.img`...
    pub fn sparse_members(&self, tag: &str, n: usize, size: u64) -> Vec<PathBuf> {
        (0..n)
            .map(|i| self.sparse(&format!("{tag}{i}.img"), size))
            .collect()
    }

    /// A sparse file of `size` bytes.
    pub fn sparse(&self, name: &str, size: u64) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::File::create(&p).unwrap().set_len(size).unwrap();
        p
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.run_env(args, &[])
    }

    /// Runs with extra environment variables (a daemon started by this
    /// call inherits them).
    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.run_in(&[], args, env)
    }

    /// Runs raidctl under a wrapper command (`ip netns exec NS`: a daemon
    /// it starts lives in that network namespace).
    pub fn run_in(&self, wrapper: &[&str], args: &[&str], env: &[(&str, &str)]) -> Output {
        if args.first() == Some(&"start") {
            if let Some(n) = args.get(1) {
                self.started.lock().unwrap().push(n.to_string());
            }
        }
        let bin = raidctl_path();
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        cmd.env("RAIDCTL_STATE_DIR", self.state())
            .env("RAIDCTL_LOG", "warn")
            .envs(env.iter().copied())
            .args(args)
            .output()
            .expect("run raidctl")
    }

    /// Creates a RAID5 (chunk 64 KiB) of four sparse members of `size`
    /// bytes, named m0.img to m3.img; returns their paths.
    pub fn raid5_of_four(&self, name: &str, size: u64) -> Vec<PathBuf> {
        self.raid5_of_four_with(name, size, &[])
    }

    /// `raid5_of_four` of 128 MiB members, started and served on a Unix
    /// socket: the members, the socket, and its NBD URI.
    pub fn served_raid5(&self, name: &str) -> (Vec<PathBuf>, PathBuf, String) {
        let m = self.raid5_of_four(name, 128 << 20);
        let sock = self.dir.join(format!("{name}.sock"));
        self.ok(&["start", name, "--nbd", &format!("unix:{}", sock.display())]);
        let uri = format!("nbd+unix:///{name}?socket={}", sock.display());
        (m, sock, uri)
    }

    /// `raidctl create NAME --level LEVEL MEMBER... EXTRA...`, which must
    /// succeed (members are paths or NBD URIs).
    pub fn create<M: AsRef<Path>>(&self, name: &str, level: &str, members: &[M], extra: &[&str]) {
        let mut args = vec!["create", name, "--level", level];
        args.extend(
            members
                .iter()
                .map(|p| p.as_ref().to_str().expect("a UTF-8 name")),
        );
        args.extend(extra);
        self.ok(&args);
    }

    /// `raid5_of_four`, with `extra` arguments to `create`.
    fn raid5_of_four_with(&self, name: &str, size: u64, extra: &[&str]) -> Vec<PathBuf> {
        let m = self.sparse_members("m", 4, size);
        let mut extra = extra.to_vec();
        extra.extend(["--chunk", "64K"]);
        self.create(name, "5", &m, &extra);
        m
    }

    /// A RAID5 of four 128 MiB member files created `--sparse` (chunk 64
    /// KiB), not started; None, having said so, where the files'
    /// filesystem is not one whose holes the array trusts (overlayfs in a
    /// container).
    pub fn sparse_raid5(&self, name: &str) -> Option<Vec<PathBuf>> {
        if !holes_trusted(&self.dir) {
            eprintln!(
                "{}: not a filesystem whose holes are trusted: skipped",
                self.dir.display()
            );
            return None;
        }
        Some(self.raid5_of_four_with(name, 128 << 20, &["--sparse"]))
    }

    /// A started RAID`level` of `n` 16 MiB sparse members (chunk 16 KiB)
    /// with a pattern written through NBD over its first 8 MiB
    /// (`pattern_reads_back` checks it); returns the members and the
    /// socket.
    pub fn running_with_pattern(
        &self,
        name: &str,
        level: &str,
        n: usize,
    ) -> (Vec<PathBuf>, PathBuf) {
        let m: Vec<PathBuf> = (0..n)
            .map(|i| self.sparse(&format!("{name}{i}.img"), 16 << 20))
            .collect();
        self.create(name, level, &m, &["--chunk", "16K"]);
        let sock = self.dir.join(format!("{name}.sock"));
        self.ok(&["start", name, "--nbd", &format!("unix:{}", sock.display())]);
        let (ok, text) = qemu_io(&sock, name, &["write -P 0x5a 0 8M"]);
        assert!(ok, "{text}");
        (m, sock)
    }

    /// Runs and requires a refusal (exit code 4) whose message says
    /// `says`; returns the message.
    pub fn refused(&self, args: &[&str], says: &str) -> String {
        let (code, out, err) = self.code(args);
        assert_eq!(code, 4, "raidctl {args:?} was not refused:\n{out}{err}");
        assert!(
            err.contains(says),
            "raidctl {args:?}: message lacks {says:?}:\n{err}"
        );
        err
    }

    /// Runs and requires success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "raidctl {args:?} failed ({:?}):\n{}\n{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `status NAME --format json`, parsed. Its exit status says the
    /// health (0 optimal, 1 degraded or rebuilding, 2 failed) and must agree
    /// with the state it prints.
    /// The pid of the daemon the CLI started for this world's state
    /// directory.
    pub fn daemon_pid(&self) -> i32 {
        let want = format!("{}", self.state().display());
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let args: Vec<String> = cmd
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if args.iter().any(|a| a == "daemon") && args.iter().any(|a| a == &want) {
                return pid;
            }
        }
        panic!("no daemon for {want}");
    }

    pub fn status_json(&self, name: &str) -> serde_json::Value {
        let o = self.run(&["status", name, "--format", "json"]);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| {
            panic!(
                "status JSON does not parse ({e}):\n{out}\n{}",
                String::from_utf8_lossy(&o.stderr)
            )
        });
        let want = match v["health"].as_str() {
            Some("failed") => 2,
            Some("optimal") if v["out_of_space"].is_null() => 0,
            _ => 1,
        };
        assert_eq!(o.status.code(), Some(want), "status exit code against {v}");
        v
    }

    /// Writes every byte of the stopped array `name` (0x6b) through an NBD
    /// export of its own, then stops it again: its members then hold data
    /// on every row, which a scrub reads and a rebuild recovers (rows every
    /// member holds holes on are skipped, zeroed on a new member), so that
    /// a paced job over it takes its time. No daemon is left running.
    pub fn fill(&self, name: &str) {
        let sock = self.dir.join(format!("{name}-fill.sock"));
        let sock_arg = format!("unix:{}", sock.display());
        self.ok(&["start", name, "--nbd", &sock_arg]);
        let cap = self.status_json(name)["capacity_bytes"].as_u64().unwrap();
        let write = format!("write -P 0x6b 0 {cap}");
        let (ok, text) = qemu_io(&sock, name, &[&write]);
        assert!(ok, "{text}");
        self.ok(&["stop", name]);
        // Its daemon may linger with the environment it was started in:
        // the test's own start then starts one with its own.
        self.end_daemon();
    }

    /// Whether `raidctl examine` finds array `name`'s metadata on `p`.
    pub fn carries(&self, p: &Path, name: &str) -> bool {
        let p = p.to_str().expect("a UTF-8 path");
        self.code(&["examine", p]).1.lines().any(|l| {
            let mut words = l.split_whitespace();
            words.next() == Some("array:") && words.next() == Some(name)
        })
    }

    /// Kills this world's daemon with SIGKILL (a crash: no goodbye) and
    /// waits until it is gone, not only signalled: its file locks and its
    /// FUSE device go with it.
    pub fn kill_daemon(&self) {
        assert!(self.end_daemon(), "no daemon to kill");
    }

    /// `kill_daemon` where there may be none (one that lingers after its
    /// last array stopped, with the config it read): whether there was.
    pub fn end_daemon(&self) -> bool {
        let pattern = format!("--state-dir {} daemon", self.state().display());
        let killed = Command::new("pkill")
            .args(["-9", "-f", "--", &pattern])
            .status()
            .unwrap();
        eventually("the killed daemon to be gone", || {
            !Command::new("pgrep")
                .args(["-f", "--", &pattern])
                .status()
                .unwrap()
                .success()
        });
        killed.success()
    }

    /// Runs raidctl on a pseudo-terminal (`script`, util-linux, essential
    /// on Debian): what a terminal shows, stdout and stderr together.
    /// None where there is no `script`. Arguments are joined with spaces:
    /// no quoting.
    pub fn on_a_terminal(&self, args: &[&str]) -> Option<Output> {
        let line = format!("{} {}", raidctl_path().display(), args.join(" "));
        Command::new("script")
            .args(["-qefc", &line, "/dev/null"])
            .env("RAIDCTL_STATE_DIR", self.state())
            .env("RAIDCTL_LOG", "warn")
            .output()
            .ok()
    }

    /// Runs and returns (exit code, stdout, stderr).
    pub fn code(&self, args: &[&str]) -> (i32, String, String) {
        let o = self.run(args);
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let started = std::mem::take(&mut *self.started.lock().unwrap());
        for n in &started {
            let _ = self.run(&["stop", n]);
        }
        // Once more if something wrote into it meanwhile: an event hook
        // the daemon ran as the array stopped can add its output file
        // between the removal of the entries and of the folder itself.
        for _ in 0..3 {
            let _ = std::fs::remove_dir_all(&self.dir);
            if !self.dir.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A hash of a whole file, to prove it was not modified.
pub fn file_hash(p: &Path) -> u64 {
    let mut f = std::fs::File::open(p).unwrap();
    let mut h = DefaultHasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.write(&buf[..n]);
    }
    h.finish()
}

/// qemu-io against an NBD Unix socket; returns (success, output).
pub fn qemu_io(sock: &Path, export: &str, cmds: &[&str]) -> (bool, String) {
    let opts = format!(
        "driver=raw,file.driver=nbd,file.server.type=unix,file.server.path={},file.export={export}",
        sock.display()
    );
    let mut c = Command::new("qemu-io");
    c.arg("--image-opts").arg(opts);
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    let o = c.output().expect("qemu-io is installed (qemu-utils)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // qemu-io exits 0 even when a pattern check fails: look for its words.
    let ok = o.status.success()
        && !text.contains("Pattern verification failed")
        && !text.contains("failed:");
    (ok, text)
}

/// How many threads of process `pid` are named `name` (0 once it is
/// gone): which of its paths served a request, where each has threads of
/// its own names.
pub fn threads_named(pid: i32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name)
                })
                .count()
        })
        .unwrap_or(0)
}

/// A TCP port free on loopback now (for a server the test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Makes a script the test wrote executable.
pub fn make_executable(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// What statfs(2) says of the filesystem holding `p`.
fn statfs(p: &Path) -> Option<libc::statfs> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs is plain old data, filled by the kernel.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a pointer to a live statfs.
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st)
}

/// Bytes free to an unprivileged writer on the filesystem of `p` (0 if it
/// cannot be asked). The fields' widths differ between targets.
#[allow(clippy::unnecessary_cast)]
pub fn free_bytes(p: &Path) -> u64 {
    statfs(p).map_or(0, |st| st.f_bavail as u64 * st.f_bsize as u64)
}

// Filesystems by statfs's magic number: the same as raid-core's member
// files (`raid-core/src/member/file.rs`). f_type's width differs between
// targets; the magic numbers are 32-bit.
const TMPFS_MAGIC: u32 = 0x0102_1994;
const RAMFS_MAGIC: u32 = 0x8584_58f6;
const EXT4_MAGIC: u32 = 0xef53;
const XFS_MAGIC: u32 = 0x5846_5342;
const BTRFS_MAGIC: u32 = 0x9123_683e;

/// Whether `p` is on tmpfs or ramfs, where the daemon treats members as
/// copies in memory.
pub fn on_memory_fs(p: &Path) -> bool {
    statfs(p).is_some_and(|st| matches!(st.f_type as u32, TMPFS_MAGIC | RAMFS_MAGIC))
}

/// The pattern `World::running_with_pattern` wrote reads back through
/// the export on `sock`.
pub fn pattern_reads_back(sock: &Path, name: &str) {
    let (ok, text) = qemu_io(sock, name, &["read -P 0x5a 0 8M"]);
    assert!(ok, "the array serves wrong data or errors:\n{text}");
}

/// The data extents `nbdinfo --map` gives for the export at `uri`,
/// checked to cover `size` bytes in order with nothing but data (0) and
/// holes that read as zeros (3); then a copy that skips the holes
/// (nbdcopy's default) is checked to be byte for byte one that reads
/// every byte, both made in `dir`. `when` names the moment in failures.
pub fn map_and_copies(uri: &str, size: u64, dir: &Path, when: &str) -> Vec<(u64, u64)> {
    let map = run_ok(Command::new("nbdinfo").arg("--map").arg(uri));
    let mut data = Vec::new();
    let mut end = 0;
    for line in map.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (at, len, kind): (u64, u64, u32) = (
            f[0].parse().unwrap(),
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
        );
        assert_eq!(at, end, "{when}: extents in order, none missing:\n{map}");
        end = at + len;
        match kind {
            0 => data.push((at, len)),
            3 => {}
            k => panic!("{when}: type {k}:\n{map}"),
        }
    }
    assert_eq!(end, size, "{when}: the whole export:\n{map}");
    let (skipping, whole) = (dir.join("skipping.img"), dir.join("whole.img"));
    run_ok(Command::new("nbdcopy").arg(uri).arg(&skipping));
    run_ok(
        Command::new("nbdcopy")
            .arg("--no-extents")
            .arg(uri)
            .arg(&whole),
    );
    assert_eq!(file_hash(&skipping), file_hash(&whole), "{when}");
    std::fs::remove_file(&skipping).unwrap();
    std::fs::remove_file(&whole).unwrap();
    data
}

/// Writes `data` at byte `off` of the file `p` (a member changed behind
/// the array's back).
pub fn write_at(p: &Path, off: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .unwrap()
        .write_all_at(data, off)
        .unwrap();
}

/// Whether the filesystem holding `p` is one whose holes the array trusts
/// (ext4, XFS, btrfs, tmpfs: `Member::data_from`); elsewhere (overlayfs
/// in a container) an array of files there reports no holes at all.
pub fn holes_trusted(p: &Path) -> bool {
    statfs(p).is_some_and(|st| {
        matches!(
            st.f_type as u32,
            EXT4_MAGIC | XFS_MAGIC | BTRFS_MAGIC | TMPFS_MAGIC
        )
    })
}

/// Fails the test, naming the fix, when `tool` is not installed.
pub fn need(tool: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .unwrap()
        .status
        .success();
    assert!(
        found,
        "{tool} is not installed: run scripts/install-test-deps.sh (as root)"
    );
}

/// Runs a command and requires success; returns its stdout and stderr.
pub fn run_ok(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// fio random writes of `size` bytes, every one verified (crc32c) after;
/// `extra` says where and how (engine, target, block size, depth). Fails
/// the test unless fio reports no error and read back at least `size`.
pub fn fio_verified_writes(name: &str, size: u64, extra: &[&str]) {
    let size_arg = format!("--size={}", size);
    let mut args = vec![
        format!("--name={name}"),
        "--rw=randwrite".into(),
        size_arg,
        "--verify=crc32c".into(),
        "--do_verify=1".into(),
        "--verify_fatal=1".into(),
        "--verify_state_save=0".into(),
        "--randrepeat=1".into(),
        "--output-format=json".into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let out = run_ok(Command::new("fio").args(&args));
    let json = &out[out.find('{').expect("fio JSON")..];
    let v: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("fio JSON ({e}):\n{out}"));
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{out}");
    assert!(job["write"]["io_bytes"].as_u64().unwrap() >= size, "{out}");
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= size,
        "verify read nothing: {out}"
    );
}

/// Waits until `done` holds, asking every 50 ms; panics naming `what`
/// after 30 s (for what the daemon does by itself: a monitor round, a
/// scheduled job).
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !done() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "waited 30 s for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
