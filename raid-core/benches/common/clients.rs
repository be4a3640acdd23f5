//! Load given by front ends on the shards' own threads
//! (`raid_core::shard::Client`), as the benches give it from a thread of
//! their own: 4 KiB I/Os kept in flight, each timed.

use raid_core::buf::AlignedBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: u64 = 4096;

/// A front end on a shard's thread (`shard::Client`): keeps `depth` 4 KiB
/// I/Os in flight at random blocks until `until`, each timed from when it
/// was given to its completion (on the same thread); once the last came
/// back, sends their latencies and the seconds it gave I/Os for.
struct Load {
    write: bool,
    at: super::Blocks,
    depth: usize,
    until: Instant,
    began: Option<Instant>,
    given_for: f64,
    in_flight: usize,
    lat: Vec<u32>,
    /// Filled by the completions: each one's latency and its outcome (the
    /// buffer back). An error fails the bench in `poll` (a panic in a
    /// completion would be caught, and the I/O never counted back).
    came: Arc<std::sync::Mutex<Vec<(u32, raid_core::shard::ReadResult)>>>,
    spare: Vec<AlignedBuf>,
    out: std::sync::mpsc::Sender<(Vec<u32>, f64)>,
}

impl raid_core::shard::Client for Load {
    fn poll(&mut self, io: &mut raid_core::shard::Local<'_>) -> bool {
        let began = *self.began.get_or_insert_with(Instant::now);
        for (us, r) in self.came.lock().unwrap().drain(..) {
            self.in_flight -= 1;
            self.lat.push(us);
            self.spare.push(r.expect("an I/O of the bench"));
        }
        if Instant::now() < self.until {
            self.given_for = began.elapsed().as_secs_f64();
            while self.in_flight < self.depth {
                self.in_flight += 1;
                let off = self.at.next() * BS;
                let mut b = self
                    .spare
                    .pop()
                    .unwrap_or_else(|| AlignedBuf::new(BS as usize));
                let came = self.came.clone();
                let t0 = Instant::now();
                let done: raid_core::shard::ReadDone = Box::new(move |r| {
                    let took = t0.elapsed().as_micros().min(u32::MAX as u128) as u32;
                    came.lock().unwrap().push((took, r))
                });
                if self.write {
                    b[..8].copy_from_slice(&off.to_le_bytes());
                    io.write(off, b, done);
                } else {
                    io.read(off, b, done);
                }
            }
        } else if self.in_flight == 0 {
            let lat = std::mem::take(&mut self.lat);
            let _ = self.out.send((lat, self.given_for));
            return false;
        }
        true
    }
}

/// `qd` 4 KiB I/Os kept in flight for `dur` by front ends on the
/// engine's shards (one per shard, the depth split between them), as
/// a bench keeps them from a thread of its own; sequential ones each from
/// its own start, spread over the array. Returns each I/O's latency (us)
/// and the seconds they were given for.
pub fn on_shards(
    e: &raid_core::shard::Engine,
    write: bool,
    blocks: u64,
    qd: usize,
    dur: Duration,
    seq: bool,
) -> (Vec<u32>, f64) {
    let shards = e.shard_count().clamp(1, qd);
    let (tx, rx) = std::sync::mpsc::channel();
    let until = Instant::now() + dur;
    for i in 0..shards {
        let (depth, first) = super::share(qd, blocks, shards, i);
        let load = Load {
            write,
            at: super::Blocks::new((qd * 31 + i) as u64, first, blocks, seq),
            depth,
            until,
            began: None,
            given_for: 0.0,
            in_flight: 0,
            lat: Vec::with_capacity(1 << 20),
            came: Arc::default(),
            spare: Vec::new(),
            out: tx.clone(),
        };
        if e.run_client(i, Box::new(load)).is_err() {
            panic!("the engine has no shard {i}");
        }
    }
    drop(tx);
    let (mut lat, mut secs) = (Vec::new(), 0f64);
    let mut reports = 0;
    for (l, s) in rx.iter() {
        lat.extend(l);
        secs = secs.max(s);
        reports += 1;
    }
    // One that failed was dropped without a report (its panic logged).
    assert_eq!(reports, shards, "a front end on a shard failed");
    (lat, secs)
}
