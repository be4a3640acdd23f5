//! The asynchronous data path's first pieces (`docs/architecture.md`,
//! "shards and completions"): reads and writes answered through a
//! completion, many in flight per thread, on shards that each run an event
//! loop over their own io_uring (`event_loop.rs`).
//!
//! A read whose chunks all have a readable copy is served by a shard
//! without a thread waiting for it (`read.rs`): a member read per chunk,
//! on a member with a file descriptor a read SQE on the shard's ring, on
//! a member that says when an I/O completes (`Member::start_due`: the
//! simulated drive) started and reaped by the shard itself when that time
//! comes, on one that completes I/O at a time of its own otherwise
//! (`Member::start_timed`: RAM, as it starts; a wrapper over the simulated
//! drive, from the drives' timer thread) started and its completion posted
//! back to the shard. A RAID5/6 read inside one
//! stripe with a chunk that has no readable member is served there too:
//! the stripe's other chunks read under its lock, the missing one
//! recovered on the shard's thread (`array::degraded_read`). So is a
//! mirror read of chunks an unclean stop may have torn, while the resync
//! owed has not passed them: every copy read, and the read answered where
//! they agree (`array::copies_read`). A read whose
//! chunks are all on members in memory skips the shard: it is a copy that
//! waits for no device, so it runs in the caller's thread (`inline.rs`);
//! so does a small write there that need not wait for anything, by the
//! same state machine the shards run (below), under the same stripe lock.
//!
//! A write inside one RAID5/6 stripe (or one RAID0/1/10 chunk) whose
//! members are all readable is a state machine the stripe's shard runs
//! (`write.rs`, the rules in `array::async_write`): its reads, then its
//! parity, then its writes, each step's member I/Os in flight together
//! and no thread waiting. Writes that arrive for a stripe whose lock one
//! of the shard's writes holds wait behind it and start when it ends
//! (writes in flight together have no order among them, as on a drive).
//! A write to a RAID5/6 stripe with a chunk missing runs there too where
//! it needs no chunk recovered: between its parity and its writes, its
//! journal record is queued for the journal's next group, and the shard
//! goes on serving others until the group's leader (the journal's
//! committer threads, or a blocking writer) posts back that it is durable.
//!
//! A RAID5/6 write across two stripes that covers neither whole, on an array
//! with no member failed, missing or being rebuilt, is cut into a write per
//! stripe, each run by its stripe's shard (`split.rs`).
//!
//! Every other request (degraded writes that would recover a chunk, whose
//! members are in memory, or whose record the journal refuses for other than
//! room: a settle due, too large for the ring; degraded reads across stripes,
//! RAID5/6 writes across stripes that cover one whole (any, with a member out
//! or on members in memory), a RAID0/1/10 write across chunks that meets one
//! of them held, writes of more than 256 member writes, reads of more than
//! 256 member reads, on a member that can do neither, one whose member erred,
//! one that would have to wait for a lock, a bitmap write, a journal record
//! or the first write since clean) goes to a small pool of threads running
//! the blocking `Array::read` / `Array::write`, so each rule of those paths
//! (reconstruction, the journal, failing a member, membership changes) stays
//! in one place. A shard's write whose member writes erred is ended by the
//! engine's finishing thread (failing a member may wait for writers in
//! flight, which the shards must go on serving).
//!
//! A slot being hot-replaced holds a pair of devices: the shards run its
//! reads on the old device and its writes on both at once (`pair.rs`).
//!
//! Rebuild and scrub still run on the blocking engine; the stripe lock
//! table keeps both engines' writers and them apart (a shard takes a
//! lock only if its slot in the table is free; held by another thread,
//! the write goes to the blocking path, which waits for it).

mod blocking_work;
mod client;
mod event_loop;
mod inbox;
mod inline;
mod merge;
mod ops;
mod pair;
mod pool;
mod read;
mod split;
mod stepped;
mod write;

use blocking_work::{blocking_work, fallback_loop, flush_for, flusher_loop, run_blocking};
pub use client::{Client, Home, Local};
pub use stepped::Stepped;

use crate::array::async_write::AsyncWrite;
use crate::array::{Array, ArrayError, LocalArray};
use crate::buf::AlignedBuf;
use crate::member::MemberRef;
use crate::stats::StripedCounter;
use crossbeam_channel as channel;
use event_loop::Shard;
use inbox::Inbox;
use io_uring::IoUring;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What a read hands back: its buffer, filled, or why it failed.
pub type ReadResult = std::result::Result<AlignedBuf, ArrayError>;
/// What a write hands back: its buffer (for the caller's next request),
/// or why it failed.
pub type WriteResult = std::result::Result<AlignedBuf, ArrayError>;
/// Called once when a read completes, on a shard's thread, a fallback
/// thread, or (a read copied from members in memory, `inline.rs`) the
/// caller's own thread before `Engine::read` returns: it should hand the
/// result on and return, not block, and must not drop the last handle to
/// the `Engine` (its drop joins that thread). Nor should it issue the next
/// read itself: copied inline, that read's completion would run inside
/// this one, a recursion as deep as the chain.
pub type ReadDone = Box<dyn FnOnce(ReadResult) + Send>;
/// Called once when a write completes; as `ReadDone`.
pub type WriteDone = Box<dyn FnOnce(WriteResult) + Send>;
/// Called once when a flush or a zeroing completes; as `ReadDone`.
pub type Done = Box<dyn FnOnce(std::result::Result<(), ArrayError>) + Send>;

/// Threads running requests the shards do not serve themselves, where
/// the shards serve every member: what is left (a member that erred, a
/// stripe another thread holds) is the exception, except RAID5/6 writes
/// that cover a whole stripe and writes across stripes while a member is
/// out, which this pool's threads carry one each. Sixteen rather than
/// eight (the large I/O bench, 8 simulated drives, two rounds): 1 MiB
/// random writes 1.07-1.13x on RAID5 and 1.03-1.10x on RAID6, with a
/// drive missing 1.15-1.19x and 1.20-1.27x; RAID5 128 KiB writes with a
/// drive missing 0.91-0.98x at depth 32 and 0.84-0.93x at 128 (their p99
/// 118-123 to 66-80 ms), RAID6's 1.03-1.08x (`docs/benchmarks.md`).
const FALLBACK_THREADS: usize = 16;

/// The fallback pool's threads for `shards` shards over `array`: where
/// every request runs there (no io_uring), or every request to a member
/// the shards cannot serve (one that takes neither io_uring nor timed I/O:
/// a network member), each thread waits for a member's latency with one
/// request, so the pool is the array's queue depth
/// (`threads_waiting_on_devices`). The size it starts at: a member the
/// shards cannot serve that joins later (a hot replace's pair that they
/// cannot serve, `pair.rs`, or a rebuild onto a network member) grows
/// the pool while it keeps every thread busy (`pool.rs`).
fn fallback_threads(array: &Array, shards: usize) -> usize {
    if shards > 0 && array.every_member(event_loop::non_blocking) {
        return FALLBACK_THREADS;
    }
    threads_waiting_on_devices()
}

/// Threads for a front end or pool where each holds one request while a
/// device serves it, so that their number is the queue depth: 8 per
/// core, 64 to 128 (on the VM's disk 64 served up to 1.5-1.9x of 8 or 16,
/// `docs/benchmarks.md`). The engine's blocking pool without shards, the
/// most that pool grows to beside shards (`pool.rs`), and the FUSE export
/// over devices all take it.
pub fn threads_waiting_on_devices() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (8 * cores).clamp(64, 128)
}

/// How many requests the shards served themselves, and how many they sent
/// to the blocking path: counters striped per thread (`stats::StripedCounter`),
/// as both shards count every request.
#[derive(Default, Debug)]
pub struct Counts {
    pub on_shards: StripedCounter,
    /// Reads served on the shards that recovered a chunk (counted in
    /// `on_shards` too).
    pub degraded_on_shards: StripedCounter,
    /// Reads copied from members in memory in the caller's thread
    /// (`inline.rs`), not counted in `on_shards`.
    pub inline: StripedCounter,
    /// Writes to members in memory run in the caller's thread
    /// (`inline.rs`), not counted in `writes_on_shards`.
    pub writes_inline: StripedCounter,
    pub blocking: StripedCounter,
    pub writes_on_shards: StripedCounter,
    pub writes_blocking: StripedCounter,
    /// Writes that waited for their stripe and were merged into the
    /// write of another (`merge.rs`): each merged write counts once above.
    pub writes_merged: StripedCounter,
    /// The parts beyond the first of RAID5/6 writes across stripes cut
    /// into a write per stripe (`split.rs`): each part counts once above,
    /// as a write on the shards, on the blocking path or merged; client
    /// writes are those plus `writes_merged` minus these.
    pub writes_split: StripedCounter,
    /// Shard (or inline) writes whose member writes erred, ended on a
    /// blocking thread (counted in `writes_on_shards` or `writes_inline`
    /// too).
    pub write_errors: StripedCounter,
    /// Times a degraded write waited on its shard for room in the
    /// journal's ring.
    pub journal_waits: StripedCounter,
    /// Writes asked for with FUA that ended on the shards, written there
    /// with FUA (counted in `writes_on_shards` too); the others ran on the
    /// blocking path, then a flush of the array.
    pub fua_on_shards: StripedCounter,
}

/// Shards serving one array's reads and writes.
pub struct Engine {
    array: Arc<Array>,
    /// The array for the requests callers' threads copy in place
    /// (`inline.rs`), one handle all those threads share; each shard
    /// keeps its own.
    local: LocalArray,
    counts: Arc<Counts>,
    shards: Vec<Arc<Inbox>>,
    /// The finishing thread and the flushing thread, then the shards'.
    threads: Vec<std::thread::JoinHandle<()>>,
    /// The blocking threads that run requests (`pool.rs`).
    pool: Arc<pool::Pool>,
    /// The blocking threads' channels (the shards hold clones): dropped
    /// once the shards stopped, which ends those threads.
    blocking: Option<Blocking>,
}

struct ReadJob {
    offset: u64,
    buf: AlignedBuf,
    done: ReadDone,
}

struct WriteJob {
    offset: u64,
    data: AlignedBuf,
    done: WriteDone,
    /// Not counted in the array's client statistics where it runs: one
    /// stripe's part of a client's write cut by `split.rs`, which counts
    /// that write once, or a merged write holding such a part, whose
    /// completion counts the client writes merged (`merge.rs`).
    part: bool,
    /// Durable when `done` is told it succeeded (`Engine::write_fua`).
    fua: bool,
}

impl WriteJob {
    /// A client's write (not a part), with FUA or not.
    fn new(offset: u64, data: AlignedBuf, fua: bool, done: WriteDone) -> WriteJob {
        WriteJob {
            offset,
            data,
            done,
            part: false,
            fua,
        }
    }
}

enum Request {
    Read(ReadJob),
    Write(WriteJob),
}

/// Work for the blocking threads. `failed`: members that erred on the
/// shard's attempt, to be failed first.
enum Fallback {
    Read {
        job: ReadJob,
        failed: Option<(usize, MemberRef, std::io::Error)>,
    },
    Write {
        job: WriteJob,
        failed: Vec<(usize, MemberRef, std::io::Error)>,
    },
    /// `Array::write_zeroes`.
    Zeroes { offset: u64, len: u64, done: Done },
    /// A shard's write whose member writes erred (`AsyncWrite::finish`).
    Finish {
        w: Box<AsyncWrite>,
        results: Vec<std::io::Result<()>>,
        done: WriteDone,
    },
}

enum Job {
    Request(Request),
    /// A timed member I/O (its ring user_data) completed: None, all its
    /// bytes moved; or an error as a ring reports it (-errno).
    Timed(u64, Option<i32>),
    /// The journal record of the write with this slab key is durable
    /// (true) or was given up (`AsyncWrite::journal`).
    Journaled(usize, bool),
    /// The journal may have room for the record of the write with this
    /// slab key, which found none (`NotQueued::Later`).
    Room(usize),
    /// A front end to run on the shard (`Engine::run_client`).
    Client(Box<dyn Client>),
    /// The completion of one of its clients' requests, which completed on
    /// another thread (`client.rs`).
    Call(Box<dyn FnOnce() + Send>),
    Stop,
}

/// Where the blocking work goes: the fallback pool, the thread that ends
/// erred writes (kept apart: a fallback write may wait for a stripe lock
/// that only an ended write gives up), and the thread that flushes (kept
/// apart so that flushes neither hold the pool's threads from degraded
/// I/O nor wait behind it, and so that flushes asked for together are
/// one flush).
#[derive(Clone)]
struct Blocking {
    fallback: channel::Sender<Fallback>,
    /// The threads taking `fallback`'s requests, grown where they wait
    /// (None in the deterministic simulation, which runs them itself).
    pool: Option<Arc<pool::Pool>>,
    finisher: channel::Sender<Fallback>,
    flusher: channel::Sender<Done>,
    counts: Arc<Counts>,
}

/// The answer to a request the engine can no longer take.
fn stopping() -> ArrayError {
    ArrayError::Invalid(
        "the array's I/O engine is stopping: send the request again once the array is served again"
            .into(),
    )
}

impl Blocking {
    /// `done` for a write asked for with FUA that does not run on a shard
    /// with FUA writes (or whose member writes erred there): told it
    /// succeeded only once the array is flushed after it, by the flushing
    /// thread, one flush for every flush and such write queued meanwhile.
    /// A flush of the array covers every write completed before it, and a
    /// write that skipped a missing member, or failed one, is durable only
    /// once that failure is, which `Array::flush` waits for.
    fn flushed_after(&self, done: WriteDone) -> WriteDone {
        let flusher = self.flusher.clone();
        Box::new(move |r| match r {
            Ok(data) => {
                let then: Done = Box::new(move |f| answer(done, f.map(|()| data)));
                if let Err(channel::SendError(then)) = flusher.send(then) {
                    answer(then, Err(stopping()));
                }
            }
            Err(e) => answer(done, Err(e)),
        })
    }

    fn send(&self, f: Fallback) {
        let f = match f {
            Fallback::Write { mut job, failed } if job.fua => {
                job.fua = false;
                let done = std::mem::replace(&mut job.done, Box::new(|_| {}));
                job.done = self.flushed_after(done);
                Fallback::Write { job, failed }
            }
            f => f,
        };
        let c = &self.counts;
        let (to_pool, counters): (_, &[&StripedCounter]) = match &f {
            Fallback::Read { .. } => (true, &[&c.blocking]),
            Fallback::Write { .. } => (true, &[&c.writes_blocking]),
            Fallback::Zeroes { .. } => (true, &[]),
            // Counted where it ran too (a shard's, or inline).
            Fallback::Finish { .. } => (false, &[&c.write_errors]),
        };
        let to = if to_pool {
            &self.fallback
        } else {
            &self.finisher
        };
        for n in counters {
            n.fetch_add(1, Ordering::Relaxed);
        }
        match to.send(f) {
            Ok(()) if to_pool => {
                if let Some(p) = &self.pool {
                    p.grow();
                }
            }
            Ok(()) => {}
            Err(channel::SendError(f)) => match f {
                Fallback::Read { job, .. } => answer(job.done, Err(stopping())),
                Fallback::Write { job, .. } => answer(job.done, Err(stopping())),
                Fallback::Zeroes { done, .. } => answer(done, Err(stopping())),
                // Only if the finisher thread is gone (a bug): the write
                // keeps its stripe's lock for good rather than give it up
                // with the member that erred not yet failed.
                Fallback::Finish { w, done, .. } => {
                    tracing::error!("shard: no thread to end an erred write");
                    std::mem::forget(w);
                    answer(done, Err(stopping()))
                }
            },
        }
    }
}

impl Engine {
    /// Starts `shards` shards (at least one where io_uring can be had)
    /// and the blocking threads. Where the kernel (or a seccomp policy)
    /// refuses io_uring, or RAID_NO_URING=1 says not to use it, no shard
    /// starts and every request runs on the blocking threads: the same
    /// answers, through the same completions, without the shards' speed.
    /// A ring refused after the first (a limit on locked memory or on
    /// rings) leaves the engine with the shards it has.
    pub fn start(array: Arc<Array>, shards: usize) -> std::io::Result<Engine> {
        let shards = match crate::member::io_path() {
            crate::member::IoPath::IoUring => shards.max(1),
            crate::member::IoPath::PreadPwrite => 0,
        };
        // Every shard's eventfd and ring first, so that a refusal leaves
        // nothing started.
        let mut parts = Vec::new();
        let mut refused = None;
        for _ in 0..shards {
            let inbox = Arc::new(Inbox::new()?);
            match IoUring::new(event_loop::RING + 1) {
                Ok(ring) => parts.push((inbox, ring)),
                Err(e) if parts.is_empty() => {
                    refused = Some(e);
                    break;
                }
                Err(e) => {
                    tracing::warn!(
                        "array I/O engine: {} shards of {shards} (the next ring was refused: {e}); raise the locked-memory limit (ulimit -l) or ask for fewer shards (RAIDCTL_SHARDS)",
                        parts.len()
                    );
                    break;
                }
            }
        }
        // Many receivers on one queue, each taking the next message
        // itself (std's channel needs a lock around its receiver, which
        // passes every message from one waiting thread to the next).
        let (fallback, frx) = channel::unbounded::<Fallback>();
        let (finisher, fin_rx) = channel::unbounded::<Fallback>();
        let (flusher, flush_rx) = channel::unbounded::<Done>();
        let counts = Arc::new(Counts::default());
        let threads = fallback_threads(&array, parts.len());
        let pool = pool::Pool::new(array.clone(), frx, threads_waiting_on_devices());
        // The engine holds the only senders from here: on an error below,
        // its drop ends every thread that started.
        let mut engine = Engine {
            array: array.clone(),
            local: LocalArray::new(&array),
            counts: counts.clone(),
            shards: Vec::new(),
            threads: Vec::new(),
            pool: pool.clone(),
            blocking: Some(Blocking {
                fallback,
                pool: Some(pool),
                finisher,
                flusher,
                counts,
            }),
        };
        for _ in 0..threads {
            engine.pool.add()?;
        }
        match (parts.is_empty(), refused) {
            (false, _) => {}
            (true, None) => tracing::info!(
                "array I/O engine: no io_uring; every request runs on {threads} blocking threads"
            ),
            (true, Some(e)) => tracing::warn!(
                "array I/O engine: no io_uring ({e}); every request runs on {threads} blocking threads. To use the shards, allow io_uring (sysctl kernel.io_uring_disabled=0, the container's seccomp policy) or raise the locked-memory limit (ulimit -l); RAID_NO_URING=1 chooses this path on purpose"
            ),
        }
        let a = array.clone();
        engine.threads.push(
            std::thread::Builder::new()
                .name("write-finisher".into())
                .spawn(move || fallback_loop(&a, &fin_rx))?,
        );
        let a = array.clone();
        engine.threads.push(
            std::thread::Builder::new()
                .name("flusher".into())
                .spawn(move || flusher_loop(&a, &flush_rx))?,
        );
        let peers: client::Peers = Arc::new(parts.iter().map(|(inbox, _)| inbox.clone()).collect());
        for (i, (inbox, ring)) in parts.into_iter().enumerate() {
            let blocking = engine.blocking.clone().expect("set above");
            let shard = Shard::new(array.clone(), i, peers.clone(), ring, blocking);
            // On an error here, dropping `engine` stops what started.
            engine.threads.push(
                std::thread::Builder::new()
                    .name(format!("shard-{i}"))
                    .spawn(move || shard.run())?,
            );
            engine.shards.push(inbox);
        }
        Ok(engine)
    }

    /// Threads in the fallback pool now (it grows where a member the
    /// shards cannot serve keeps them busy: `pool.rs`).
    pub fn fallback_threads(&self) -> usize {
        self.pool.threads()
    }

    /// Requests served so far, by path.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Shards it runs: 0 where io_uring was refused (every request then
    /// runs on the blocking threads).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// How it serves requests, for a status line: its shards, or the
    /// blocking threads that run every request where it has none.
    pub fn describe(&self) -> String {
        match self.shards.len() {
            0 => format!("no io_uring: {} blocking threads", self.fallback_threads()),
            1 => "1 shard".into(),
            n => format!("{n} shards"),
        }
    }

    /// Reads `buf.len()` bytes at `offset` (4 KiB aligned, inside the
    /// array) into `buf`; `done` gets it back filled, or the error. The
    /// caller's buffers go round (no allocation per request: one of 128
    /// KiB or more is a fresh mapping of memory each time). Returns at once,
    /// except that a read copied from members in memory (`inline.rs`) is
    /// copied and answered first.
    pub fn read(&self, offset: u64, buf: AlignedBuf, done: ReadDone) {
        self.batch().read(offset, buf, done)
    }

    /// Writes `data` at `offset` (4 KiB aligned, inside the array); `done`
    /// gets the outcome, with the same meaning as `Array::write`'s (Ok once
    /// every member that is to hold it took it; durable after a `flush`),
    /// and on Ok the buffer back. Returns at once, except that a small
    /// write to members in memory (`inline.rs`) is run and answered first.
    pub fn write(&self, offset: u64, data: AlignedBuf, done: WriteDone) {
        self.batch().write(offset, data, done)
    }

    /// `write`, durable when `done` hears it succeeded (an NBD client's
    /// FUA write). A write the shards run (inside one RAID5/6 stripe, or
    /// cut into one per stripe; RAID0/1/10 chunks) that finds every member
    /// of its stripe in sync is written with FUA on the members it writes
    /// (`RWF_DSYNC`, or the member's own FUA write), with no flush of the
    /// array; one that skips a missing member runs as `write` does, then
    /// the array is flushed (which waits for that member's failure to be
    /// durable); any other runs on the blocking path, then the array is
    /// flushed. Flushes after writes are joined with the flushes asked for
    /// meanwhile, one flush for them all.
    pub fn write_fua(&self, offset: u64, data: AlignedBuf, done: WriteDone) {
        self.batch().write_fua(offset, data, done)
    }

    /// Requests given through the batch wake a sleeping shard once, when
    /// the batch is dropped, not once each: for a front end with several
    /// requests at hand (what one read of its socket brought). Drop it
    /// before waiting for anything, and after a few requests: until then,
    /// a shard it owes a wake-up sleeps on the requests of every caller
    /// (and of a batch that is leaked, until the engine is dropped).
    #[must_use = "the wake-ups it owes are rung when it is dropped"]
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            engine: self,
            owed: Vec::new(),
        }
    }

    fn read_in(&self, owed: &mut Vec<usize>, offset: u64, buf: AlignedBuf, done: ReadDone) {
        let chunk = offset / self.array.geometry().chunk;
        let (buf, done) = match self.read_inline(offset, buf, done) {
            Ok(()) => return,
            Err(back) => back,
        };
        let job = ReadJob { offset, buf, done };
        match self.shard_of(chunk) {
            Some(i) => self.push(owed, i, Request::Read(job)),
            None => self.blocking(Fallback::Read { job, failed: None }),
        }
    }

    fn write_in(
        &self,
        owed: &mut Vec<usize>,
        offset: u64,
        data: AlignedBuf,
        fua: bool,
        done: WriteDone,
    ) {
        // A small write to members in memory runs here, under its
        // stripe's lock (one that finds it held goes to the shard, and a
        // shard's write that finds it held by this thread goes to the
        // blocking path, which waits for it). Not one with FUA: the
        // shard writes that.
        let (data, done) = match fua {
            true => (data, done),
            false => match self.write_inline(offset, data, done) {
                Ok(()) => return,
                Err(back) => back,
            },
        };
        // A RAID5/6 stripe's writes go to one shard, which holds its lock
        // for each in turn and queues the others behind it; other levels
        // spread by chunk. A RAID5/6 write across stripes goes to its
        // first stripe's shard, which cuts it where
        // `Array::split_on_shards` allows (`split.rs`), else hands it to
        // the blocking path.
        let job = WriteJob::new(offset, data, fua, done);
        match client::write_owner(&self.array, offset, self.shards.len()) {
            Some(i) => self.push(owed, i, Request::Write(job)),
            None => self.blocking(Fallback::Write {
                job,
                failed: Vec::new(),
            }),
        }
    }

    /// Runs front end `c` on shard `shard`'s thread (`client.rs`), from
    /// that shard's next turn until its poll says it is finished or the
    /// engine stops; gives it back where there is no such shard (none
    /// where io_uring was refused: its caller then gives its requests
    /// through `read` and `write`).
    pub fn run_client(
        &self,
        shard: usize,
        c: Box<dyn Client>,
    ) -> std::result::Result<(), Box<dyn Client>> {
        match self.shards.get(shard) {
            Some(inbox) => {
                inbox.push(Job::Client(c));
                Ok(())
            }
            None => Err(c),
        }
    }

    /// Gives shard `i` a request; a wake-up it needs is owed in `owed`.
    fn push(&self, owed: &mut Vec<usize>, i: usize, r: Request) {
        if self.shards[i].push_quietly(Job::Request(r)) && !owed.contains(&i) {
            owed.push(i);
        }
    }

    /// `Array::flush` on the engine's flushing thread: `done` gets its
    /// outcome. It covers every write whose completion ran before this
    /// call; flushes asked for while one runs are answered by the next,
    /// one flush for all of them.
    pub fn flush(&self, done: Done) {
        let b = self.blocking.as_ref().expect("set until drop");
        if let Err(channel::SendError(done)) = b.flusher.send(done) {
            answer(done, Err(stopping()));
        }
    }

    /// `Array::write_zeroes` on a blocking thread: `done` gets its outcome.
    pub fn write_zeroes(&self, offset: u64, len: u64, done: Done) {
        self.blocking(Fallback::Zeroes { offset, len, done });
    }

    /// The shard that owns `key`; none where io_uring was refused.
    fn shard_of(&self, key: u64) -> Option<usize> {
        owner(key, self.shards.len())
    }

    fn blocking(&self, f: Fallback) {
        self.blocking.as_ref().expect("set until drop").send(f);
    }
}

/// The shard of `shards` that owns `key` (a chunk, or the stripe or chunk
/// a write locks); none where there is no shard.
fn owner(key: u64, shards: usize) -> Option<usize> {
    (shards > 0).then(|| (key % shards as u64) as usize)
}

/// Requests given to the engine whose wake-ups wait for the batch's end
/// (`Engine::batch`).
#[must_use = "the wake-ups it owes are rung when it is dropped"]
pub struct Batch<'a> {
    engine: &'a Engine,
    /// Shards that slept when given a request, and are owed a wake-up.
    owed: Vec<usize>,
}

impl Batch<'_> {
    /// Whether it owes no shard a wake-up.
    pub fn is_empty(&self) -> bool {
        self.owed.is_empty()
    }

    /// `Engine::read`, its wake-up put off to the batch's end.
    pub fn read(&mut self, offset: u64, buf: AlignedBuf, done: ReadDone) {
        self.engine.read_in(&mut self.owed, offset, buf, done)
    }

    /// `Engine::write`, its wake-up put off to the batch's end.
    pub fn write(&mut self, offset: u64, data: AlignedBuf, done: WriteDone) {
        self.engine
            .write_in(&mut self.owed, offset, data, false, done)
    }

    /// `Engine::write_fua`, its wake-up put off to the batch's end.
    pub fn write_fua(&mut self, offset: u64, data: AlignedBuf, done: WriteDone) {
        self.engine
            .write_in(&mut self.owed, offset, data, true, done)
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        for &i in &self.owed {
            self.engine.shards[i].ring_bell();
        }
    }
}

impl Drop for Engine {
    /// Stops the shards once the requests they hold completed, then the
    /// blocking threads once theirs did.
    fn drop(&mut self) {
        for s in &self.shards {
            s.push(Job::Stop);
            // Unconditionally: a shard owed a wake-up by a batch that was
            // leaked would otherwise never see its Stop (a spurious
            // wake-up costs nothing).
            s.ring_bell();
        }
        let n = self.threads.len();
        // The finisher and the flusher first (a start that failed among
        // them started no shard).
        let shard_threads: Vec<_> = self.threads.drain(2.min(n)..n).collect();
        for t in shard_threads {
            let _ = t.join();
        }
        // The shards held the other senders, but for the flushing
        // thread's held by writes with FUA that the blocking threads
        // still run (`Blocking::flushed_after`): its join waits until
        // those are sent (the blocking threads go on meanwhile).
        drop(self.blocking.take());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.pool.join();
    }
}

/// Runs a caller's `done`: a panic in it is the caller's, and must not
/// unwind through a shard (whose ring may hold I/Os into its buffers) or
/// end a blocking thread.
fn answer<T>(done: Box<dyn FnOnce(T) + Send>, r: T) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(r))).is_err() {
        tracing::error!("shard: a request's completion callback panicked");
    }
}

/// Runs a client's completion posted to its shard (`Job::Call`): as
/// `answer`, a panic in it is logged, not unwound.
fn call(f: Box<dyn FnOnce() + Send>) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!("shard: a request's completion callback panicked");
    }
}
