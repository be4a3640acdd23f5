//! Front ends run on the shards' own threads (`shard::Client`): their
//! writes reach the shard that owns each stripe, whichever shard they run
//! on, their reads are served by their own shard, and what they read back
//! is what they wrote; a lone client's RAID5 writes and long reads to
//! members in memory use the shard it leaves idle; a client that panics is dropped and the
//! shard goes on; an engine stopped under a client that never finishes
//! stops.

use raid_core::array::{Array, ArrayError};
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{io_path, IoPath, MemberRef};
use raid_core::shard::{Client, Engine, Local};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

mod support;

const CHUNK: u64 = 64 << 10;
const DATA: u64 = 8 << 20;

/// A request a script gives, and what came of it.
struct Io {
    write: bool,
    offset: u64,
    buf: AlignedBuf,
}
type Outcome = (bool, u64, Result<AlignedBuf, ArrayError>);
/// An outcome, with the thread its completion ran on.
type Came = (std::thread::ThreadId, Outcome);

/// Gives its requests `depth` at a time, and sends each outcome to the
/// test's thread (with the shard it ran on, and whether its completion ran
/// on the client's own thread); finished once all came back.
struct Script {
    todo: VecDeque<Io>,
    depth: usize,
    in_flight: usize,
    /// Filled by the requests' completions, emptied by `poll`.
    came: Arc<Mutex<Vec<Came>>>,
    out: mpsc::Sender<Sent>,
}

/// What a script sends: its shard, whether the completion ran on its
/// thread, the outcome.
type Sent = (usize, bool, Outcome);

impl Script {
    fn new(todo: VecDeque<Io>, depth: usize, out: mpsc::Sender<Sent>) -> Box<Script> {
        Box::new(Script {
            todo,
            depth,
            in_flight: 0,
            came: Arc::default(),
            out,
        })
    }
}

impl Client for Script {
    fn poll(&mut self, io: &mut Local<'_>) -> bool {
        let here = std::thread::current().id();
        for (ran_on, o) in self.came.lock().unwrap().drain(..) {
            self.in_flight -= 1;
            let _ = self.out.send((io.shard(), ran_on == here, o));
        }
        while self.in_flight < self.depth {
            let Some(Io { write, offset, buf }) = self.todo.pop_front() else {
                break;
            };
            self.in_flight += 1;
            let came = self.came.clone();
            let done = Box::new(move |r| {
                let ran_on = std::thread::current().id();
                came.lock().unwrap().push((ran_on, (write, offset, r)))
            });
            match write {
                true => io.write(offset, buf, done),
                false => io.read(offset, buf, done),
            }
        }
        self.in_flight > 0 || !self.todo.is_empty()
    }
}

/// The 4 KiB block at `offset`, as written by client `c`.
fn block(c: u8, offset: u64) -> AlignedBuf {
    let mut b = AlignedBuf::new(4096);
    b.fill(c);
    b[..8].copy_from_slice(&offset.to_le_bytes());
    b
}

/// Runs one script per shard, each from its own list, and returns every
/// outcome with the shard it ran on. Every completion must have run on
/// its client's thread.
fn run_scripts(e: &Engine, lists: Vec<VecDeque<Io>>, depth: usize) -> Vec<(usize, Outcome)> {
    let (tx, rx) = mpsc::channel();
    let n: usize = lists.iter().map(|l| l.len()).sum();
    for (i, todo) in lists.into_iter().enumerate() {
        let c = Script::new(todo, depth, tx.clone());
        assert!(e.run_client(i, c).is_ok(), "shard {i} exists");
    }
    drop(tx);
    let mut out = Vec::new();
    for _ in 0..n {
        let (shard, at_home, o) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a request's completion (none came in 30 s)");
        assert!(
            at_home,
            "a completion ran on another thread than its client's"
        );
        out.push((shard, o));
    }
    out
}

/// `n` simulated drives named from `tag`.
fn sims(n: usize, tag: &str) -> Vec<MemberRef> {
    (0..n)
        .map(|i| Arc::new(support::array::sim_drive(format!("sim:{tag}{i}"), DATA)) as MemberRef)
        .collect()
}

fn engine_over(level: Level, members: Vec<MemberRef>, tag: &str) -> Option<(Arc<Array>, Engine)> {
    if io_path() != IoPath::IoUring {
        eprintln!("skipped: no io_uring here, so no shards");
        return None;
    }
    let a = support::array::create_shared(level, members, tag, CHUNK);
    let e = Engine::start(a.clone(), 2).unwrap();
    (e.shard_count() == 2).then_some((a, e))
}

/// Two clients, one per shard, each writing its own blocks spread over
/// the whole array (so over stripes both shards own), then reading every
/// block back: each sees its own bytes, and the blocking engine sees them
/// too.
fn write_then_read(level: Level, members: Vec<MemberRef>, tag: &str) {
    let Some((a, e)) = engine_over(level, members, tag) else {
        return;
    };
    let blocks = a.capacity() / 4096;
    let mut rng = SmallRng::seed_from_u64(7);
    // Distinct blocks: client 0 the even ones it draws, client 1 the odd.
    let mut mine: Vec<Vec<u64>> = vec![Vec::new(), Vec::new()];
    for _ in 0..600 {
        let b = rng.gen_range(0..blocks / 2) * 2;
        for (c, list) in mine.iter_mut().enumerate() {
            list.push((b + c as u64) * 4096);
        }
    }
    for list in &mut mine {
        list.sort_unstable();
        list.dedup();
    }
    // Client `c`'s blocks: its writes (byte c + 1) or its reads.
    let ios = |c: usize, write: bool| -> VecDeque<Io> {
        mine[c]
            .iter()
            .map(|&offset| Io {
                write,
                offset,
                buf: match write {
                    true => block(c as u8 + 1, offset),
                    false => AlignedBuf::new(4096),
                },
            })
            .collect()
    };
    let c = e.counts();
    let writes_seen = || {
        let n = |x: &raid_core::stats::StripedCounter| x.load(Ordering::Relaxed);
        // A run of writes merged into one counts once on the shards, the
        // others as merged.
        (
            n(&c.writes_on_shards) + n(&c.writes_merged),
            n(&c.writes_blocking),
        )
    };
    let before = writes_seen();
    let wrote = run_scripts(&e, vec![ios(0, true), ios(1, true)], 16);
    assert_eq!(wrote.len(), mine[0].len() + mine[1].len());
    for (_, (_, offset, r)) in &wrote {
        r.as_ref()
            .unwrap_or_else(|err| panic!("write at {offset}: {err}"));
    }
    // The first write since clean, and those that set a write-intent
    // bit, run on the blocking path; most run on the shards.
    let after = writes_seen();
    let (on_shards, blocking) = (after.0 - before.0, after.1 - before.1);
    assert_eq!((on_shards + blocking) as usize, wrote.len());
    assert!(
        on_shards as usize > wrote.len() / 2,
        "{on_shards} of {} writes ran on the shards",
        wrote.len()
    );
    let reads_before = e.counts().on_shards.load(Ordering::Relaxed);
    let read = run_scripts(&e, vec![ios(0, false), ios(1, false)], 16);
    assert_eq!(read.len(), wrote.len());
    for (shard, (_, offset, r)) in read {
        let got = r.unwrap_or_else(|err| panic!("read at {offset}: {err}"));
        // The client on shard i wrote with byte i + 1.
        assert!(
            got[..] == block(shard as u8 + 1, offset)[..],
            "read at {offset} on shard {shard}: not what that client wrote"
        );
        let mut again = vec![0u8; 4096];
        a.read(offset, &mut again).unwrap();
        assert!(
            again[..] == got[..],
            "the blocking engine reads {offset} otherwise"
        );
    }
    assert_eq!(
        e.counts().on_shards.load(Ordering::Relaxed) - reads_before,
        wrote.len() as u64,
        "every read served by a shard"
    );
    assert_eq!(e.counts().inline.load(Ordering::Relaxed), 0);
}

#[test]
fn clients_on_each_shard_over_simulated_drives() {
    for (level, n) in [(Level::Raid5, 5), (Level::Raid6, 6), (Level::Raid10, 4)] {
        let members = sims(n, &format!("c{level:?}"));
        write_then_read(level, members, &format!("clients-{level:?}"));
    }
}

#[test]
fn clients_on_each_shard_over_file_members() {
    let dir = std::env::temp_dir().join(format!("raid-clients-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_then_read(
        Level::Raid5,
        support::array::files(&dir, 4, DATA),
        "clients-files",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

struct Panics(#[allow(dead_code)] mpsc::Sender<()>);
impl Client for Panics {
    fn poll(&mut self, _: &mut Local<'_>) -> bool {
        panic!("a client's own bug");
    }
}

#[test]
fn a_client_that_panics_is_dropped_and_the_shard_goes_on() {
    let members = sims(4, "p");
    let Some((_a, e)) = engine_over(Level::Raid5, members, "clients-panic") else {
        return;
    };
    let (alive, gone) = mpsc::channel();
    assert!(e.run_client(0, Box::new(Panics(alive.clone()))).is_ok());
    assert!(
        e.run_client(2, Box::new(Panics(alive))).is_err(),
        "no shard 2: the client comes back"
    );
    assert_eq!(
        gone.recv_timeout(Duration::from_secs(10)),
        Err(mpsc::RecvTimeoutError::Disconnected),
        "the client that panicked was dropped"
    );
    let todo = VecDeque::from([
        Io {
            write: true,
            offset: 0,
            buf: block(9, 0),
        },
        Io {
            write: false,
            offset: 0,
            buf: AlignedBuf::new(4096),
        },
    ]);
    // Depth 1: the read follows the write.
    let out = run_scripts(&e, vec![todo], 1);
    let (_, (_, _, r)) = out.into_iter().last().unwrap();
    assert!(r.unwrap()[..] == block(9, 0)[..]);
}

/// Gives a read for each one that completes, for ever.
struct Endless {
    came: Arc<Mutex<usize>>,
    started: bool,
    _alive: mpsc::Sender<()>,
}
impl Client for Endless {
    fn poll(&mut self, io: &mut Local<'_>) -> bool {
        let n = match self.started {
            false => 8,
            true => std::mem::take(&mut *self.came.lock().unwrap()),
        };
        self.started = true;
        for _ in 0..n {
            let came = self.came.clone();
            io.read(
                0,
                AlignedBuf::new(4096),
                Box::new(move |_| *came.lock().unwrap() += 1),
            );
        }
        true
    }
}

/// A client that never finishes, over each kind of member the shards
/// serve: simulated drives (each I/O reaped by its shard when due), files in
/// memory (copied in place, ended at once) and files elsewhere (the ring,
/// most reads completing in the submission): the engine stops anyway,
/// and drops the client.
#[test]
fn an_engine_stops_under_a_client_that_never_finishes() {
    let tmp = std::env::temp_dir().join(format!("raid-clients-stop-{}", std::process::id()));
    let mut kinds: Vec<(&str, Vec<MemberRef>, Option<std::path::PathBuf>)> =
        vec![("simulated drives", sims(4, "e"), None)];
    if let Some(shm) = support::array::memory_dir("raid-clients-stop") {
        std::fs::create_dir_all(&shm).unwrap();
        kinds.push((
            "files in memory",
            support::array::files(&shm, 4, DATA),
            Some(shm),
        ));
    }
    std::fs::create_dir_all(&tmp).unwrap();
    kinds.push(("files", support::array::files(&tmp, 4, DATA), Some(tmp)));
    for (kind, members, dir) in kinds {
        let Some((_a, e)) = engine_over(Level::Raid5, members, "clients-stop") else {
            return;
        };
        let (alive, gone) = mpsc::channel();
        let c = Endless {
            came: Arc::default(),
            started: false,
            _alive: alive,
        };
        assert!(e.run_client(1, Box::new(c)).is_ok());
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            gone.try_recv() == Err(mpsc::TryRecvError::Empty),
            "{kind}: the client still runs"
        );
        let (stopped, when) = mpsc::channel();
        std::thread::spawn(move || {
            drop(e);
            let _ = stopped.send(());
        });
        assert!(
            when.recv_timeout(Duration::from_secs(20)).is_ok(),
            "{kind}: the engine did not stop"
        );
        assert!(
            gone.recv_timeout(Duration::from_secs(1)) == Err(mpsc::RecvTimeoutError::Disconnected),
            "{kind}: the client was dropped"
        );
        if let Some(d) = dir {
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}

/// Writes to the same few stripes from clients on both shards: each goes
/// to the shard that owns its stripe, where it waits behind the one that
/// holds it, so none has to take the blocking path (two shards writing one
/// stripe would each find it held by the other, and send the write there).
#[test]
fn writes_from_both_shards_meet_on_their_stripes_owner() {
    let members = sims(5, "w");
    let Some((a, e)) = engine_over(Level::Raid5, members, "clients-owner") else {
        return;
    };
    // Four stripes of four 64 KiB chunks.
    let blocks = 4 * 4 * CHUNK / 4096;
    let writes = |c: u8, seed: u64, n: usize| -> VecDeque<Io> {
        let mut rng = SmallRng::seed_from_u64(seed);
        (0..n)
            .map(|i| {
                let offset = match seed {
                    // Every block once, for the first write since clean and
                    // the write-intent bits (the blocking path's).
                    0 => i as u64 * 4096,
                    _ => rng.gen_range(0..blocks) * 4096,
                };
                Io {
                    write: true,
                    offset,
                    buf: block(c, offset),
                }
            })
            .collect()
    };
    let warm = run_scripts(&e, vec![writes(1, 0, blocks as usize)], 16);
    assert!(warm.iter().all(|(_, (_, _, r))| r.is_ok()));
    let blocking = || e.counts().writes_blocking.load(Ordering::Relaxed);
    let before = blocking();
    let out = run_scripts(&e, vec![writes(1, 1, 800), writes(2, 2, 800)], 32);
    for (_, (_, offset, r)) in &out {
        r.as_ref()
            .unwrap_or_else(|err| panic!("write at {offset}: {err}"));
    }
    assert_eq!(blocking() - before, 0, "writes sent to the blocking path");
    // Each block holds one of the writes given to it.
    for b in 0..blocks {
        let mut got = vec![0u8; 4096];
        a.read(b * 4096, &mut got).unwrap();
        assert!(
            [1u8, 2].iter().any(|&c| got[..] == block(c, b * 4096)[..]),
            "block {b} holds neither client's write"
        );
    }
}

/// A client on a shard its caller turns (`shard::Stepped`, the
/// deterministic simulation's): its writes and reads complete through the
/// turns, the blocking path's too, and it reads back what it wrote.
#[test]
fn a_client_on_a_stepped_shard() {
    let members = support::array::Members::ram(4, DATA, "clients-stepped");
    let a = Arc::new(support::array::create(Level::Raid5, &members, CHUNK));
    let mut s = match raid_core::shard::Stepped::new(a.clone()) {
        Ok(s) => s,
        Err(e) => return eprintln!("skipped: no io_uring here ({e})"),
    };
    let offsets: Vec<u64> = (0..64u64).map(|i| i * 52 * 4096).collect();
    let mut todo: VecDeque<Io> = offsets
        .iter()
        .map(|&offset| Io {
            write: true,
            offset,
            buf: block(5, offset),
        })
        .collect();
    todo.extend(offsets.iter().map(|&offset| Io {
        write: false,
        offset,
        buf: AlignedBuf::new(4096),
    }));
    let (tx, rx) = mpsc::channel();
    // Depth 1: each read follows every write.
    s.run_client(Script::new(todo, 1, tx));
    let mut out = Vec::new();
    for _ in 0..10_000 {
        s.turn();
        while s.run_blocking() {}
        out.extend(rx.try_iter());
        if out.len() == 2 * offsets.len() {
            break;
        }
    }
    assert_eq!(out.len(), 2 * offsets.len(), "requests left unanswered");
    for (_, at_home, (write, offset, r)) in out {
        assert!(at_home);
        let got = r.unwrap_or_else(|err| panic!("at {offset}: {err}"));
        if !write {
            assert!(got[..] == block(5, offset)[..], "read at {offset}");
        }
    }
    assert!(s.counts().on_shards.load(Ordering::Relaxed) > 0);
}

/// On a shard its caller turns, over files in memory (their I/O ends as
/// it starts, with nothing reaching the inbox), a client that gives a
/// read for each that completes does not hold a turn for ever.
#[test]
fn a_stepped_turn_ends_under_a_client_that_never_finishes() {
    let Some(dir) = support::array::memory_dir("raid-clients-stepped") else {
        return eprintln!("skipped: no /dev/shm");
    };
    std::fs::create_dir_all(&dir).unwrap();
    let members = support::array::files(&dir, 4, DATA);
    let a = support::array::create_shared(Level::Raid5, members, "clients-stepped-mem", CHUNK);
    let (turned, when) = mpsc::channel();
    std::thread::spawn(move || {
        let Ok(mut s) = raid_core::shard::Stepped::new(a) else {
            return turned.send(None).unwrap();
        };
        let (alive, _gone) = mpsc::channel();
        s.run_client(Box::new(Endless {
            came: Arc::default(),
            started: false,
            _alive: alive,
        }));
        for _ in 0..100 {
            s.turn();
        }
        let _ = turned.send(Some(s.counts().on_shards.load(Ordering::Relaxed)));
    });
    let served = when.recv_timeout(Duration::from_secs(20));
    std::fs::remove_dir_all(&dir).unwrap();
    let Some(served) = served.expect("100 turns did not end") else {
        return eprintln!("skipped: no io_uring here");
    };
    assert!(served >= 100, "{served} reads served in 100 turns");
}

/// Sends on each byte it reads from its socket, which it has its shard
/// poll on the ring (`Local::watch`) whenever the socket runs dry; ends
/// when the peer closes it.
struct Echo {
    sock: std::os::unix::net::UnixStream,
    watching: bool,
    got: mpsc::Sender<u8>,
}

impl Client for Echo {
    fn poll(&mut self, io: &mut Local<'_>) -> bool {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        const TOKEN: u64 = 7;
        if self.watching && io.fired(TOKEN) {
            self.watching = false;
        }
        let mut b = [0u8; 16];
        loop {
            match (&self.sock).read(&mut b) {
                Ok(0) => return false,
                Ok(n) => b[..n].iter().for_each(|&x| {
                    let _ = self.got.send(x);
                }),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
        }
        if !self.watching {
            self.watching = true;
            io.watch(self.sock.as_raw_fd(), libc::POLLIN as u32, TOKEN);
        }
        true
    }
}

/// A client waiting for its socket is polled when the peer writes, though
/// nothing else turns its shard (no request in flight, the shard asleep in
/// its ring), and again for the next write; it ends when the peer closes.
#[test]
fn a_client_is_polled_when_its_watched_socket_is_ready() {
    use std::io::Write;
    let Some((_a, e)) = engine_over(Level::Raid5, sims(4, "w"), "clients-watch") else {
        return;
    };
    let (sock, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
    sock.set_nonblocking(true).unwrap();
    let (got, came) = mpsc::channel();
    let echo = Echo {
        sock,
        watching: false,
        got,
    };
    assert!(e.run_client(1, Box::new(echo)).is_ok());
    for x in [b'a', b'b', b'c'] {
        // Long enough for the shard to have gone to sleep.
        std::thread::sleep(Duration::from_millis(100));
        peer.write_all(&[x]).unwrap();
        assert_eq!(
            came.recv_timeout(Duration::from_secs(10)),
            Ok(x),
            "the client was not polled when its socket had a byte"
        );
    }
    drop(peer);
    assert_eq!(
        came.recv_timeout(Duration::from_secs(10)),
        Err(mpsc::RecvTimeoutError::Disconnected),
        "the client saw its socket close and ended"
    );
}

/// A member in memory that notes which threads read and wrote it.
struct Noted {
    inner: raid_core::member::RamMember,
    by: Arc<Mutex<Names>>,
}

/// "read shard-1", "write shard-0": what a member did, and on which
/// thread.
type Names = std::collections::BTreeSet<String>;

impl Noted {
    fn note(&self, what: &str) {
        let me = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned();
        self.by.lock().unwrap().insert(format!("{what} {me}"));
    }
}

impl raid_core::member::Member for Noted {
    support::pass_through_to_inner!(@common);
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.note("read");
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.note("write");
        self.inner.write_at(buf, offset)
    }
    fn in_memory(&self) -> bool {
        true
    }
}

/// Gives nothing; says when it is first polled (its shard has counted it
/// by then), and finishes when told to (at its next poll).
struct Idle {
    polled: Option<mpsc::Sender<()>>,
    /// Finished at its next poll once set.
    finish: Arc<std::sync::atomic::AtomicBool>,
    _alive: mpsc::Sender<()>,
}
impl Client for Idle {
    fn poll(&mut self, _: &mut Local<'_>) -> bool {
        if let Some(p) = self.polled.take() {
            let _ = p.send(());
        }
        !self.finish.load(Ordering::Relaxed)
    }
}

/// A RAID5 over members in memory: a client's small writes and reads are
/// copied on its own shard, except its writes whose stripe, and its reads
/// of 128 KiB or more whose first chunk, another shard owns that runs no
/// front end of its own: those that shard copies (its core otherwise
/// idle). Here they all land on stripes and chunks shard 1 owns, from a
/// client on shard 0: alone, shard 1 copies them; with a front end on
/// shard 1 too, shard 0 does; once that one finished, shard 1 again.
#[test]
fn a_lone_clients_copies_use_the_idle_shard() {
    if io_path() != IoPath::IoUring {
        return eprintln!("skipped: no io_uring here, so no shards");
    }
    let by = Arc::new(Mutex::new(Names::new()));
    let members: Vec<MemberRef> = (0..4)
        .map(|i| {
            let inner = raid_core::member::RamMember::new(
                format!("ram:noted{i}"),
                raid_core::metadata::MIN_DATA_OFFSET + DATA,
            );
            let by = by.clone();
            Arc::new(Noted { inner, by }) as MemberRef
        })
        .collect();
    let a = support::array::create_shared(Level::Raid5, members, "clients-idle", CHUNK);
    let e = Engine::start(a.clone(), 2).unwrap();
    if e.shard_count() != 2 {
        return eprintln!("skipped: the engine got fewer than two shards");
    }
    // Stripes 1, 3, 5, 7 of the first 8 (three 64 KiB chunks of data
    // each) and the odd chunks: shard 1's.
    let stripe = 3 * CHUNK;
    let chunks = 8 * stripe / CHUNK;
    // Every block of those stripes once first: the first write since
    // clean and the write-intent bits go to the blocking path.
    let warm = (0..8 * stripe / 4096).map(|b| Io {
        write: true,
        offset: b * 4096,
        buf: block(0, b * 4096),
    });
    let out = run_scripts(&e, vec![warm.collect()], 16);
    assert!(out.iter().all(|(_, (_, _, r))| r.is_ok()));
    let mut model = std::collections::HashMap::new();
    // 200 writes to odd stripes, then 128 KiB reads from odd chunks, one
    // at a time; returns what the members did and where.
    let mut run = |c: u8, writes: usize| {
        by.lock().unwrap().clear();
        let mut rng = SmallRng::seed_from_u64(c as u64);
        let mut todo = VecDeque::new();
        for _ in 0..writes {
            let s = 2 * rng.gen_range(0..4u64) + 1;
            let offset = s * stripe + rng.gen_range(0..stripe / 4096) * 4096;
            model.insert(offset, c);
            let buf = block(c, offset);
            todo.push_back(Io {
                write: true,
                offset,
                buf,
            });
        }
        for k in (1..chunks - 1).step_by(2) {
            let buf = AlignedBuf::new(2 * CHUNK as usize);
            todo.push_back(Io {
                write: false,
                offset: k * CHUNK,
                buf,
            });
        }
        for (_, (write, offset, r)) in run_scripts(&e, vec![todo], 1) {
            let got = r.unwrap_or_else(|err| panic!("at {offset} (write: {write}): {err}"));
            for (i, b) in got.chunks(4096).enumerate().filter(|_| !write) {
                let at = offset + 4096 * i as u64;
                let c = model.get(&at).copied().unwrap_or(0);
                assert!(b == &block(c, at)[..], "block at {at} read back");
            }
        }
        std::mem::take(&mut *by.lock().unwrap())
    };
    let on =
        |names: &Names, what: &str, shard: usize| names.contains(&format!("{what} shard-{shard}"));
    let alone = run(1, 200);
    for what in ["read", "write"] {
        assert!(on(&alone, what, 1), "shard 1 did no {what}: {alone:?}");
        assert!(!on(&alone, what, 0), "shard 0 did a {what}: {alone:?}");
    }
    let (keep, gone) = mpsc::channel();
    let (polled, first_poll) = mpsc::channel();
    let finish = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let idle = Idle {
        polled: Some(polled),
        finish: finish.clone(),
        _alive: keep,
    };
    assert!(e.run_client(1, Box::new(idle)).is_ok());
    first_poll.recv_timeout(Duration::from_secs(10)).unwrap();
    let shared = run(2, 200);
    for what in ["read", "write"] {
        assert!(on(&shared, what, 0), "shard 0 did no {what}: {shared:?}");
        assert!(!on(&shared, what, 1), "shard 1 did a {what}: {shared:?}");
    }
    // The front end on shard 1 finishes (at the poll a second one, which
    // finishes at once, brings about): shard 1 counts none again, and
    // copies for the client on shard 0 as before. The count drops at the
    // end of that poll, after the drops this sees: one write at a time
    // until one lands there.
    finish.store(true, Ordering::Relaxed);
    let (keep, gone_too) = mpsc::channel();
    let done_at_once = Idle {
        polled: None,
        finish,
        _alive: keep,
    };
    assert!(e.run_client(1, Box::new(done_at_once)).is_ok());
    for g in [gone, gone_too] {
        let end = g.recv_timeout(Duration::from_secs(10));
        assert_eq!(end, Err(mpsc::RecvTimeoutError::Disconnected));
    }
    let t = std::time::Instant::now();
    while !on(&run(3, 1), "write", 1) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "shard 1 still counts a front end 30 s after its last one finished"
        );
    }
    let again = run(4, 200);
    for what in ["read", "write"] {
        assert!(on(&again, what, 1), "shard 1 did no {what}: {again:?}");
        assert!(!on(&again, what, 0), "shard 0 did a {what}: {again:?}");
    }
}
