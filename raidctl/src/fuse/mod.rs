//! The FUSE export: the array as one file in a FUSE mount, so that a loop
//! device (`losetup --direct-io=on`) turns it into a real block device on
//! hosts without the NBD or ublk drivers (containers, these test machines).
//!
//! fsync is the array's flush; fallocate(PUNCH_HOLE) and
//! fallocate(ZERO_RANGE) are discard / write-zeroes. Requests need not be
//! block aligned: partial blocks are read, merged and written back with no
//! other write running (see `crate::any_bytes`).
//!
//! The protocol is spoken here (`abi`, `session`), not through a FUSE
//! crate: many requests at once need several threads reading `/dev/fuse`,
//! each on its own clone of the descriptor and answering what it read, and
//! the pure-Rust crate used before read from one thread, handing each
//! request to a worker (two wake-ups per request). The kernel is asked for
//! asynchronous direct I/O, parallel direct writes to the file, up to 1 MiB
//! per request, and up to 256 requests queued. Where the kernel offers
//! FUSE over io_uring (Linux 6.14 on, the fuse module's `enable_uring`),
//! requests come through per-CPU rings instead (`ring`); the choice is
//! made at INIT and logged.

mod abi;
mod io;
mod mount;
mod ops;
pub mod place;
mod ring;
mod session;

use ops::Fs;
use raid_core::array::Array;
use std::sync::Arc;

/// Requests served at once (threads reading `/dev/fuse`): the array's API
/// blocks a thread per request in flight, so this is the export's queue
/// depth. 8 per core, at most 128, and at least 16 where every member is
/// in memory (on 2 vCPUs, 16 served more of every job than 8, 32 or 64:
/// there each thread beyond the cores costs wake-ups), and where a member
/// is a device the rule for threads that wait on devices (at least 64:
/// `raid_core::shard::threads_waiting_on_devices`).
/// RAIDCTL_FUSE_WORKERS sets it.
fn threads(in_memory: bool) -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::env::var("RAIDCTL_FUSE_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| (1..=1024).contains(&n))
        .unwrap_or(match in_memory {
            true => (8 * cores).clamp(16, 128),
            false => raid_core::shard::threads_waiting_on_devices(),
        })
}

/// Largest read or write the kernel sends in one request (and so the size
/// of every request buffer, the ring entries' included).
const MAX_IO: u32 = 1 << 20;

/// The fuse module's `enable_uring` (Linux 6.14 on): Some(on), or None
/// where this kernel does not have it.
fn uring_param() -> Option<bool> {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .ok()
        .map(|v| matches!(v.trim(), "Y" | "1"))
}

/// Threads sharing each CPU queue's entries of FUSE over io_uring where
/// every member is in memory. There a request is answered without waiting,
/// so a thread serves several entries and answers what one wake-up brought
/// in one io_uring_enter (`ring::Worker`). Two, not one: the kernel queues
/// a request on the CPU that sent it, and a loop device sends from one
/// worker thread, so most requests land on one queue, whose single thread
/// then left the other core idle (a third of the time). ext4 on the mount
/// (RAID5 of 5 tmpfs files), fio 4 KiB random reads at QD 32, 2 vCPUs,
/// IOPS against a thread per entry (the rule where a member is a device,
/// 113-124K): one thread per queue 143-149K, two 155-162K, four 152K.
const RING_THREADS_IN_MEMORY: usize = 2;

/// Entries per CPU queue of FUSE over io_uring where every member is in
/// memory: on the same measure, 8 served 143-151K, 16 149-162K, 32
/// 103-137K.
const RING_DEPTH_IN_MEMORY: usize = 16;

/// How FUSE over io_uring is served: `depth` entries per CPU queue, shared
/// by `threads` threads (`ring::Worker`).
struct RingShape {
    depth: usize,
    threads: usize,
}

/// The shape of FUSE over io_uring, or None not to use it: the fuse
/// module's `enable_uring` is off, or RAIDCTL_FUSE_URING=0.
/// RAIDCTL_FUSE_URING=N sets the entries per queue. Where a member is a
/// device, each entry has its own thread (the array's API blocks one per
/// request in flight), and the default depth is the `/dev/fuse` threads'
/// count spread over the online CPUs, at least 8; where every member is in
/// memory, `RING_DEPTH_IN_MEMORY` entries per queue share
/// `RING_THREADS_IN_MEMORY` threads.
fn ring_shape(threads: usize, in_memory: bool) -> Option<RingShape> {
    if uring_param() != Some(true) {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let asked = std::env::var("RAIDCTL_FUSE_URING").ok();
    let depth = match asked.as_deref().map(str::parse::<usize>) {
        Some(Ok(0)) => return None,
        Some(Ok(n)) => n.min(256),
        _ if in_memory => RING_DEPTH_IN_MEMORY,
        _ => (threads / cores).clamp(8, 64),
    };
    let threads = match in_memory {
        true => RING_THREADS_IN_MEMORY.min(depth),
        false => depth,
    };
    Some(RingShape { depth, threads })
}

/// A FUSE mount of an array, and the loop device on it if any.
pub struct Mounted {
    threads: Vec<std::thread::JoinHandle<()>>,
    /// The FUSE over io_uring entries' threads, when prepared.
    ring: Option<ring::Ring>,
    /// The FUSE connection's device number.
    conn: Option<u64>,
    /// The mount's source (`place::source_for`): with `conn`, what tells
    /// this mount from another put on the folder since.
    source: String,
    /// The connection's control files (/sys/fs/fuse/connections/N), held
    /// open from the mount on: the kernel detaches them from the
    /// connection when it ends, so a write to `abort` can never reach
    /// another connection given the same number since, and a read of
    /// `waiting` tells whether ours still lives. None where fusectl is not
    /// mounted.
    ctl: Option<Ctl>,
    pub dir: std::path::PathBuf,
    /// `dir` resolved once, before the mount (resolving it later could
    /// call into the mount, that is into our own threads).
    dir_real: std::path::PathBuf,
    pub file: std::path::PathBuf,
    pub loop_dev: Option<String>,
    /// The highest folder `mount` made for the mount point (the mount
    /// point, and parents that were missing too): `unmount` removes what
    /// it made, up to it, each only while empty.
    made_dir: Option<std::path::PathBuf>,
}

struct Ctl {
    abort: std::fs::File,
    waiting: std::fs::File,
}

impl Ctl {
    fn open(conn: u64) -> Option<Ctl> {
        let d = format!("/sys/fs/fuse/connections/{}", libc::minor(conn));
        Some(Ctl {
            abort: std::fs::OpenOptions::new()
                .write(true)
                .open(format!("{d}/abort"))
                .ok()?,
            waiting: std::fs::File::open(format!("{d}/waiting")).ok()?,
        })
    }

    /// Whether the connection still lives (its `waiting` reads a number;
    /// detached from an ended one, it reads nothing).
    fn alive(&self) -> bool {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 32];
        self.waiting.read_at(&mut b, 0).is_ok_and(|n| n > 0)
    }

    fn abort(&self) {
        use std::os::unix::fs::FileExt;
        let _ = self.abort.write_at(b"1", 0);
    }
}

/// Whether loop device `dev` (`/dev/loopN`) is still attached to a file:
/// the kernel lets one go by itself once nothing holds it after a
/// `losetup -d` from someone else while it was mounted. Where the kernel
/// cannot be asked, it is taken as attached (the checks that refuse then
/// apply, as before). The file is not compared: asking our own FUSE file
/// for its identity would wait on our own threads.
pub fn loop_attached(dev: &str) -> bool {
    let Some(name) = std::path::Path::new(dev).file_name() else {
        return true;
    };
    let sys = std::path::Path::new("/sys/block").join(name);
    !sys.is_dir() || sys.join("loop/backing_file").exists()
}

impl Mounted {
    /// Mounts `array` on `dir`, which the caller checked could take it
    /// (`place::check`).
    pub fn mount(
        array: Arc<Array>,
        dir: &std::path::Path,
        with_loop: bool,
    ) -> Result<Mounted, String> {
        // A folder made here is removed again at unmount.
        let made_dir = dir
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
            .last()
            .map(|a| a.to_path_buf());
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create mount point {}: {e}", dir.display()))?;
        let file = dir.join(array.name());
        let dir_real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let source = place::source_of(&array);
        let fd = mount::mount(dir, &source).map_err(|e| {
            format!(
                "FUSE mount on {} failed: {e} (is /dev/fuse there? are you root?)",
                dir.display()
            )
        })?;
        let fs = Arc::new(Fs {
            name: array.name().to_string(),
            ctime: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            io: io::Io::new(array),
        });
        let in_memory = fs.io.array.all_in_memory();
        let n = threads(in_memory);
        // Prepared before INIT can arrive: the kernel waits for every
        // queue of a ring it was promised.
        let ring = ring_shape(n, in_memory).and_then(|r| match ring::Ring::prepare(&fd, fs.clone(), r.depth, r.threads) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!("FUSE over io_uring: cannot prepare the rings ({e}); threads reading /dev/fuse serve the mount");
                None
            }
        });
        let gate = ring.as_ref().map(|r| r.gate.clone());
        let threads = session::start(fd, fs, n, gate);
        log_transport(n, ring.is_some());
        // The connection's number (the mount's device minor), to end it
        // from /sys/fs/fuse/connections when unmounting. Asked only now:
        // the threads that answer it are running.
        let conn = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(dir).map(|m| m.dev()).ok()
        };
        let ctl = conn.and_then(Ctl::open);
        if ctl.is_none() {
            tracing::warn!("/sys/fs/fuse/connections is not mounted: an unmount cannot end the FUSE connection of a mount taken off by hand (mount -t fusectl none /sys/fs/fuse/connections)");
        }
        let mut m = Mounted {
            threads,
            ring,
            conn,
            source,
            ctl,
            dir_real,
            dir: dir.to_path_buf(),
            file,
            loop_dev: None,
            made_dir,
        };
        if with_loop {
            match attach_loop(&m.file) {
                Ok(dev) => m.loop_dev = Some(dev),
                Err(e) => {
                    // Nothing may keep serving the array behind our back.
                    m.end();
                    return Err(e);
                }
            }
        }
        Ok(m)
    }

    /// How requests reach the daemon, for status: "io_uring, 2 queues, 32
    /// entries, 4 threads" (entries in all) or "/dev/fuse, 16 threads".
    pub fn transport(&self) -> String {
        match &self.ring {
            Some(r) if r.used() == Some(true) => {
                let (q, e, t) = r.shape();
                format!("io_uring, {q} queues, {e} entries, {t} threads")
            }
            _ => format!("/dev/fuse, {} threads", self.threads.len()),
        }
    }

    /// Where this mount is on its folder now (mountinfo only: a call into
    /// the folder would go to our own threads).
    fn placed(&self) -> place::Ours {
        match self.conn {
            Some(dev) => place::ours_at(&self.dir_real, dev, &self.source),
            None => place::Ours::OnTop,
        }
    }

    /// Whether the mount was taken off outside raidctl (umount by hand):
    /// its folder is no longer the array's, nor is what is mounted there.
    pub fn gone(&self) -> bool {
        self.placed() == place::Ours::Gone
    }

    /// Unmounts lazily and ends the connection: for a mount that cannot be
    /// kept (its loop device failed) or is dropped without `unmount`. Only
    /// our own mount: one mounted on the folder by hand since is left.
    fn end(&mut self) {
        if self.placed() == place::Ours::OnTop {
            let _ = mount::umount_lazy(&self.dir);
        }
        self.abort_and_join();
    }

    /// Ends the kernel connection (every thread's read then fails with
    /// ENODEV, even where a copy of the mount lives on in another mount
    /// namespace), and joins the threads. Through the control file held
    /// since the mount (`Ctl`): one opened by its number now could be
    /// another connection's, given the number since ours ended. Without
    /// it (no fusectl), by number only while our mount is still there.
    fn abort_and_join(&mut self) {
        match (&self.ctl, self.conn) {
            (Some(c), _) => c.abort(),
            (None, Some(dev)) if self.placed() != place::Ours::Gone => {
                let p = format!("/sys/fs/fuse/connections/{}/abort", libc::minor(dev));
                let _ = std::fs::write(p, "1");
            }
            _ => {}
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(r) = self.ring.as_mut() {
            r.join();
        }
    }

    /// Detaches the loop device and unmounts; refuses while the loop
    /// device is mounted somewhere, or the FUSE mount is still in use (a
    /// loop device detached lazily by the kernel because something still
    /// holds it, a process with the file open). Refused, the mount is
    /// handed back as it was. Done, every request the threads had is
    /// answered: they are joined.
    pub fn unmount(mut self) -> Result<(), Box<(Mounted, String)>> {
        // Only our own mount: another one put on top of it since would be
        // the one taken off. Asked of mountinfo before anything changes
        // (a stat would go to our own threads, which a hung member holds).
        let placed = self.placed();
        if placed == place::Ours::Under {
            let dir = self.dir.display().to_string();
            return Err(Box::new((
                self,
                format!("{dir} has another mount on top of the array's: unmount that one first (umount {dir}), then unmount again"),
            )));
        }
        // Taken off by hand, yet the connection lives: something still
        // reaches the array through it (a loop device attached by hand, a
        // program that had the file open, `umount -l`). Ending it would
        // cut that user off (a filesystem on such a loop device loses
        // what it has not written back): refused, with who. Without the
        // control files (fusectl not mounted), only our threads can tell:
        // they end with the connection.
        if placed == place::Ours::Gone {
            let alive = match &self.ctl {
                Some(c) => c.alive(),
                None => {
                    let t = std::time::Instant::now();
                    while !self.threads.iter().all(|h| h.is_finished())
                        && t.elapsed() < std::time::Duration::from_secs(2)
                    {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    !self.threads.iter().all(|h| h.is_finished())
                }
            };
            if alive {
                let who = self
                    .conn
                    .map(loops_over_fs)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(dev, at)| match at {
                        Some(mp) => {
                            format!("{dev} (mounted on {mp}: umount {mp}, then losetup -d {dev})")
                        }
                        None => format!("{dev} (losetup -d {dev})"),
                    })
                    .collect::<Vec<_>>();
                let who = match who.is_empty() {
                    true => {
                        "a program that opened the array's file before (lsof names it)".to_string()
                    }
                    false => format!("loop devices: {}", who.join("; ")),
                };
                let dir = self.dir.display().to_string();
                return Err(Box::new((
                    self,
                    format!("the array's mount on {dir} was taken off outside raidctl (umount -l?), but it is still in use through {who}: let go of it, then unmount again"),
                )));
            }
        }
        // Detached by someone else since (losetup -d while it was
        // mounted, so the kernel let it go at the unmount): nothing to
        // wait for or to detach.
        if self.loop_dev.as_deref().is_some_and(|d| !loop_attached(d)) {
            self.loop_dev = None;
        }
        if let Some(dev) = self.loop_dev.clone() {
            if let Some(mp) = mounted_at(&dev) {
                return Err(Box::new((
                    self,
                    format!("{dev} is mounted on {mp}: umount {mp} first"),
                )));
            }
            if let Some(by) = place::in_use(&dev) {
                return Err(Box::new((
                    self,
                    format!("{dev} is in use ({by}): nothing changed; stop what uses it, then unmount again"),
                )));
            }
            let out = match std::process::Command::new("losetup")
                .arg("-d")
                .arg(&dev)
                .output()
            {
                Ok(o) => o,
                Err(e) => return Err(Box::new((self, format!("losetup: {e}")))),
            };
            if !out.status.success() {
                let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
                return Err(Box::new((self, format!("losetup -d {dev}: {why}"))));
            }
            self.loop_dev = None;
        }
        // Unmounted here rather than by the FUSE crate, which only logs a
        // failure: a mount that is still busy keeps serving the array.
        // Taken off by hand already: whatever is on the folder now is not
        // ours to unmount (it was, by device number alone: a tmpfs the
        // kernel gave the freed number, with its files).
        if placed == place::Ours::Gone {
            tracing::warn!(dir = %self.dir.display(), "the array's FUSE mount was taken off outside raidctl; only its connection is ended");
        } else if let Err(e) = mount::umount(&self.dir) {
            let dir = self.dir.display().to_string();
            // A loop device attached by hand holds it where fuser shows
            // only "kernel mount": named, with its filesystem.
            let loops: Vec<String> = self
                .conn
                .map(loops_over_fs)
                .unwrap_or_default()
                .into_iter()
                .map(|(dev, at)| match at {
                    Some(mp) => {
                        format!("{dev} (mounted on {mp}: umount {mp}, then losetup -d {dev})")
                    }
                    None => format!("{dev} (losetup -d {dev})"),
                })
                .collect();
            let why = match loops.is_empty() {
                true => format!("stop what holds it (fuser -vm {dir})"),
                false => format!(
                    "loop devices attached to {} hold it: {}",
                    self.file.display(),
                    loops.join("; ")
                ),
            };
            return Err(Box::new((
                self,
                format!("{dir} is still in use ({e}): {why}, then unmount again"),
            )));
        }
        // Unmounted: each thread answers what it holds and ends.
        self.abort_and_join();
        if let Some(top) = &self.made_dir {
            // Only while empty: never what someone put there since.
            for d in self.dir.ancestors() {
                if std::fs::remove_dir(d).is_err() || d == top.as_path() {
                    break;
                }
            }
        }
        Ok(())
    }
}

/// Says at mount how requests travel: what the kernel offers (FUSE over
/// io_uring, Linux 6.14 on, when the fuse module's `enable_uring` is on)
/// and what is prepared. INIT settles which is used, and says so.
fn log_transport(threads: usize, ring: bool) {
    let offered = match uring_param() {
        Some(true) if ring => "offered by the kernel; rings prepared, used if INIT agrees",
        Some(true) => {
            "offered by the kernel, not used (RAIDCTL_FUSE_URING=0, or the rings could not be made)"
        }
        Some(false) => "switched off (the fuse module's enable_uring parameter is N)",
        None => "not in this kernel",
    };
    tracing::info!(
        threads,
        "FUSE transport: {threads} threads reading /dev/fuse, each on its own descriptor; FUSE over io_uring: {offered}"
    );
}

impl Drop for Mounted {
    /// A mount dropped without `unmount` (the daemon ending with it) is
    /// unmounted lazily and its connection ended.
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.end();
        }
    }
}

/// Loop devices whose backing file is on the filesystem with device
/// number `fs` (our FUSE mount's), each with where it is mounted: found by
/// what the kernel holds for each (`LOOP_GET_STATUS64`), which still names
/// the file after its mount was taken off by hand.
fn loops_over_fs(fs: u64) -> Vec<(String, Option<String>)> {
    let want = (libc::major(fs) as u64, libc::minor(fs) as u64);
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut found: Vec<(String, Option<String>)> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("loop") {
                return None;
            }
            let dev = format!("/dev/{name}");
            let f = std::fs::File::open(&dev).ok()?;
            let b = raid_core::member::loop_backing(&f)?;
            (b.fs == want).then(|| {
                let at = mounted_at(&dev);
                (dev, at)
            })
        })
        .collect();
    found.sort();
    found
}

/// Where loop device `dev` is mounted, from /proc/mounts.
pub fn mounted_at(dev: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/mounts").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == dev).then(|| f.next().unwrap_or("").to_string())
    })
}

fn attach_loop(file: &std::path::Path) -> Result<String, String> {
    let run = |direct: bool| {
        let mut c = std::process::Command::new("losetup");
        c.args(["--find", "--show", "--sector-size", "4096"]);
        if direct {
            c.arg("--direct-io=on");
        }
        c.arg(file).output()
    };
    let out = run(true).map_err(|e| format!("losetup: {e} (package util-linux / mount)"))?;
    let out = if out.status.success() {
        out
    } else {
        run(false).map_err(|e| format!("losetup: {e}"))?
    };
    if !out.status.success() {
        return Err(format!(
            "losetup {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
