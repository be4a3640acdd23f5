//! The load generators of `raidctl bench`: per target, jobs that keep a
//! profile's I/O going until told to stop, and the latency of each
//! request.
//!
//! Queue depth: through NBD and through the array's shards it is real
//! (requests in flight from one thread per job). The array's blocking API
//! takes a thread per request, so there queue depth is threads, capped at
//! 32 per job.

use super::{Data, Profile};
use crate::nbd;
use raid_core::array::{Array, ArrayError};
use raid_core::buf::AlignedBuf;
use raid_core::member::MemberRef;
use raid_core::shard::Engine;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Where the I/O goes.
#[derive(Clone)]
pub(super) enum Target {
    /// In-process, through the blocking API: a thread per request.
    Array(Arc<Array>),
    /// In-process, through the shards: requests in flight from one
    /// thread per job.
    Shards(Arc<Engine>, Arc<Array>),
    Member(MemberRef),
    Nbd(PathBuf, String),
}

impl Target {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Target::Array(_) => "array",
            Target::Shards(..) => "array-shards",
            Target::Member(_) => "member",
            Target::Nbd(..) => "array-nbd",
        }
    }
    pub(super) fn size(&self) -> u64 {
        match self {
            Target::Array(a) | Target::Shards(_, a) => a.capacity(),
            Target::Member(m) => m.size() - raid_core::metadata::MIN_DATA_OFFSET,
            Target::Nbd(..) => 0,
        }
    }
    fn io(&self, write: bool, off: u64, buf: &mut [u8]) {
        match self {
            Target::Array(a) => {
                let r = if write {
                    a.write(off, buf)
                } else {
                    a.read(off, buf)
                };
                r.expect("array I/O");
            }
            Target::Member(m) => {
                let at = raid_core::metadata::MIN_DATA_OFFSET + off;
                let r = if write {
                    m.write_at(buf, at)
                } else {
                    m.read_at(buf, at)
                };
                r.expect("member I/O");
            }
            Target::Nbd(..) | Target::Shards(..) => {
                unreachable!("runs through its own job")
            }
        }
    }
}

/// A run's shared state: when its jobs stop, and how many I/Os they have
/// timed so far.
pub(super) struct Run {
    stop: AtomicBool,
    timed: AtomicU64,
}

impl Run {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn timed_one(&self) {
        self.timed.fetch_add(1, Ordering::Relaxed);
    }
}

/// How long a run waits past its time for its first timed I/O (a start
/// slowed by a loaded machine: an NBD handshake, threads not yet
/// scheduled) before it gives up and reports none.
const FIRST_IO_PATIENCE: Duration = Duration::from_secs(30);

/// Runs one profile on one target for `secs`, and on until at least one
/// I/O was timed (a short run on a loaded machine could otherwise report
/// 0 IOPS, which says nothing about the target); latencies in
/// microseconds.
pub(super) fn run(t: &Target, p: &Profile, data: Data, size: u64, secs: f64) -> (f64, Vec<u32>) {
    let stop = Run {
        stop: AtomicBool::new(false),
        timed: AtomicU64::new(0),
    };
    let lats = Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|sc| {
        for job in 0..p.jobs {
            let (stop, lats) = (&stop, &lats);
            match t {
                // Real queue depth: one thread per job.
                Target::Nbd(..) | Target::Shards(..) => {
                    sc.spawn(move || {
                        let l = match t {
                            Target::Nbd(sock, name) => {
                                nbd_job(sock, name, p, data, size, job, stop)
                            }
                            Target::Shards(e, _) => shards_job(e, p, data, size, job, stop),
                            _ => unreachable!("matched above"),
                        };
                        lats.lock().unwrap().extend(l);
                    });
                }
                _ => {
                    let threads = p.qd.min(32);
                    for th in 0..threads {
                        sc.spawn(move || {
                            let mut rng = SmallRng::seed_from_u64((job * 1000 + th) as u64);
                            let mut buf = AlignedBuf::new(p.bs);
                            let mut mine = Vec::new();
                            let blocks = size / p.bs as u64;
                            let lanes = (p.jobs * threads) as u64;
                            let lane = (job * threads + th) as u64;
                            let mut i = 0u64;
                            while !stop.stopped() {
                                let b = block_at(p, &mut rng, blocks, lane, lanes, i);
                                i += 1;
                                if p.write {
                                    data.fill(&mut rng, &mut buf);
                                }
                                let t0 = Instant::now();
                                t.io(p.write, b * p.bs as u64, &mut buf);
                                mine.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                                stop.timed_one();
                            }
                            lats.lock().unwrap().extend(mine);
                        });
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        let waited = Instant::now();
        while stop.timed.load(Ordering::Relaxed) == 0 && waited.elapsed() < FIRST_IO_PATIENCE {
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.stop.store(true, Ordering::Relaxed);
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut l = lats.into_inner().unwrap();
    l.sort_unstable();
    (l.len() as f64 / elapsed, l)
}

/// The block a job's `i`th request goes to: random, or, for a sequential
/// profile, the `i`th of its lane (lanes interleaved block by block).
fn block_at(p: &Profile, rng: &mut SmallRng, blocks: u64, lane: u64, lanes: u64, i: u64) -> u64 {
    if p.random {
        rng.gen_range(0..blocks)
    } else {
        (lane + i * lanes) % blocks
    }
}

/// One thread keeping `qd` requests in flight on the shards until
/// `stop`; each completion hands the thread its latency and buffer back.
fn shards_job(e: &Engine, p: &Profile, data: Data, size: u64, job: usize, stop: &Run) -> Vec<u32> {
    let (tx, rx) = mpsc::channel::<(u32, AlignedBuf)>();
    let mut rng = SmallRng::seed_from_u64(job as u64 + 177);
    let blocks = size / p.bs as u64;
    let mut spare: Vec<AlignedBuf> = Vec::new();
    let mut lats = Vec::new();
    let mut in_flight = 0;
    let mut i = 0u64;
    loop {
        while in_flight < p.qd && !stop.stopped() {
            let b = block_at(p, &mut rng, blocks, job as u64, p.jobs as u64, i);
            i += 1;
            let (off, tx, t0) = (b * p.bs as u64, tx.clone(), Instant::now());
            let done = Box::new(move |r: Result<AlignedBuf, ArrayError>| {
                let b = r.expect("array I/O");
                let took = t0.elapsed().as_micros().min(u32::MAX as u128) as u32;
                let _ = tx.send((took, b));
            });
            let mut buf = spare.pop().unwrap_or_else(|| AlignedBuf::new(p.bs));
            if p.write {
                data.fill(&mut rng, &mut buf);
                e.write(off, buf, done);
            } else {
                e.read(off, buf, done);
            }
            in_flight += 1;
        }
        if in_flight == 0 {
            return lats;
        }
        let (lat, buf) = rx.recv().expect("a completion");
        in_flight -= 1;
        if !stop.stopped() {
            lats.push(lat);
            stop.timed_one();
        }
        spare.push(buf);
    }
}

/// One NBD connection keeping `qd` requests in flight until `stop`.
fn nbd_job(
    sock: &Path,
    name: &str,
    p: &Profile,
    data: Data,
    size: u64,
    job: usize,
    stop: &Run,
) -> Vec<u32> {
    let mut c = nbd_connect(sock, name).expect("NBD connect");
    let mut reader = c.try_clone().unwrap();
    let (credit_tx, credit_rx) = mpsc::sync_channel::<()>(p.qd);
    for _ in 0..p.qd {
        credit_tx.send(()).unwrap();
    }
    let started: Arc<Mutex<std::collections::HashMap<u64, Instant>>> = Default::default();
    let sent = AtomicU64::new(0);
    let done_sending = AtomicBool::new(false);
    let mut lats = Vec::new();
    std::thread::scope(|sc| {
        let (started2, sent2, done2) = (started.clone(), &sent, &done_sending);
        let receiver = sc.spawn(move || {
            let mut l = Vec::new();
            let mut got = 0u64;
            let mut sink = vec![0u8; p.bs];
            loop {
                // Waits for a reply while checking whether one is still
                // owed: the last reply may arrive before the sender says it
                // is done, and a blocking read would then wait forever.
                loop {
                    if done2.load(Ordering::Acquire) && got == sent2.load(Ordering::Acquire) {
                        return l;
                    }
                    let mut pfd = libc::pollfd {
                        fd: std::os::fd::AsRawFd::as_raw_fd(&reader),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd for the duration of the call.
                    if unsafe { libc::poll(&mut pfd, 1, 50) } != 0 {
                        break;
                    }
                }
                let mut h = [0u8; 16];
                if reader.read_exact(&mut h).is_err() {
                    return l;
                }
                let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
                let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
                assert_eq!(err, 0, "NBD error {err}");
                if !p.write {
                    reader.read_exact(&mut sink).unwrap();
                }
                if let Some(t0) = started2.lock().unwrap().remove(&cookie) {
                    l.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    stop.timed_one();
                }
                got += 1;
                let _ = credit_tx.send(());
            }
        });
        let mut rng = SmallRng::seed_from_u64(job as u64 + 77);
        let mut buf = vec![0u8; p.bs];
        let blocks = size / p.bs as u64;
        let mut i = 0u64;
        while !stop.stopped() {
            if credit_rx.recv_timeout(Duration::from_millis(50)).is_err() {
                continue;
            }
            let b = block_at(p, &mut rng, blocks, job as u64, p.jobs as u64, i);
            i += 1;
            let mut r = nbd::REQUEST_MAGIC.to_be_bytes().to_vec();
            r.extend_from_slice(&0u16.to_be_bytes());
            r.extend_from_slice(
                &(if p.write {
                    nbd::CMD_WRITE
                } else {
                    nbd::CMD_READ
                })
                .to_be_bytes(),
            );
            r.extend_from_slice(&i.to_be_bytes());
            r.extend_from_slice(&(b * p.bs as u64).to_be_bytes());
            r.extend_from_slice(&(p.bs as u32).to_be_bytes());
            if p.write {
                data.fill(&mut rng, &mut buf);
                r.extend_from_slice(&buf);
            }
            started.lock().unwrap().insert(i, Instant::now());
            sent.fetch_add(1, Ordering::AcqRel);
            c.write_all(&r).unwrap();
        }
        done_sending.store(true, Ordering::Release);
        // Wake the receiver if it waits for nothing more.
        if sent.load(Ordering::Acquire) == 0 {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        lats = receiver.join().unwrap();
    });
    let _ = c.write_all(&{
        let mut r = nbd::REQUEST_MAGIC.to_be_bytes().to_vec();
        r.extend_from_slice(&0u16.to_be_bytes());
        r.extend_from_slice(&nbd::CMD_DISC.to_be_bytes());
        r.extend_from_slice(&[0u8; 20]);
        r
    });
    lats
}

fn nbd_connect(sock: &Path, name: &str) -> std::io::Result<UnixStream> {
    let mut c = UnixStream::connect(sock)?;
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello)?;
    c.write_all(&(nbd::FLAG_C_FIXED_NEWSTYLE | nbd::FLAG_C_NO_ZEROES).to_be_bytes())?;
    let mut o = nbd::IHAVEOPT.to_be_bytes().to_vec();
    o.extend_from_slice(&nbd::OPT_EXPORT_NAME.to_be_bytes());
    o.extend_from_slice(&(name.len() as u32).to_be_bytes());
    o.extend_from_slice(name.as_bytes());
    c.write_all(&o)?;
    let mut info = [0u8; 10];
    c.read_exact(&mut info)?;
    Ok(c)
}
