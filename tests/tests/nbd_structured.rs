//! Structured replies on the NBD export, against clients nobody here
//! wrote (nbdinfo, nbdcopy, qemu-io) and one that reads the chunks byte
//! by byte: block status (`base:allocation`), reads of holes answered as
//! holes, and the switch that turns structured replies off.

use raid_e2e::nbd_client::{
    nbd_chunk, nbd_go_with, nbd_request, CHUNK_DONE, CHUNK_OFFSET_DATA, CHUNK_OFFSET_HOLE,
};
use raid_e2e::{map_and_copies, need, qemu_io, World};
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `World::sparse_raid5` started on a Unix socket, with 4 KiB of 0x55
/// written at 1 MiB and 1 MiB of 0x66 at 100 MiB; its members and the
/// socket. None where the files' holes are not trusted (said so).
fn served_with_two_pieces(w: &World, name: &str) -> Option<(Vec<PathBuf>, PathBuf)> {
    let m = w.sparse_raid5(name)?;
    let sock = w.dir.join(format!("{name}.sock"));
    w.ok(&["start", name, "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, out) = qemu_io(
        &sock,
        name,
        &["write -P 0x55 1M 4k", "write -P 0x66 100M 1M"],
    );
    assert!(ok, "{out}");
    Some((m, sock))
}

/// Block status (`base:allocation`): the parts of a sparse array never
/// written are holes that read as zeros, what was written is data, chunk
/// by chunk; a copy that skips the holes (nbdcopy's default) is the same
/// as one that reads every byte, optimal and with a member failed (its
/// chunks recovered from the others: data where any of those is).
#[test]
fn block_status_names_the_holes_and_a_copy_skipping_them_is_exact() {
    need("nbdinfo");
    need("nbdcopy");
    let w = World::new("map");
    let Some((m, sock)) = served_with_two_pieces(&w, "map") else {
        return;
    };
    let uri = format!("nbd+unix:///map?socket={}", sock.display());
    // Chunks of 64 KiB: the 4 KiB write is in chunk 16 (the second of
    // stripe 5, whose third is on member 1 and parity on member 2), the
    // 1 MiB one in chunks 1600 to 1615 (none of the chunks beside it in
    // its first and last stripes is on member 1).
    let chunk = 64 * 1024;
    let check = |when: &str, want: Vec<(u64, u64)>| {
        assert_eq!(
            map_and_copies(&uri, 3 * 127 * MIB, &w.dir, when),
            want,
            "{when}"
        );
    };
    check("optimal", vec![(MIB, chunk), (100 * MIB, MIB)]);
    w.ok(&["fail", "map", s(&m[1])]);
    // Chunk 17, recovered from chunk 16's data and the parity, is data.
    check("degraded", vec![(MIB, 2 * chunk), (100 * MIB, MIB)]);
    w.ok(&["stop", "map"]);
}

/// With structured replies switched off (RAIDCTL_NBD_STRUCTURED_REPLIES=off,
/// nbdkit's --no-sr), clients fall back to simple replies and get no
/// block status; their reads and writes are served as before.
#[test]
fn structured_replies_switched_off_leave_simple_replies() {
    need("nbdinfo");
    let w = World::new("nosr");
    w.raid5_of_four("nosr", 128 * MIB);
    let sock = w.dir.join("nosr.sock");
    let o = w.run_env(
        &[
            "start",
            "nosr",
            "--nbd",
            &format!("unix:{}", sock.display()),
        ],
        &[("RAIDCTL_NBD_STRUCTURED_REPLIES", "off")],
    );
    assert!(o.status.success(), "{o:?}");
    let uri = format!("nbd+unix:///nosr?socket={}", sock.display());
    let map = Command::new("nbdinfo")
        .arg("--map")
        .arg(&uri)
        .output()
        .unwrap();
    assert!(!map.status.success(), "{map:?}");
    let why = String::from_utf8_lossy(&map.stderr);
    assert!(why.contains("base:allocation"), "{why}");
    let (ok, out) = qemu_io(
        &sock,
        "nosr",
        &["write -P 0x5a 64k 8k", "read -P 0x5a 64k 8k"],
    );
    assert!(ok && !out.contains("Pattern verification failed"), "{out}");
    w.ok(&["stop", "nosr"]);
}

/// A read of holes alone, of 64 KiB or more, is answered with one hole
/// chunk and no data (nothing is read from the members); a read that
/// holds data and a small read are answered with their data. What qemu-io
/// (qemu's client, which takes hole chunks) reads back is what was
/// written, and zeros elsewhere; so is it with a member failed, where a
/// chunk recovered beside written data is read, not said to be a hole.
#[test]
fn a_read_of_holes_is_answered_with_a_hole_chunk() {
    need("qemu-io");
    let w = World::new("holes");
    let Some((m, sock)) = served_with_two_pieces(&w, "holes") else {
        return;
    };
    let (mut c, _) = nbd_go_with(&sock, "holes", true, true);
    let mut cookie = 0;
    // The one chunk of a read's reply: its type, offset, and data (a
    // hole's as zeros).
    let mut read = |offset: u64, len: u32| -> (u16, Vec<u8>) {
        cookie += 1;
        nbd_request(&mut c, 0, 0, cookie, offset, len);
        let ch = nbd_chunk(&mut c);
        assert_eq!((ch.cookie, ch.flags), (cookie, CHUNK_DONE), "{ch:?}");
        let at = u64::from_be_bytes(ch.payload[..8].try_into().unwrap());
        assert_eq!(at, offset);
        match ch.kind {
            CHUNK_OFFSET_HOLE => {
                let n = u32::from_be_bytes(ch.payload[8..12].try_into().unwrap());
                assert_eq!((n, ch.payload.len()), (len, 12));
                (ch.kind, vec![0; len as usize])
            }
            CHUNK_OFFSET_DATA => {
                assert_eq!(ch.payload.len(), 8 + len as usize);
                (ch.kind, ch.payload[8..].to_vec())
            }
            k => panic!("chunk type {k}: {ch:?}"),
        }
    };
    let zeros = |len: u32| vec![0u8; len as usize];
    // The chunk's type, and its bytes as wanted (not printed: megabytes).
    let check = |read: &mut dyn FnMut(u64, u32) -> (u16, Vec<u8>),
                 offset: u64,
                 len: u32,
                 kind: u16,
                 want: Vec<u8>| {
        let (k, got) = read(offset, len);
        assert_eq!(k, kind, "the chunk's type, {offset}+{len}");
        assert!(got == want, "the bytes read at {offset}+{len}");
    };
    check(
        &mut read,
        200 * MIB,
        256 << 10,
        CHUNK_OFFSET_HOLE,
        zeros(256 << 10),
    );
    check(
        &mut read,
        3 * MIB,
        64 << 10,
        CHUNK_OFFSET_HOLE,
        zeros(64 << 10),
    );
    // Too small to ask about.
    check(
        &mut read,
        200 * MIB,
        60 << 10,
        CHUNK_OFFSET_DATA,
        zeros(60 << 10),
    );
    // Data, all of it or some.
    check(
        &mut read,
        100 * MIB,
        256 << 10,
        CHUNK_OFFSET_DATA,
        vec![0x66; 256 << 10],
    );
    let mut want = zeros(256 << 10);
    want[64 << 10..68 << 10].fill(0x55);
    check(
        &mut read,
        MIB - (64 << 10),
        256 << 10,
        CHUNK_OFFSET_DATA,
        want,
    );
    // Beside the data in its stripe, chunk 17 (member 1's) holds a hole:
    // optimal, read as one; with member 1 failed, recovered from chunk
    // 16's data and the parity: read, its zeros sent as data.
    let chunk17 = MIB + (64 << 10);
    check(
        &mut read,
        chunk17,
        64 << 10,
        CHUNK_OFFSET_HOLE,
        zeros(64 << 10),
    );
    w.ok(&["fail", "holes", s(&m[1])]);
    check(
        &mut read,
        chunk17,
        64 << 10,
        CHUNK_OFFSET_DATA,
        zeros(64 << 10),
    );
    check(
        &mut read,
        3 * MIB,
        64 << 10,
        CHUNK_OFFSET_HOLE,
        zeros(64 << 10),
    );
    drop(c);
    let (ok, out) = qemu_io(
        &sock,
        "holes",
        &[
            "read -P 0 0 1M",
            "read -P 0x55 1M 4k",
            "read -P 0 1028k 1020k",
            "read -P 0x66 100M 1M",
            "read -P 0 101M 4M",
            "read -P 0 200M 8M",
        ],
    );
    assert!(ok && !out.contains("Pattern verification failed"), "{out}");
    w.ok(&["stop", "holes"]);
}
