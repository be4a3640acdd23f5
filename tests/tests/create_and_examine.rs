//! What `create` lays down and what `examine` reads back: member files
//! allocated unless `--sparse`, and each device's metadata told as it is
//! (a member, a spare, another array's, none).

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
