//! The journal against members that log, and hold back, chosen writes:
//! the order of a flush's writes, and members joining a slot (a new
//! member's ring made while records go on; records placed during a
//! rebuild settled as its member comes in sync), and writers into the
//! batch of a rebuild, a hot replace or a scrub, which each locks a step
//! of rows at a time.

use super::tests::rings;
use super::tests_settle::journaled_rows;
use super::*;
use crate::array::async_write::{AsyncWrite, Start};
use crate::array::RebuildOptions;
use crate::member::RamMember;
use std::sync::atomic::AtomicBool;

/// A member that names, in `log`, each bitmap and journal-header write,
/// each zeroing of its ring ("zeros") and each write it holds back
/// ("held"): while `hold` names a kind of write (`Held`), writes of that
/// kind wait.
struct Logged {
    inner: MemberRef,
    log: Log,
    hold: Arc<(Mutex<Option<Held>>, parking_lot::Condvar)>,
    /// Writes of the held kind let through before the hold bites.
    let_through: std::sync::atomic::AtomicU32,
    /// The filesystem it says it is a file on (`Member::device_key`), if
    /// any: members on one share a disk.
    disk: Option<u64>,
}

/// The writes a `Logged` member can hold back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Held {
    /// The journal's ring zeroed.
    RingZeros,
    /// Whole chunks (64 KiB and more) into the data area: a rebuild's
    /// rows, not a client's 4 KiB writes.
    Data,
    /// Whole chunks read from the data area: a scrub's rows, not a
    /// client's 4 KiB reads.
    Reads,
}

impl Logged {
    fn new(tag: &str, i: usize, log: &Log) -> Arc<Logged> {
        Logged::on_disk(tag, i, log, None)
    }

    /// `new`, saying it is a file on filesystem `disk` where one is given.
    fn on_disk(tag: &str, i: usize, log: &Log, disk: Option<u64>) -> Arc<Logged> {
        Arc::new(Logged {
            inner: Arc::new(RamMember::new(
                format!("ram:{tag}{i}"),
                crate::metadata::MIN_DATA_OFFSET + (1 << 20),
            )),
            log: log.clone(),
            hold: Default::default(),
            let_through: Default::default(),
            disk,
        })
    }

    fn hold(&self, kind: Option<Held>) {
        *self.hold.0.lock() = kind;
        self.hold.1.notify_all();
    }

    /// Waits while writes of `kind` are held, unless this one is let
    /// through (`hold_after`); says "held" when it waits.
    fn wait_while_held(&self, kind: Held) {
        use std::sync::atomic::Ordering::SeqCst;
        let (held, cv) = &*self.hold;
        let mut h = held.lock();
        if *h != Some(kind) {
            return;
        }
        let let_through = |k: u32| k.checked_sub(1);
        if self
            .let_through
            .fetch_update(SeqCst, SeqCst, let_through)
            .is_ok()
        {
            return;
        }
        self.log.lock().push("held");
        while *h == Some(kind) {
            cv.wait(&mut h);
        }
    }

    /// Holds writes of `kind` after the next `n` of them.
    fn hold_after(&self, kind: Held, n: u32) {
        self.let_through
            .store(n, std::sync::atomic::Ordering::SeqCst);
        self.hold(Some(kind));
    }
}

/// What `Logged` members say, in the order they say it.
type Log = Arc<Mutex<Vec<&'static str>>>;

/// A RAID5 of four `Logged` members (as `array` makes it), logging into
/// one log, each with a hold of its own.
fn logged_array(tag: &str) -> (Array, Vec<Arc<Logged>>, Log) {
    logged_array_of(tag, Level::Raid5, 4)
}

/// `logged_array` at `level`, of `n` members.
fn logged_array_of(tag: &str, level: Level, n: usize) -> (Array, Vec<Arc<Logged>>, Log) {
    let log = Log::default();
    let l: Vec<Arc<Logged>> = (0..n).map(|i| Logged::new(tag, i, &log)).collect();
    let m = l.iter().map(|m| m.clone() as MemberRef).collect();
    let opts = CreateOptions {
        name: tag.into(),
        level,
        chunk: 64 * 1024,
        data_offset: None,
    };
    (Array::create(m, vec![], opts).unwrap(), l, log)
}

/// Whether `what` is in the log within 10 seconds.
fn came(log: &Log, what: &str) -> bool {
    let t = std::time::Instant::now();
    while !log.lock().contains(&what) && t.elapsed().as_secs() < 10 {
        std::thread::yield_now();
    }
    log.lock().contains(&what)
}

/// Whether every record up to sequence `seq` is settled, and none after.
fn settled_through(a: &Array, seq: u64) -> bool {
    let st = a.journal.as_ref().unwrap().state.lock();
    st.tail_seq >= seq && st.tail_seq + 1 == st.next_seq
}

/// A rebuild a row at a time, its position saved every `save_rows` rows
/// (`None`: only at its end), and never for the time gone by.
fn row_by_row(a: &Array, save_rows: Option<u64>) -> RebuildOptions {
    let d = RebuildOptions::default();
    RebuildOptions {
        batch_rows: 1,
        parallel: 1,
        checkpoint_bytes: save_rows.map_or(d.checkpoint_bytes, |r| r * a.geo.chunk),
        checkpoint_every: std::time::Duration::from_secs(3600),
        ..d
    }
}

impl Member for Logged {
    fn identity(&self) -> &str {
        self.inner.identity()
    }
    fn device_key(&self) -> crate::member::DeviceKey {
        use crate::member::DeviceKey;
        match (self.disk, self.inner.device_key()) {
            (Some(dev), DeviceKey::Ram(ino)) => DeviceKey::File { dev, ino },
            (_, key) => key,
        }
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if offset >= crate::metadata::MIN_DATA_OFFSET && buf.len() >= 64 << 10 {
            self.wait_while_held(Held::Reads);
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let kind = match offset {
            crate::metadata::BITMAP_OFFSET => {
                self.log.lock().push("bitmap");
                None
            }
            JOURNAL_OFFSET => {
                self.log.lock().push("header");
                None
            }
            o if crate::metadata::SB_OFFSETS.contains(&o) => {
                if let Ok(sb) = crate::metadata::Superblock::decode(buf) {
                    let rows = sb.geometry().rows();
                    if sb.slots.iter().all(|e| e.state == SlotState::Active) {
                        self.log.lock().push("all in sync");
                    } else if sb
                        .slots
                        .iter()
                        .any(|e| e.state == SlotState::Rebuilding && e.rebuild_row == rows)
                    {
                        self.log.lock().push("every row saved");
                    }
                }
                None
            }
            o if o >= crate::metadata::MIN_DATA_OFFSET && buf.len() >= 64 << 10 => Some(Held::Data),
            _ => None,
        };
        if let Some(kind) = kind {
            self.wait_while_held(kind);
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        if (RECORDS..crate::metadata::MIN_DATA_OFFSET).contains(&offset) {
            self.log.lock().push("zeros");
            self.wait_while_held(Held::RingZeros);
        }
        self.inner.write_zeroes(offset, len)
    }
}

/// A flush that settles the journal does so before it clears any
/// write-intent bit: a record replayed after a crash may carry parity a
/// resync repaired since without a record (a rebuild's deferred resync),
/// and only the region's bit would have the start resync it again.
#[test]
fn a_flush_settles_the_journal_before_it_clears_a_bit() {
    let (a, _, log) = logged_array("jorder");
    a.set_bitmap_linger(Some(std::time::Duration::ZERO));
    // A record left while the array was degraded, its slot back in sync
    // (as a rebuild that wrote through it leaves it), and a write that
    // marked a region.
    a.fail_slot(1, "test");
    a.write(0, &[9u8; 4096]).unwrap();
    a.slots[1].set_state(SlotState::Active);
    assert!(a.journal_pending(0));
    log.lock().clear();
    a.flush().unwrap();
    let log = log.lock().clone();
    let first = |what| log.iter().position(|&w| w == what);
    assert!(
        first("header").is_some_and(|h| Some(h) < first("bitmap")),
        "the journal settled first, then the bit cleared: {log:?}"
    );
}

/// A member joining a slot has its ring zeroed while records go on
/// taking places (the zeros are megabytes; every journaled write waited
/// for them): a degraded write is journaled while the new member's zeros
/// are held back, and the record placed then is settled before that
/// member's header is written, so nothing in its ring chains on.
#[test]
fn records_take_places_while_a_new_members_ring_is_zeroed() {
    let (a, l, log) = logged_array("jzeros");
    a.fail_slot(3, "test");
    a.re_add(l[3].clone()).unwrap();
    l[3].hold(Some(Held::RingZeros));
    let release = || l[3].hold(None);
    let block = [0x5au8; 4096];
    std::thread::scope(|sc| {
        let admit = sc.spawn(|| a.journal_admit(&(l[3].clone() as MemberRef)));
        assert!(came(&log, "zeros"), "the ring was never zeroed");
        let (tx, rx) = std::sync::mpsc::channel();
        let (a, block) = (&a, &block);
        sc.spawn(move || {
            let seq = a.journal_stripe(1, 0, &[(0, &block[..])]).unwrap();
            a.journal_write_done(seq);
            tx.send(seq).unwrap();
        });
        let placed = rx.recv_timeout(std::time::Duration::from_secs(5));
        release();
        admit.join().unwrap().unwrap();
        let seq = placed.expect("a record waited for the new member's zeros");
        assert!(
            settled_through(a, seq),
            "the record placed during the zeros was not settled by the admission"
        );
    });
    // In sync (as its rebuild would leave it): its ring holds nothing to
    // replay, and the stripe reads what was written.
    a.slots[3].set_state(SlotState::Active);
    assert_eq!(a.journal_recover().unwrap(), 0);
}

/// Records placed while a member is rebuilt have no copy on it (a member
/// not in sync takes none), and the rebuild's end settles them before the
/// member counts in sync: none is ever short of the copies the margin then
/// asks for.
#[test]
fn records_placed_during_a_rebuild_are_settled_as_it_ends() {
    let (a, l, log) = logged_array("jinsync");
    // Data everywhere, so the rebuild writes its member row by row.
    a.write(0, &vec![0x33u8; a.capacity() as usize]).unwrap();
    a.fail_slot(3, "test");
    let new = Logged::new("jinsync", 4, &log);
    a.replace(3, new.clone()).unwrap();
    new.hold(Some(Held::Data));
    let members: Vec<MemberRef> = l
        .iter()
        .take(3)
        .chain([&new])
        .map(|m| m.clone() as MemberRef)
        .collect();
    let last = a.journal.as_ref().unwrap().state.lock().next_seq - 1;
    let opts = row_by_row(&a, None);
    let stripes = a.geo.rows();
    let (copies, mark) = std::thread::scope(|sc| {
        let rebuild = sc.spawn(|| a.rebuild_all(&opts, &AtomicBool::new(false)));
        came(&log, "held");
        // Held at its first row: degraded writes to the last stripes where
        // the member holds data go through the journal.
        let last_rows: Vec<u64> = (0..stripes)
            .rev()
            .filter(|&s| a.geo.stripe_map(s).members[..a.geo.data_chunks()].contains(&3))
            .take(3)
            .collect();
        let written = last_rows.iter().all(|&s| {
            a.write(s * a.geo.stripe_data_bytes(), &[0x44u8; 4096])
                .is_ok()
        });
        let mark = log.lock().len();
        let copies = rings(&members, &a.uuid, a.data_offset)
            .iter()
            .map(|seqs| seqs.iter().filter(|&&q| q > last).count())
            .collect::<Vec<_>>();
        new.hold(None);
        assert!(written);
        assert_eq!(rebuild.join().unwrap().unwrap(), RebuildEnd::Finished);
        (copies, mark)
    });
    assert_eq!(copies[3], 0, "the member being rebuilt took records");
    assert_eq!(copies.iter().sum::<usize>(), 3, "{copies:?}");
    assert!(
        settled_through(&a, last + 1),
        "records placed during the rebuild left unsettled as its member came in sync"
    );
    // Every row saved as in sync, and the records settled, before the
    // member was said to be in sync, not after.
    let log = log.lock()[mark..].to_vec();
    let at = |what| log.iter().position(|&w| w == what);
    let in_sync = at("all in sync");
    for before in ["every row saved", "header"] {
        assert!(
            in_sync.is_some() && at(before).is_some_and(|b| Some(b) < in_sync),
            "the member was said to be in sync before '{before}': {log:?}"
        );
    }
}

/// Rows a rebuild has passed are written through the journal until the
/// metadata on disk says they are in sync: a crash takes the member back
/// to that row, its chunks there are then rebuilt from the other members,
/// and a write torn by the crash, with no record, would have left those
/// disagreeing (the member's chunk rebuilt wrong, though no one wrote it).
#[test]
fn rows_a_rebuild_passed_are_journaled_until_its_position_is_saved() {
    let (a, _, log) = logged_array("jsaved");
    let a = Arc::new(a);
    a.write(0, &vec![0x33u8; a.capacity() as usize]).unwrap();
    a.fail_slot(3, "test");
    let new = Logged::new("jsaved", 4, &log);
    a.replace(3, new.clone()).unwrap();
    // A row a batch, the position saved every two: held writing row 5,
    // the position is at 5 and the metadata says 4.
    new.hold_after(Held::Data, 5);
    let opts = row_by_row(&a, Some(2));
    let sdb = a.geo.stripe_data_bytes();
    let journaled = std::thread::scope(|sc| {
        let rebuild = sc.spawn(|| a.rebuild_all(&opts, &AtomicBool::new(false)));
        came(&log, "held");
        let at = (
            a.slots[3].rebuild_row.load(Ordering::Acquire),
            a.slots[3].saved_row(),
        );
        // A shard journals the rows past the saved one too.
        let on_shard: Vec<(u64, Option<bool>)> = [1u64, 4]
            .iter()
            .map(|&s| {
                match AsyncWrite::start(
                    &crate::array::LocalArray::new(&a),
                    s * sdb,
                    AlignedBuf::new(4096),
                    |_| true,
                ) {
                    Start::Go(w) => (s, Some(w.degraded())),
                    _ => (s, None),
                }
            })
            .collect();
        let journaled: Vec<(u64, bool)> = [1u64, 4]
            .iter()
            .map(|&s| {
                let written = a.write(s * sdb, &[0x44u8; 4096]).is_ok();
                (s, written && a.journal_pending(s))
            })
            .collect();
        new.hold(None);
        let end = rebuild.join().unwrap();
        assert_eq!(
            at,
            (5, 4),
            "the rebuild was not held where the test needs it"
        );
        assert!(matches!(end, Ok(RebuildEnd::Finished)));
        assert_eq!(
            on_shard,
            [(1, Some(false)), (4, Some(true))],
            "(stripe, journaled on the shard)"
        );
        journaled
    });
    assert_eq!(
        journaled,
        [(1, false), (4, true)],
        "(stripe, journaled): below the saved row, and past it"
    );
}

/// A hot replace's new device gets its ring zeroed at the switch while
/// records go on. Its slot is in sync, so a record placed then may have
/// its copy there (on both devices of the pair) overwritten by the zeros:
/// the switch settles every such record before the new device holds the
/// slot alone.
#[test]
fn records_placed_while_a_hot_replacements_ring_is_zeroed_are_settled_by_the_switch() {
    let (a, _, log) = logged_array("jhot");
    // Degraded, so that writes are journaled.
    a.fail_slot(1, "test");
    let new = Logged::new("jhot", 4, &log);
    new.hold(Some(Held::RingZeros));
    a.hot_replace(2, new.clone()).unwrap();
    let last = a.journal.as_ref().unwrap().state.lock().next_seq - 1;
    let sdb = a.geo.stripe_data_bytes();
    std::thread::scope(|sc| {
        let copy = sc.spawn(|| a.hot_replace_copy(&Default::default(), &AtomicBool::new(false)));
        let held = came(&log, "held");
        // One record each, their copies taking turns among the slots in
        // sync: slot 2, the pair, among them. On a thread, so that writes
        // made to wait for the zeros fail the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let a = &a;
        sc.spawn(move || {
            let rows = journaled_rows(a, 1, 3);
            let written = rows
                .iter()
                .all(|&s| a.write(s * sdb, &[0x66u8; 4096]).is_ok());
            tx.send(written).unwrap();
        });
        let written = rx.recv_timeout(std::time::Duration::from_secs(5));
        new.hold(None);
        let end = copy.join().unwrap();
        assert!(held, "the switch never zeroed the new device's ring");
        assert_eq!(
            written,
            Ok(true),
            "the writes waited for the new device's zeros"
        );
        assert!(matches!(end, Ok(RebuildEnd::Finished)), "{end:?}");
    });
    assert_eq!(
        a.slots[2].member.read().as_ref().unwrap().identity(),
        new.identity()
    );
    assert!(
        settled_through(&a, last + 3),
        "records placed during the new device's zeros left unsettled at the switch"
    );
}

/// Writes of one block to each of `free` rows and to each of `held`,
/// while a job is held on a step that locks the `held` rows (`release`
/// lets it go): what the writes to `free` did within 10 seconds (each
/// ended well), whether every write to `held` waited (none ended within
/// half a second), and whether each ended well once the job went on. Each
/// row's block holds the row's number.
fn writes_around_a_held_step(
    a: &Array,
    at: &(dyn Fn(u64) -> u64 + Sync),
    (free, held): (&[u64], &[u64]),
    release: &dyn Fn(),
) -> (bool, bool, bool) {
    let write = |row: u64| a.write(at(row), &[row as u8; 4096]).is_ok();
    std::thread::scope(|sc| {
        let (tx, rx) = std::sync::mpsc::channel();
        let (htx, hrx) = std::sync::mpsc::channel();
        // Answers no one waits for any more are dropped.
        sc.spawn(move || {
            for &row in free {
                let _ = tx.send(write(row));
            }
        });
        for &row in held {
            let htx = htx.clone();
            sc.spawn(move || {
                let _ = htx.send(write(row));
            });
        }
        let secs = std::time::Duration::from_secs;
        let went_on = free.iter().all(|_| rx.recv_timeout(secs(10)) == Ok(true));
        let early = hrx.recv_timeout(std::time::Duration::from_millis(500));
        release();
        let mut ended = early.iter().all(|&ok| ok);
        for _ in held.iter().skip(early.is_ok() as usize) {
            ended &= hrx.recv_timeout(secs(10)) == Ok(true);
        }
        (went_on, early.is_err(), ended)
    })
}

/// Whether `log` says "held" (a job reached its hold); where it does not,
/// the hold is let go (`release`) so that the job cannot wait forever.
fn reached_its_hold(log: &Log, release: &dyn Fn()) -> bool {
    let reached = came(log, "held");
    if !reached {
        release();
    }
    reached
}

/// What a job held on a step left: the writes to rows on either side of
/// the step went on, the write into it waited for it and then ended, and
/// every row written reads back.
fn check_writes_around(a: &Array, at: &dyn Fn(u64) -> u64, rows: &[u64], got: (bool, bool, bool)) {
    let (went_on, waited, ended) = got;
    assert!(went_on, "a write into the batch waited for the whole of it");
    assert!(
        waited,
        "a write into the step under way (or the one read with its write) did not wait for it"
    );
    assert!(ended, "the write into the step under way never ended");
    for &row in rows {
        let mut buf = vec![0u8; 4096];
        a.read(at(row), &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == row as u8), "row {row}");
    }
}

/// The offset of 4 KiB of `row` that lands on `slot`'s chunk (or on the
/// data, where that chunk is the parity).
fn on_slot(a: &Array, slot: usize, row: u64) -> u64 {
    match a.geo.chunk_at(slot, row) {
        crate::layout::ChunkRole::Data(c) => c * a.geo.chunk,
        _ => row * a.geo.stripe_data_bytes(),
    }
}

/// A job's options: one batch of 8 rows, one run, steps of one row.
fn steps_of_one_row(a: &Array) -> RebuildOptions {
    RebuildOptions {
        batch_rows: 8,
        parallel: 1,
        step_bytes: a.geo.chunk,
        ..RebuildOptions::default()
    }
}

/// A rebuild locks its rows a step at a time, not a batch at a time:
/// writes into its batch go on while it is held on a later step. Where a
/// step already wrote the new member, a write there writes the member
/// too (the row counts in sync from the step's mark), or once the batch
/// ended the member would keep what the rebuild wrote before the write;
/// a write into the step read while the one before is written waits for
/// both. RAID5, and mirrors (whose steps were read, then written, one at
/// a time).
#[test]
fn writers_into_a_rebuild_batch_wait_only_for_its_steps() {
    // An odd RAID10 too: a chunk's copies there lie on two rows.
    for (level, n) in [
        (Level::Raid5, 4),
        (Level::Raid10, 4),
        (Level::Raid1, 4),
        (Level::Raid10, 3),
    ] {
        writers_into_a_rebuild_batch(level, n);
    }
}

/// The last of `n` members of a `level` array rebuilt under writes.
fn writers_into_a_rebuild_batch(level: Level, n: usize) {
    let tag = format!("jsteps{level}-{n}");
    let (a, _, log) = logged_array_of(&tag, level, n);
    let slot = n - 1;
    a.write(0, &vec![0x33u8; a.capacity() as usize]).unwrap();
    a.fail_slot(slot, "test");
    let new = Logged::new(&tag, n, &log);
    a.replace(slot, new.clone()).unwrap();
    // Held writing row 3: rows 0-2 written (and marked), rows 3 and 4
    // locked (row 4 read with row 3's write, at every level).
    let got = rebuild_held_at_row_3(&a, (slot, &new), &log, (&[1, 6], &[3, 4]), &tag);
    let at = |row| on_slot(&a, slot, row);
    check_writes_around(&a, &at, &[1, 3, 4, 6], got);
}

/// Rebuilds `slot` onto `new` in steps of one row, held writing its row 3
/// while writes go to `rows` (as `writes_around_a_held_step` takes them),
/// and returns what those did; the rebuild must finish, and a scrub then
/// find nothing.
fn rebuild_held_at_row_3(
    a: &Array,
    (slot, new): (usize, &Logged),
    log: &Log,
    rows: (&[u64], &[u64]),
    tag: &str,
) -> (bool, bool, bool) {
    new.hold_after(Held::Data, 3);
    let opts = steps_of_one_row(a);
    let at = |row| on_slot(a, slot, row);
    let release = || new.hold(None);
    let got = std::thread::scope(|sc| {
        let rebuild = sc.spawn(|| a.rebuild_all(&opts, &AtomicBool::new(false)));
        let reached = reached_its_hold(log, &release);
        assert!(reached, "{tag}: the rebuild never reached row 3");
        let got = writes_around_a_held_step(a, &at, rows, &release);
        assert_eq!(rebuild.join().unwrap().unwrap(), RebuildEnd::Finished);
        got
    });
    let report = a
        .scrub(
            &crate::array::ScrubOptions::default(),
            &AtomicBool::new(false),
        )
        .unwrap();
    assert!(
        report.mismatches.is_empty(),
        "{tag}: the rebuilt member disagrees: {:?}",
        report.mismatches
    );
    got
}

/// A mirror's rebuild makes a run one step (its rows locked together,
/// read, then written) only where the new member shares a disk with a
/// copy the run reads: on a RAID10, a member of another pair on that disk
/// leaves it in steps, the pair's other member on it does not.
#[test]
fn a_mirror_rebuild_is_one_step_only_beside_the_copy_it_reads() {
    for partner_on_the_disk in [false, true] {
        let tag = format!("jdisk{partner_on_the_disk}");
        let log = Log::default();
        // Pairs (0, 1) and (2, 3); slot 1 rebuilt onto disk 7, where
        // slot 2 is, and slot 0 too where `partner_on_the_disk`.
        let disks = [partner_on_the_disk.then_some(7), None, Some(7), None];
        let l: Vec<MemberRef> = (0..4)
            .map(|i| Logged::on_disk(&tag, i, &log, disks[i]) as MemberRef)
            .collect();
        let opts = CreateOptions {
            name: tag.clone(),
            level: Level::Raid10,
            chunk: 64 * 1024,
            data_offset: None,
        };
        let a = Array::create(l, vec![], opts).unwrap();
        a.write(0, &vec![0x33u8; a.capacity() as usize]).unwrap();
        a.fail_slot(1, "test");
        let new = Logged::on_disk(&tag, 4, &log, Some(7));
        a.replace(1, new.clone()).unwrap();
        // In steps, row 6 is free while row 3 is written; as one step,
        // the run's rows (0-7) are all held.
        let (rows, written): ((&[u64], &[u64]), &[u64]) = match partner_on_the_disk {
            false => ((&[1, 6], &[3, 4]), &[1, 3, 4, 6]),
            true => ((&[], &[3, 6]), &[3, 6]),
        };
        let got = rebuild_held_at_row_3(&a, (1, &new), &log, rows, &tag);
        check_writes_around(&a, &|row| on_slot(&a, 1, row), written, got);
    }
}

/// A hot replace's copy locks its rows a step at a time too: writes into
/// its batch go on while it is held on a later step, and reach both
/// devices, so the replacement holds them after the switch.
#[test]
fn writers_into_a_hot_replace_batch_wait_only_for_its_steps() {
    let (a, _, log) = logged_array("jhsteps");
    a.write(0, &vec![0x33u8; a.capacity() as usize]).unwrap();
    let new = Logged::new("jhsteps", 4, &log);
    a.hot_replace(3, new.clone()).unwrap();
    // Held writing row 3: rows 3-4 locked.
    new.hold_after(Held::Data, 3);
    let opts = steps_of_one_row(&a);
    let at = |row| on_slot(&a, 3, row);
    let release = || new.hold(None);
    let got = std::thread::scope(|sc| {
        let copy = sc.spawn(|| a.hot_replace_copy(&opts, &AtomicBool::new(false)));
        assert!(
            reached_its_hold(&log, &release),
            "the copy never reached row 3"
        );
        let got = writes_around_a_held_step(&a, &at, (&[1, 6], &[3]), &release);
        assert_eq!(copy.join().unwrap().unwrap(), RebuildEnd::Finished);
        got
    });
    let member = a.slots[3].member.read().clone().unwrap();
    assert_eq!(
        member.identity(),
        new.identity(),
        "the replacement took the slot"
    );
    let report = a
        .scrub(
            &crate::array::ScrubOptions::default(),
            &AtomicBool::new(false),
        )
        .unwrap();
    assert!(report.mismatches.is_empty(), "{:?}", report.mismatches);
    check_writes_around(&a, &at, &[1, 3, 6], got);
}

/// A scrub locks its rows a step at a time: writes into its batch, before
/// and after the step it is held on, go on, one into that step waits for
/// it, and the scrub finds nothing wrong.
#[test]
fn writers_into_a_scrub_batch_wait_only_for_its_steps() {
    let (a, l, log) = logged_array("jssteps");
    a.write(0, &vec![0x33u8; a.capacity() as usize]).unwrap();
    // One batch of 16 rows, in steps of 4 (256 KiB of each member): held
    // reading the second step, rows 4-7 locked.
    l[0].hold_after(Held::Reads, 4);
    let opts = crate::array::ScrubOptions {
        batch_rows: 16,
        parallel: 1,
        ..Default::default()
    };
    let at = |row| row * a.geo.stripe_data_bytes();
    let release = || l[0].hold(None);
    let (report, got) = std::thread::scope(|sc| {
        let scrub = sc.spawn(|| a.scrub(&opts, &AtomicBool::new(false)));
        assert!(
            reached_its_hold(&log, &release),
            "the scrub never reached its second step"
        );
        let got = writes_around_a_held_step(&a, &at, (&[1, 10], &[5]), &release);
        (scrub.join().unwrap().unwrap(), got)
    });
    assert!(report.mismatches.is_empty(), "{:?}", report.mismatches);
    check_writes_around(&a, &at, &[1, 5, 10], got);
}
