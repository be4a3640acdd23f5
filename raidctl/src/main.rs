//! raidctl: the operator's CLI over raid-core and raid-gpu, and the daemon
//! that serves arrays. No RAID logic lives here: commands parse arguments,
//! call the libraries or the daemon, and print.

/// `println!` for the CLI's output. A reader that went away
/// (`raidctl mount NAME --loop | head -1`) ends the command quietly with
/// success, the command's work being done, instead of a panic: scripts
/// under `set -o pipefail` depend on it.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let mut o = std::io::stdout().lock();
        if let Err(e) = writeln!(o, $($t)*).and_then(|_| o.flush()) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            panic!("writing to stdout: {e}");
        }
    }};
}

/// The process's heap: mimalloc rather than glibc's malloc. A shard of the
/// array's engine keeps a hundred or more requests in flight, each with
/// state and completions of the same few sizes, made on one thread and
/// often freed on another. glibc keeps seven freed blocks of a size per
/// thread and takes the rest back into its arena under a lock; mimalloc's
/// per-thread pages take them back without one. Over RAM members that was
/// a quarter to a third of a 4 KiB write's CPU on the shards (1.2-2.9 µs,
/// RAID0 to RAID6), and up to a fifth of a read's (`docs/benchmarks.md`,
/// "The heap").
#[global_allocator]
static HEAP: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Keeps the process on small pages, as it was on glibc's heap. mimalloc
/// asks for transparent huge pages on its memory (`MADV_HUGEPAGE`), which
/// on a kernel in `madvise` mode may stall a fault in compaction, a tail
/// a storage daemon should not have, and held about 80 MB more resident
/// in the mount benchmark; the requests' buffers are reused, so the huge
/// pages bought little (within the spread over RAM members). The setting
/// is the process's (and its children's), whatever mapped the memory.
fn no_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes an integer flag and touches no
    // memory of ours; it fails only on kernels before 3.15 (then ignored).
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

mod alerts;
mod any_bytes;
mod bench;
mod commands;
mod config;
mod daemon;
mod error;
mod eventlog;
mod examine;
mod export;
mod fuse;
mod health;
mod inspect;
mod metrics;
mod nbd;
mod plot;
mod protocol;
mod registry;
mod remote;
mod selftest;
mod status;
mod systemd;

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "raidctl",
    version,
    about = "Software RAID for NVMe with GPU parity offload"
)]
pub struct Cli {
    /// Where arrays are recorded and the daemon keeps its socket
    /// [default: $RAIDCTL_STATE_DIR, else /var/lib/raidctl].
    #[arg(long, global = true, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Output format of read commands.
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    format: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Parity {
    Cpu,
    Gpu,
    Auto,
}

impl Parity {
    pub fn name(self) -> &'static str {
        match self {
            Parity::Cpu => "cpu",
            Parity::Gpu => "gpu",
            Parity::Auto => "auto",
        }
    }
}

#[derive(Subcommand)]
pub enum Command {
    /// Create an array: write metadata on the members and record it.
    Create {
        /// The new array's name (what every other command calls it).
        name: String,
        /// RAID level: 0, 1, 5, 6 or 10 (raid5 and the like are read too).
        #[arg(long, value_parser = parse_level)]
        level: u32,
        /// Chunk size, a power of two from 4K to 1M.
        #[arg(long, default_value = "64K")]
        chunk: String,
        /// Parity engine: cpu; gpu (falls back to the CPU when no GPU is
        /// present or it is lost); auto (the GPU for batches where it was
        /// measured faster, only on a real, non-CPU adapter).
        #[arg(long, value_enum, default_value_t = Parity::Auto)]
        parity: Parity,
        /// A hot spare (repeatable).
        #[arg(long = "spare", value_name = "DEV")]
        spares: Vec<PathBuf>,
        /// Overwrite members that hold a filesystem, a partition table or
        /// the metadata of a stopped array. Never touches a member of a
        /// running array, nor replaces a running array's record.
        #[arg(long)]
        force: bool,
        /// Leave member files sparse instead of allocating them: saves space
        /// now, but a filesystem that fills up then fails writes to the
        /// array.
        #[arg(long)]
        sparse: bool,
        /// Member devices or files, in slot order; a member on another host
        /// is an NBD URI: nbd://HOST[:PORT]/EXPORT, nbds://... (TLS, with
        /// ?tls-certificates=DIR) or nbd+unix:///EXPORT?socket=PATH.
        #[arg(required = true, value_name = "DEV")]
        members: Vec<PathBuf>,
    },
    /// Assemble an array and serve it (in a background daemon unless --foreground).
    Start {
        /// The array's name: one recorded here (`raidctl list`), or, with
        /// --members or --scan, that of an array brought from elsewhere.
        name: String,
        /// Assemble from these members instead of the recorded ones (an
        /// array moved from another host); records them.
        #[arg(long, num_args = 1.., value_name = "DEV")]
        members: Vec<PathBuf>,
        /// Serve over NBD: unix:PATH, tcp:PORT (loopback) or tcp:HOST:PORT.
        #[arg(long)]
        nbd: Option<String>,
        /// TLS for the NBD export (clients connect with nbds://): a
        /// directory holding server-cert.pem and server-key.pem, as qemu and
        /// nbdkit lay it out. Required on a non-loopback address.
        #[arg(long, value_name = "DIR", requires = "nbd")]
        tls: Option<PathBuf>,
        /// Clients must present a certificate signed by DIR/ca-cert.pem.
        #[arg(long, requires = "tls")]
        tls_verify_peer: bool,
        /// Serve NBD on a non-loopback address without TLS: anyone who
        /// reaches it can read and overwrite the array.
        #[arg(long, requires = "nbd", conflicts_with = "tls")]
        insecure: bool,
        /// Run the daemon in this process (for systemd).
        #[arg(long)]
        foreground: bool,
        /// Parity engine from now on (recorded); default: the recorded one.
        #[arg(long, value_enum)]
        parity: Option<Parity>,
        /// Find the members by the array's uuid (its name when it is not
        /// recorded) among the devices and files in these folders, for
        /// members whose recorded paths moved [default with no folder:
        /// /dev/disk/by-id]; records the paths found.
        #[arg(long, num_args = 0.., value_name = "DIR", conflicts_with = "members")]
        scan: Option<Vec<PathBuf>>,
        /// When too few members are in sync to start, take back members
        /// marked failed whose data is intact, newest metadata first (like
        /// mdadm --assemble --force); prints what it took and why. With
        /// --members, also start without a member that was serving and is
        /// not among those given (refused otherwise).
        #[arg(long)]
        force: bool,
    },
    /// Flush and stop a running array; no data is lost. Refused where
    /// member files were deleted while it ran (they live on only while it
    /// runs) and the others cannot serve every byte without them.
    Stop {
        /// The array's name, as `raidctl list` shows it.
        name: String,
        /// Stop even then, losing those members' data.
        #[arg(long)]
        force: bool,
    },
    /// Forget a stopped array here (its record and event log); its members
    /// keep its metadata, so `start NAME --members ...` brings it back.
    /// With --wipe --force, also erase its metadata from its members.
    Delete {
        /// The array's name, as `raidctl list` shows it.
        name: String,
        /// Also erase the array's metadata (superblocks, bitmap, journal)
        /// from every member and spare that carries it, so the devices are
        /// free; refused without --force, since the array can then no
        /// longer be assembled.
        #[arg(long)]
        wipe: bool,
        /// With --wipe: do it.
        #[arg(long, requires = "wipe")]
        force: bool,
    },
    /// The known arrays, one line each.
    List,
    /// State of one array or all. Exit status: 0 optimal, 1 degraded or
    /// rebuilding, 2 failed (the worst of all arrays without a name).
    Status {
        /// One array [default: every array known here].
        name: Option<String>,
    },
    /// Everything about one array.
    Detail {
        /// The array's name, as `raidctl list` shows it.
        name: String,
    },
    /// Mark a member failed. Refused when the array would lose its data.
    Fail {
        /// The array's name, as `raidctl list` shows it.
        name: String,
        /// The member to mark failed: its path as `raidctl status NAME`
        /// lists it, or another path to the same device.
        member: PathBuf,
        /// Fail it even if the array then has more members down than its
        /// level tolerates (it stops serving I/O).
        #[arg(long)]
        force: bool,
    },
    /// Change the rate limits of rebuilds, hot replaces, the resync after an
    /// unclean stop and scrubs, also of those running now (0: no limit),
    /// kept across restarts; with no option, show them.
    Rate {
        /// The array's name, as `raidctl list` shows it.
        name: String,
        /// Bytes per second written by a rebuild or hot replace, or read
        /// from each member by a resync (e.g. 200M).
        #[arg(long, value_name = "SIZE")]
        rebuild: Option<String>,
        /// Bytes per second read from all members by a scrub.
        #[arg(long, value_name = "SIZE")]
        scrub: Option<String>,
    },
    /// What a device holds: array, slot, state, event counter (from its
    /// own metadata, read-only; safe on a device in use).
    Examine {
        /// Devices or files to look at.
        #[arg(required = true, value_name = "DEV")]
        devices: Vec<PathBuf>,
    },
    /// Take a failed member or a spare out of the array.
    Remove {
        /// The array's name, as `raidctl list` shows it.
        name: String,
        /// The failed member or the spare to take out, by its path as
        /// `raidctl status NAME` lists it.
        member: PathBuf,
    },
    /// Add a hot spare.
    Add {
        /// The array's name, as `raidctl list` shows it.
        name: String,
        /// The device or file to keep as a hot spare (overwritten once it
        /// takes a slot).
        member: PathBuf,
    },
    /// Take back a member that left its slot briefly (failed by mistake, a
    /// loose cable): only the regions written since it left are resynced.
    #[command(name = "re-add")]
    ReAdd {
        /// The array's name, as `raidctl list` shows it.
        name: String,
        /// The member that left its slot, by its path.
        member: PathBuf,
    },
    /// Put NEW in place of failed OLD and rebuild onto it.
    Replace {
        /// The array's name, as `raidctl list` shows it.
        name: String,
        /// The failed or missing member, by its path as `raidctl status
        /// NAME` lists it.
        old: PathBuf,
        /// The device or file to rebuild onto (overwritten).
        new: PathBuf,
    },
    /// Expose a running array as one file in a FUSE mount; with --loop, also
    /// as a loop block device (printed on the first line).
    Mount {
        /// The array's name, as `raidctl list` shows it.
        name: String,
        /// Attach a loop device (direct I/O) to the file.
        #[arg(long = "loop")]
        with_loop: bool,
        /// Mount point [default: STATE_DIR/mnt/NAME].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Check every stripe's redundancy against its data, online; with
    /// --repair, fix what disagrees (docs/reliability.md gives the rules).
    Scrub {
        /// The array's name, as `raidctl list` shows it.
        name: String,
        #[arg(long)]
        repair: bool,
        /// Return at once; `status` shows the progress, `events` the result.
        #[arg(long, conflicts_with = "cancel")]
        background: bool,
        /// Stop the scrub that is running.
        #[arg(long)]
        cancel: bool,
    },
    /// Undo `mount`: detach the loop device and unmount.
    Unmount {
        /// The array's name, as `raidctl list` shows it.
        name: String,
    },
    /// Wait until no rebuild is pending or running. Exits 0 when the array
    /// ends optimal, 1 when it ends degraded, failed, or its rebuild cannot
    /// run.
    Wait {
        /// The array's name, as `raidctl list` shows it.
        name: String,
        /// Seconds to wait at most.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
    },
    /// Live I/O of running arrays and their members, like `iostat -x`:
    /// per second operations, MB, mean and p99 latency (ms), queue, errors.
    /// With --format json, one object per report.
    Iostat {
        /// One array [default: every running array]; a number alone is
        /// taken as INTERVAL when no array has that name.
        name: Option<String>,
        /// Seconds between reports.
        interval: Option<f64>,
        /// Reports to print [default: 1 without INTERVAL, else until
        /// interrupted].
        count: Option<u64>,
    },
    /// The array's event log (failures, rebuilds, ...), oldest first.
    Events {
        /// The array's name, as `raidctl list` shows it.
        name: String,
    },
    /// Email alerts.
    Alert {
        #[command(subcommand)]
        what: AlertCmd,
    },
    /// Run the daemon in the foreground (what `start` spawns; for systemd).
    Daemon {
        /// TOML file declaring arrays to start and their exports.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Exit once no array has been served for a few seconds.
        #[arg(long, hide = true)]
        exit_when_idle: bool,
        /// Serve Prometheus metrics on HOST:PORT (GET /metrics), e.g.
        /// 127.0.0.1:9469; overrides [metrics] listen in the config.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
    },
    /// The CSD comparison: four fio-style profiles, incompressible and
    /// 72%-compressible data, on the array in-process, through NBD, and on
    /// one member alone (docs/benchmarks.md).
    Bench {
        /// Folder for the member files [default: a temporary folder].
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Members of the array measured.
        #[arg(long, default_value_t = 4)]
        members: usize,
        /// Its RAID level.
        #[arg(long, default_value_t = 5)]
        level: u32,
        /// Size of each member's data area.
        #[arg(long, default_value = "1G")]
        member_size: String,
        /// Seconds per profile run.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Seconds per queue depth of the latency sweep.
        #[arg(long, default_value_t = 1.0)]
        sweep_seconds: f64,
        /// What the members (and the lone member) are: `files` in --dir,
        /// or `simulated` NVMe drives in memory (80 µs per read, 20 µs per
        /// write, 128 commands in service each), which show what the
        /// array's engine and its export cost over fast drives on a
        /// machine without them.
        #[arg(long, default_value = "files", value_parser = ["files", "simulated"])]
        drives: String,
        /// Write the report as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write the IOPS/latency plot (SVG) here.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Write the throughput-per-profile plot (SVG) here.
        #[arg(long)]
        throughput_plot: Option<PathBuf>,
        /// Run nothing: draw the plots of a report saved with --json.
        #[arg(long, value_name = "JSON")]
        replot: Option<PathBuf>,
    },
    /// Drive health (SMART / NVMe health log) of devices, as the daemon
    /// reads it for members: model, serial, firmware, figures, warnings.
    /// Exit status 1 when a device raises a warning.
    Health {
        /// Devices to read the health of.
        #[arg(required = true, value_name = "DEV")]
        devices: Vec<PathBuf>,
    },
    /// Print the shell completion script for bash, zsh or fish (the install
    /// script puts them where each shell looks), or elvish or powershell.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (raidctl.1 and one per command) into DIR.
    #[command(hide = true)]
    Manpages { dir: PathBuf },
    /// Check every parity kernel this CPU has against the scalar oracle.
    Selftest {
        /// Data chunks per stripe.
        #[arg(long, default_value_t = 8)]
        width: usize,
        /// Chunk size in KiB.
        #[arg(long, default_value_t = 64)]
        chunk_kib: usize,
    },
}

#[derive(Subcommand)]
pub enum AlertCmd {
    /// Send a test message with the configured settings and print the
    /// server's answer.
    Test {
        /// Config file [default: STATE_DIR/raidctl.toml].
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// Logs go to stderr, or straight to the journal (with priorities from the
/// levels: error err, warn warning, info notice... as tracing-journald maps
/// them) when systemd connected stderr to it. `RAIDCTL_LOG` filters
/// (default: info for the daemon, whose log is the record of what it did;
/// warn for the other commands, whose answer says what they did).
fn init_logging(default: &'static str) {
    use tracing_subscriber::prelude::*;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("RAIDCTL_LOG")
            .unwrap_or_else(|_| default.into())
    };
    if systemd::stderr_is_journal() {
        match tracing_journald::layer() {
            Ok(j) => {
                tracing_subscriber::registry()
                    .with(j.with_syslog_identifier("raidctl".into()))
                    .with(filter())
                    .init();
                return;
            }
            Err(e) => eprintln!("raidctl: the journal is not reachable ({e}); logging to stderr"),
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(|| LossyStderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// stderr for log lines, dropping those it cannot take. A daemon started
/// by `raidctl start` logs to a file in its state folder: where that
/// filesystem is full or read-only, a line that fails must cost only that
/// line. (Told of the error, tracing's writer reports it with
/// `eprintln!`, which panics when stderr fails: the thread that logged,
/// a request's or a rebuild's, died with whatever it held.)
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn main() -> ExitCode {
    no_huge_pages();
    let cli = Cli::parse();
    private_runtime_dir();
    init_logging(match cli.command {
        // The daemon, also run in-process by `start --foreground`.
        Command::Daemon { .. }
        | Command::Start {
            foreground: true, ..
        } => "info",
        _ => "warn",
    });
    // Records, logs, the event log and sockets hold array layouts, member
    // paths and alert settings: private to the user that runs raidctl.
    // SAFETY: umask only sets this process's file-creation mask.
    unsafe { libc::umask(0o077) };
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if !e.msg.is_empty() {
                eprintln!("raidctl: error: {e}");
            }
            ExitCode::from(e.code)
        }
    }
}

/// Gives the process a private XDG_RUNTIME_DIR where it has none (under
/// sudo, systemd's system units, cron): Mesa's Vulkan driver probes for a
/// Wayland display whenever the GPU engine opens an adapter (at every
/// start of a RAID5/6 array with `--parity auto`), and without one
/// libwayland writes a bare `error: XDG_RUNTIME_DIR is invalid` line to
/// stderr, which is the daemon's log: two false errors per start, with
/// no time. A folder of our own, 0700, that nothing listens in. Called
/// first, before any thread exists (the environment is not thread-safe).
fn private_runtime_dir() {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        return;
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = std::env::temp_dir().join(format!("raidctl-runtime-{uid}"));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    // Only a real folder of ours that no one else can enter (not a link
    // or folder someone else made there first).
    let ours = std::fs::symlink_metadata(&dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0);
    if ours {
        std::env::set_var("XDG_RUNTIME_DIR", &dir);
    }
}

/// A RAID level as typed: `5`, `raid5` or `RAID5`; which levels exist is
/// checked by `create`, which names them.
fn parse_level(v: &str) -> Result<u32, String> {
    let digits = v
        .strip_prefix("raid")
        .or_else(|| v.strip_prefix("RAID"))
        .unwrap_or(v);
    digits
        .parse()
        .map_err(|_| format!("'{v}' is not a RAID level: use 0, 1, 5, 6 or 10"))
}
