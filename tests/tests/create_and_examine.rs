//! What `create` lays down and what `examine` reads back: member files
//! allocated unless `--sparse`, and each device's metadata told as it is
//! (a member, a spare, another array's, none); members of different
//! sizes, `--force` over what a device held, and the zeroing shown on a
//! terminal and cut short.

use raid_e2e::{qemu_io, World};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn examine_says_what_each_device_holds() {
    let w = World::new("examine");
    let (m, _sock) = w.running_with_pattern("ex", "6", 4);
    w.ok(&["fail", "ex", s(&m[3])]);
    let other = w.sparse("blank.img", 16 * MIB);
    let out = w.ok(&["examine", s(&m[0]), s(&m[3]), s(&other), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a = v.as_array().unwrap();
    assert_eq!(a[0]["array"], "ex");
    assert_eq!(a[0]["slot"], 0);
    assert_eq!(a[0]["member_state"], "active");
    assert_eq!(a[0]["level"], "raid6");
    // m3's own metadata still says active; its event counter is older than
    // the survivors': that is how a stale member shows.
    assert_eq!(a[1]["slot"], 3);
    assert!(a[1]["events"].as_u64() < a[0]["events"].as_u64(), "{v}");
    // Examined beside a device with the newer metadata, it says so.
    assert!(
        a[1]["superseded"]
            .as_str()
            .is_some_and(|t| t.contains("failed there")),
        "{v}"
    );
    assert!(a[0]["superseded"].is_null(), "{v}");
    assert_eq!(a[2]["kind"], "other");
    let text = w.ok(&["examine", s(&m[0])]);
    assert!(
        text.contains("slot 0, active") && text.contains("events:"),
        "{text}"
    );
    // Once replaced, the slot is another device's.
    let new = w.sparse("ex-new.img", 16 * MIB);
    w.ok(&["replace", "ex", s(&m[3]), s(&new)]);
    w.ok(&["wait", "ex"]);
    let text = w.ok(&["examine", s(&m[3]), s(&m[0])]);
    assert!(
        text.contains("superseded:") && text.contains("another device's now"),
        "{text}"
    );
    // A spare removed is no longer the array's, though its own metadata
    // still says spare.
    let spare = w.sparse("ex-spare.img", 16 * MIB);
    w.ok(&["add", "ex", s(&spare)]);
    w.ok(&["remove", "ex", s(&spare)]);
    let text = w.ok(&["examine", s(&spare), s(&m[0])]);
    assert!(text.contains("no longer a spare"), "{text}");
    // Both copies of m3's metadata corrupted: damaged (exit 1), not
    // "nothing recognisable" with exit 0; a folder is no device (exit 3).
    let f = std::fs::OpenOptions::new().write(true).open(&m[3]).unwrap();
    for off in [100, 4096 + 100] {
        std::os::unix::fs::FileExt::write_all_at(&f, b"rot", off).unwrap();
    }
    let (code, text, _) = w.code(&["examine", s(&m[3])]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("damaged"), "{text}");
    let (code, text, _) = w.code(&["examine", s(&w.dir)]);
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("a folder"), "{text}");
}

#[test]
fn create_allocates_member_files_unless_sparse() {
    let w = World::new("alloc");
    let m: Vec<PathBuf> = (0..4)
        .map(|i| w.sparse(&format!("a{i}.img"), 16 * MIB))
        .collect();
    w.ok(&["create", "al", "--level", "1", s(&m[0]), s(&m[1])]);
    w.ok(&[
        "create",
        "sp",
        "--level",
        "1",
        "--sparse",
        s(&m[2]),
        s(&m[3]),
    ]);
    let allocated = |p: &Path| std::fs::metadata(p).unwrap().blocks() * 512;
    assert!(allocated(&m[0]) >= 16 * MIB, "{}", allocated(&m[0]));
    assert!(allocated(&m[2]) < 4 * MIB, "{}", allocated(&m[2]));
    // Zeroing (discard) keeps an allocated member allocated.
    let sock = w.dir.join("al.sock");
    w.ok(&["start", "al", "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, text) = qemu_io(
        &sock,
        "al",
        &["write -P 0x11 0 4M", "discard 0 4M", "flush"],
    );
    assert!(ok, "{text}");
    assert!(allocated(&m[0]) >= 16 * MIB, "{}", allocated(&m[0]));
    let (ok, text) = qemu_io(&sock, "al", &["read -P 0 0 4M"]);
    assert!(ok, "{text}");
}

/// Members of different sizes are each used up to the smallest's size:
/// `create` says how much of the larger ones holds nothing (as mdadm
/// does), and says nothing where they match.
#[test]
fn create_says_when_members_differ_in_size() {
    let w = World::new("uneven");
    let a = w.sparse("a.img", 64 << 20);
    let b = w.sparse("b.img", 64 << 20);
    let c = w.sparse("c.img", 32 << 20);
    let out = w.ok(&[
        "create",
        "un",
        "--level",
        "5",
        "--sparse",
        s(&a),
        s(&b),
        s(&c),
    ]);
    assert!(
        out.contains("differ in size") && out.contains("32.0 MiB"),
        "{out}"
    );
    let (d, e) = (w.sparse("d.img", 64 << 20), w.sparse("e.img", 64 << 20));
    let out = w.ok(&["create", "ev", "--level", "1", "--sparse", s(&d), s(&e)]);
    assert!(
        out.contains("created") && !out.contains("differ in size"),
        "{out}"
    );
}

/// `create --force` over a member of another (stopped) array says what it
/// overwrote: that array has lost the device.
#[test]
fn create_force_says_what_it_overwrote() {
    let w = World::new("overwrote");
    let m = w.sparse_members("m", 3, 32 << 20);
    w.ok(&[
        "create",
        "old",
        "--level",
        "5",
        "--sparse",
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
    ]);
    let fresh = w.sparse("f.img", 32 << 20);
    let (code, _, err) = w.code(&[
        "create",
        "new",
        "--level",
        "1",
        "--sparse",
        s(&m[0]),
        s(&fresh),
    ]);
    assert_eq!(code, 4, "{err}");
    let out = w.ok(&[
        "create",
        "new",
        "--level",
        "1",
        "--sparse",
        "--force",
        s(&m[0]),
        s(&fresh),
    ]);
    let notes: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("--force overwrote"))
        .collect();
    assert_eq!(notes.len(), 1, "{out}");
    assert!(
        notes[0].contains(s(&m[0])) && notes[0].contains("'old'"),
        "{out}"
    );
}

/// A world in memory with four 1 GiB sparse members for a create that
/// zeroes them (tmpfs takes no hole punch in an allocated file: zeros are
/// written, 4 GiB, seconds here); None, said, where there is no /dev/shm.
fn zeroing_world(tag: &str) -> Option<(World, Vec<PathBuf>)> {
    let Some(w) = World::in_memory(tag) else {
        eprintln!("skipped: no /dev/shm");
        return None;
    };
    let m = w.sparse_members("z", 4, 1024 * MIB);
    Some((w, m))
}

/// A create that zeroes its members (not --sparse) shows the zeroing's
/// progress on a terminal: on a device that cannot zero by itself that is
/// every byte written, minutes on large drives, and create said nothing
/// until the end. Without a terminal, no progress line. Members on tmpfs,
/// which takes no hole punch in an allocated file: zeros are written.
#[test]
fn create_shows_the_zeroing_on_a_terminal() {
    let Some((w, m)) = zeroing_world("zprog") else {
        return;
    };
    let p: Vec<&str> = m.iter().map(|p| s(p)).collect();
    let mut args = vec!["create", "zt", "--level", "5"];
    args.extend(&p);
    let Some(o) = w.on_a_terminal(&args) else {
        eprintln!("skipped: no `script` (util-linux) to give the command a terminal");
        return;
    };
    let tty = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{tty}");
    let drawn = tty
        .rfind("zeroing the members' data areas: ")
        .unwrap_or_else(|| panic!("no progress: {tty:?}"));
    let cleared = tty.rfind("\r\x1b[K").expect("a cleared line");
    assert!(cleared > drawn, "the line is not cleared: {tty:?}");
    assert!(tty.contains("created raid5 'zt'"), "{tty}");
    // No terminal: the report only.
    let (code, _, err) = w.code(&[
        "create", "zt", "--force", "--level", "5", p[0], p[1], p[2], p[3],
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("zeroing the members"), "{err}");
    // Zeroed: a fresh array reads zeros and its parity agrees.
    w.ok(&["start", "zt"]);
    w.ok(&["scrub", "zt"]);
    w.ok(&["stop", "zt"]);
}

/// Ctrl-C while create zeroes says what it left: nothing created, and the
/// devices' earlier contents gone (their metadata is erased first). It
/// ended with nothing said.
#[test]
fn create_interrupted_while_zeroing_says_what_it_left() {
    let Some((w, m)) = zeroing_world("zstop") else {
        return;
    };
    let mut args = vec!["create", "zi", "--level", "5"];
    args.extend(m.iter().map(|p| s(p)));
    // An array there first, sparse: its metadata going says the create
    // over it (allocating, then erasing, then zeroing) is writing them.
    let mut first = args.clone();
    first.push("--sparse");
    w.ok(&first);
    args.push("--force");
    let child = std::process::Command::new(raid_e2e::raidctl_path())
        .args(&args)
        .env("RAIDCTL_STATE_DIR", w.state())
        .env("RAIDCTL_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let erased = || {
        let mut magic = [0u8; 8];
        std::fs::File::open(&m[0])
            .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut magic, 0))
            .is_ok_and(|()| &magic != b"NVRAIDSB")
    };
    let t = std::time::Instant::now();
    while !erased() && t.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    if o.status.success() {
        eprintln!("skipped: the create ended before it could be interrupted");
        return;
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(
        err.contains("create interrupted: nothing was created"),
        "{err}"
    );
    // The earlier array is gone, and no new one stands in its place.
    let (code, _, err) = w.code(&["start", "zi"]);
    assert_ne!(code, 0, "{err}");
}
