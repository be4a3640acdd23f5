//! A thread that cannot create an io_uring (EMFILE, ENOMEM, a kernel that
//! refuses it) says nothing about the members: its I/O goes through
//! pread/pwrite and no member is failed. Before, every member of the batch
//! was failed, durably. Its own test binary: it lowers the process's file
//! limit.

use raid_core::array::{Array, ArrayState, CreateOptions};
use raid_core::layout::Level;
use raid_core::member::{FileMember, MemberRef};
use raid_core::metadata::MIN_DATA_OFFSET;
use std::sync::Arc;

#[test]
fn no_io_uring_fails_no_member() {
    let dir = std::env::temp_dir().join(format!("raid-nouring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let members: Vec<MemberRef> = (0..4)
        .map(|i| {
            let p = dir.join(format!("m{i}"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(MIN_DATA_OFFSET + (8 << 20))
                .unwrap();
            Arc::new(FileMember::open(&p).unwrap()) as MemberRef
        })
        .collect();
    let a = Arc::new(
        Array::create(
            members,
            vec![],
            CreateOptions {
                name: "nouring".into(),
                level: Level::Raid5,
                chunk: 65536,
                data_offset: None,
            },
        )
        .unwrap(),
    );
    // The process has io_uring (probed once, now): only a new thread's own
    // ring will be refused below.
    if raid_core::member::io_path() != raid_core::member::IoPath::IoUring {
        eprintln!("skipped: this kernel gives no io_uring, so there is no ring to lose");
        return;
    }
    // From now on no new file descriptor can be had: a fresh thread's
    // io_uring_setup fails with EMFILE.
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit fill and read a plain struct we own.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) };
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: old.rlim_max,
    };
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &none) }, 0);
    let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
    let got = {
        let a = a.clone();
        let data = data.clone();
        std::thread::spawn(move || {
            a.write(0, &data).unwrap();
            let mut got = vec![0u8; data.len()];
            a.read(0, &mut got).unwrap();
            got
        })
        .join()
        .unwrap()
    };
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) }, 0);
    assert!(got == data, "data read back differs");
    assert_eq!(a.state(), ArrayState::Optimal, "{:?}", a.slots());
    drop(a);
    std::fs::remove_dir_all(&dir).unwrap();
}
