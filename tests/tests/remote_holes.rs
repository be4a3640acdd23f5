//! Holes of an array whose members are network exports: each member's
//! server says where its holes are (block status, `base:allocation`, on
//! the member's connection), so the array's own export names its holes
//! as an array of files does, and a copy that skips them is the same as
//! one that reads every byte.

use raid_e2e::hosts::{unix_server, Server};
use raid_e2e::{holes_trusted, map_and_copies, need, qemu_io, run_ok as run, World};
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

/// `file` served on the Unix socket `sock`: by qemu-nbd, or by nbdkit's
/// file plugin (both answer block status from the file's holes).
fn serve(qemu: bool, sock: &Path, file: &Path) -> Server {
    let mut c = if qemu {
        let mut c = Command::new("qemu-nbd");
        c.args(["-f", "raw", "-t", "-k"]).arg(sock);
        c
    } else {
        let mut c = Command::new("nbdkit");
        c.args(["-f", "-U"]).arg(sock).arg("file");
        c
    };
    c.arg(file);
    unix_server(c, sock)
}

/// A RAID5 of four 128 MiB sparse files, two served by qemu-nbd and two
/// by nbdkit, chunk 64 KiB, created `--sparse` and started on its own
/// socket, with 4 KiB written at 1 MiB and 1 MiB at 100 MiB. Without
/// `[remote] trust_holes` every byte is data; with it, block status
/// names the two pieces as data and the rest as holes, optimal and with
/// a member failed (chunk 17, recovered from chunk 16's data and the
/// parity, is data); a copy skipping the holes is byte for byte the one
/// reading every byte. The build before said every byte was data.
#[test]
fn an_array_of_network_members_names_its_holes() {
    for tool in ["qemu-nbd", "nbdkit", "nbdinfo", "nbdcopy"] {
        need(tool);
    }
    let w = World::new("rholes");
    if !holes_trusted(&w.dir) {
        eprintln!("{}: holes not trusted here: skipped", w.dir.display());
        return;
    }
    let files: Vec<PathBuf> = (0..4)
        .map(|i| w.sparse(&format!("m{i}.img"), 128 * MIB))
        .collect();
    let socks: Vec<PathBuf> = (0..4).map(|i| w.dir.join(format!("m{i}.sock"))).collect();
    let _servers: Vec<Server> = (0..4).map(|i| serve(i < 2, &socks[i], &files[i])).collect();
    let uris: Vec<String> = socks
        .iter()
        .map(|s| format!("nbd+unix:///?socket={}", s.display()))
        .collect();
    w.create("rh", "5", &uris, &["--chunk", "64K", "--sparse"]);
    let sock = w.dir.join("rh.sock");
    w.ok(&["start", "rh", "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, out) = qemu_io(
        &sock,
        "rh",
        &["write -P 0x55 1M 4k", "write -P 0x66 100M 1M"],
    );
    assert!(ok, "{out}");
    let uri = format!("nbd+unix:///rh?socket={}", sock.display());
    // Not trusted unless the operator says so: every byte is data.
    let map = run(Command::new("nbdinfo").arg("--map").arg(&uri));
    let whole = (3 * 127 * MIB).to_string();
    assert_eq!(
        map.split_whitespace().collect::<Vec<_>>(),
        ["0", whole.as_str(), "0", "data"],
        "{map}"
    );
    w.ok(&["stop", "rh"]);
    w.end_daemon();
    std::fs::write(
        w.state().join("raidctl.toml"),
        "[remote]\ntrust_holes = true\n",
    )
    .unwrap();
    w.ok(&["start", "rh", "--nbd", &format!("unix:{}", sock.display())]);
    let chunk = 64 * 1024;
    let check = |when: &str, want: Vec<(u64, u64)>| {
        assert_eq!(
            map_and_copies(&uri, 3 * 127 * MIB, &w.dir, when),
            want,
            "{when}"
        );
    };
    check("optimal", vec![(MIB, chunk), (100 * MIB, MIB)]);
    w.ok(&["fail", "rh", &uris[1]]);
    check("degraded", vec![(MIB, 2 * chunk), (100 * MIB, MIB)]);
    // The pieces read back as written, through the members' structured
    // replies (qemu-nbd answers reads of holes with hole chunks).
    let (ok, out) = qemu_io(
        &sock,
        "rh",
        &[
            "read -P 0x55 1M 4k",
            "read -P 0 2M 1M",
            "read -P 0x66 100M 1M",
        ],
    );
    assert!(ok, "{out}");
    w.ok(&["stop", "rh"]);
}
