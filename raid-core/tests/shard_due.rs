//! A shard reaps its simulated drives' I/O itself (`Member::start_due`):
//! each I/O's completion time goes into the shard's own queue of due I/Os,
//! reaped as the time passes, and the shard sleeps in its ring until the
//! soonest is due. This binary holds one test, alone in its process, so
//! the CPU time of the threads named `shard-*` is that engine's alone.

use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{MemberRef, NvmeModel, SimNvme};
use raid_core::metadata::MIN_DATA_OFFSET;
use raid_core::shard::Engine;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;

/// The `/proc` directories of this process's threads whose name passes
/// `named`.
fn threads(named: impl Fn(&str) -> bool) -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .map(|t| t.path())
        .filter(|t| {
            named(
                std::fs::read_to_string(t.join("comm"))
                    .unwrap_or_default()
                    .trim_end(),
            )
        })
        .collect()
}

/// CPU time used so far by this process's threads named `shard-*`, from
/// their `/proc` stat (user and system ticks).
fn shards_cpu() -> Duration {
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut ticks = 0;
    for t in threads(|name| name.starts_with("shard-")) {
        let stat = std::fs::read_to_string(t.join("stat")).unwrap_or_default();
        // Fields after the command's closing parenthesis: state is the
        // 3rd field of the line, utime the 14th, stime the 15th.
        let rest = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 12 {
            ticks += f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
        }
    }
    Duration::from_millis(ticks * 1000 / hz)
}

/// Times the drives' timer thread (`sim-nvme-timer`) has woken so far:
/// its voluntary context switches (0 where it has not started).
fn timer_wake_ups() -> u64 {
    let Some(t) = threads(|name| name == "sim-nvme-timer").pop() else {
        return 0;
    };
    let status = std::fs::read_to_string(t.join("status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Over drives that take 200 ms a read, five reads one after another keep
/// a shard waiting for a second; it must sleep through it, not spin (a
/// shard that spun would use the whole second of CPU), and each read
/// still takes its drive's time. The drives' timer thread takes no part:
/// each read would wake it at least once.
#[test]
fn a_shard_sleeps_until_its_drives_are_due() {
    let model = NvmeModel {
        read: Duration::from_millis(200),
        write: Duration::from_micros(100),
        queue: 8,
        read_bw: 0,
        write_bw: 0,
    };
    let members: Vec<MemberRef> = (0..4)
        .map(|i| {
            Arc::new(SimNvme::new(
                format!("sim:slow{i}"),
                MIN_DATA_OFFSET + (4 << 20),
                model,
            )) as MemberRef
        })
        .collect();
    let a = support::array::create_shared(Level::Raid5, members, "shard-due", 64 << 10);
    let e = match Engine::start(a, 1) {
        Ok(e) => e,
        Err(err) => return eprintln!("skipped: no io_uring here ({err})"),
    };
    if e.shard_count() == 0 {
        return eprintln!("skipped: no io_uring here");
    }
    let before = shards_cpu();
    let timer_before = timer_wake_ups();
    let began = Instant::now();
    for i in 0..5u64 {
        let (tx, rx) = mpsc::channel();
        e.read(
            i * 4096,
            AlignedBuf::new(4096),
            Box::new(move |r| tx.send(r).unwrap()),
        );
        rx.recv_timeout(Duration::from_secs(30))
            .expect("a read never completed")
            .unwrap();
    }
    let waited = began.elapsed();
    let used = shards_cpu() - before;
    let timer_woken = timer_wake_ups() - timer_before;
    assert!(
        waited >= Duration::from_millis(1000),
        "five reads took {waited:?}"
    );
    assert!(
        used < Duration::from_millis(300),
        "the shard used {used:?} of CPU in {waited:?} spent waiting for its drives"
    );
    assert!(
        timer_woken < 5,
        "the drives' timer woke {timer_woken} times for five reads"
    );
    assert_eq!(
        e.counts()
            .on_shards
            .load(std::sync::atomic::Ordering::Relaxed),
        5
    );
}
