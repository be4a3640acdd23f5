//! A shard run by its caller, one turn at a time on the caller's thread:
//! for deterministic simulation (the method of FoundationDB and
//! TigerBeetle), where a seeded test decides when each member I/O
//! completes, when a member fails or the power goes, and so replays a run
//! exactly. The shard is the engine's own (`event_loop.rs`, `read.rs`,
//! `write.rs`); only who runs its loop, and its blocking work, differs.
//!
//! Its members should complete I/O through `Member::start_timed`, with
//! completions the caller fires itself (each one queues the I/O's end in
//! the shard's inbox; `turn` handles it), or through `Member::start_due`
//! with the I/O due as it starts (RAM: reaped at a later pass of the
//! turn; where the kernel's ring cannot wait for a time, as timed I/O at
//! the next turn); not with a later time (the simulated drive): that I/O
//! would complete by the wall clock, which no seed decides. Work the shard hands to the
//! blocking path waits in this value until `run_blocking` runs it.

use super::event_loop::{Shard, RING};
use super::{blocking_work, Blocking, Counts, Done, Fallback, Inbox, Job, ReadDone, ReadJob};
use super::{Request, WriteDone, WriteJob};
use crate::array::Array;
use crate::buf::AlignedBuf;
use crossbeam_channel as channel;
use io_uring::IoUring;
use std::sync::Arc;

/// A shard its caller runs (see the module's doc).
pub struct Stepped {
    shard: Shard,
    array: Arc<Array>,
    fallback: channel::Receiver<Fallback>,
    finisher: channel::Receiver<Fallback>,
    /// The flushes after writes with FUA that ran on the blocking path
    /// (`Blocking::flushed_after`); the caller's own flushes it runs
    /// itself.
    flusher: channel::Receiver<Done>,
}

impl Stepped {
    /// A shard over `array` (it makes an io_uring, which members with
    /// timed I/O leave unused).
    pub fn new(array: Arc<Array>) -> std::io::Result<Stepped> {
        let inbox = Arc::new(Inbox::new()?);
        let ring = IoUring::new(RING + 1)?;
        let (fallback, frx) = channel::unbounded();
        let (finisher, fin_rx) = channel::unbounded();
        let (flusher, flush_rx) = channel::unbounded();
        let blocking = Blocking {
            fallback,
            // The simulation runs the fallback requests itself.
            pool: None,
            finisher,
            flusher,
            counts: Arc::new(Counts::default()),
        };
        let mut shard = Shard::new(array.clone(), 0, Arc::new(vec![inbox]), ring, blocking);
        shard.caller_turns = true;
        Ok(Stepped {
            shard,
            array,
            fallback: frx,
            finisher: fin_rx,
            flusher: flush_rx,
        })
    }

    /// Queues a read, as `Engine::read` (it starts at the next `turn`).
    pub fn read(&self, offset: u64, buf: AlignedBuf, done: ReadDone) {
        let job = ReadJob { offset, buf, done };
        self.shard.inbox.push(Job::Request(Request::Read(job)));
    }

    /// Queues a write, as `Engine::write` (it starts at the next `turn`).
    pub fn write(&self, offset: u64, data: AlignedBuf, done: WriteDone) {
        let job = WriteJob::new(offset, data, false, done);
        self.shard.inbox.push(Job::Request(Request::Write(job)));
    }

    /// Queues a write with FUA, as `Engine::write_fua`.
    pub fn write_fua(&self, offset: u64, data: AlignedBuf, done: WriteDone) {
        let job = WriteJob::new(offset, data, true, done);
        self.shard.inbox.push(Job::Request(Request::Write(job)));
    }

    /// Runs front end `c` on this shard (`Engine::run_client`), from the
    /// next `turn`.
    pub fn run_client(&self, c: Box<dyn super::Client>) {
        self.shard.inbox.push(Job::Client(c));
    }

    /// Runs the shard's loop until nothing moves, without waiting: the
    /// inbox's requests and completions, then what they start (a client
    /// that gives requests in pass after pass, as fast as they complete,
    /// ends it after 64 such passes, `CALLER_PASSES`: turn again). The
    /// caller's thread counts as the shard's meanwhile, so its clients'
    /// completions run in the turn; those of requests run by
    /// `run_blocking` wait for the next one.
    pub fn turn(&mut self) {
        let inbox = self.shard.inbox.clone();
        super::client::on_shard(&inbox, || self.shard.turn());
    }

    /// Whether requests are in flight on the shard (not counting those
    /// handed to the blocking path).
    pub fn busy(&self) -> bool {
        self.shard.busy()
    }

    /// Requests served so far, by path.
    pub fn counts(&self) -> &Counts {
        &self.shard.blocking.counts
    }

    /// Requests handed to the blocking path and not yet run.
    pub fn blocking_queued(&self) -> usize {
        self.fallback.len() + self.finisher.len() + self.flusher.len()
    }

    /// Writes whose member writes erred, handed to the blocking path to
    /// be ended and not yet run (`blocking_queued` counts them too).
    pub fn finishing_queued(&self) -> usize {
        self.finisher.len()
    }

    /// Runs one write whose member writes erred (failing the member, then
    /// ending the write), if there is one: it waits for no stripe lock
    /// (it holds its own) and no journaled write, only for writes without
    /// a record whose member I/O is in flight. So, unlike `run_blocking`,
    /// it may run while the shard is busy with writes waiting for the
    /// journal (for its group, or for room in its ring that only this
    /// write's end can free), as long as no member I/O is in flight.
    pub fn run_finishing(&mut self) -> bool {
        let f = self.finisher.try_recv().ok();
        self.run(f)
    }

    /// Runs one request the shard handed to the blocking path on this
    /// thread, writes whose member writes erred first (a blocking write
    /// may wait for the stripe lock one of them holds); false if there was
    /// none. It may wait for a stripe lock or for writers in flight: call
    /// it when the shard is not busy.
    pub fn run_blocking(&mut self) -> bool {
        let f = self
            .finisher
            .try_recv()
            .or_else(|_| self.fallback.try_recv());
        if let Ok(f) = f {
            return self.run(Some(f));
        }
        // Then a flush after writes with FUA, as the flushing thread's.
        match self.flusher.try_recv() {
            Ok(first) => {
                super::flush_for(&self.array, first, &self.flusher);
                true
            }
            Err(_) => false,
        }
    }

    /// Runs `f` on this thread, as the engine's blocking threads would;
    /// whether there was one.
    fn run(&self, f: Option<Fallback>) -> bool {
        f.map(|f| blocking_work(&self.array, f)).is_some()
    }
}
