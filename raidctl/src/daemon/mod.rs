//! The daemon: serves one or more arrays, answers the control socket,
//! watches for failed members (activating spares, running rebuilds), and
//! stops every array cleanly on SIGTERM or SIGINT.

mod lifecycle;
mod members;
mod mounts;
mod observe;
mod process;
mod reconnect;
mod record;
mod report;
mod start_checks;
mod work;

use process::{lock_daemon, logs_to_state_log, remove_own_socket, reopen_log};

pub use observe::{AlertCounters, HealthConfig};

use crate::error::{code, CliError, Result};
use crate::inspect::Content;
use crate::protocol::{Request, Response};
use crate::registry::{ArrayRecord, StateDir};
use crate::status;
use parking_lot::Mutex;
use raid_core::array::{Array, ArrayEvent, RebuildOptions};
use raid_core::member::{FileMember, MemberRef};
use raid_core::parity::ParityEngine;
use raid_gpu::{ParityMode, Selection, StripeShape};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One served array.
struct Served {
    array: Arc<Array>,
    /// The parity engine the array runs (also inside `array`), kept for
    /// what `status` shows of it.
    engine: Arc<Selection>,
    record: Mutex<ArrayRecord>,
    exports: Mutex<Vec<crate::export::Export>>,
    mount: Mutex<Option<crate::fuse::Mounted>>,
    /// How many of the array's events the daemon has logged and alerted.
    events_seen: std::sync::atomic::AtomicUsize,
    /// The last health reading of each slot whose member is a drive.
    health: Mutex<std::collections::BTreeMap<usize, observe::HealthReading>>,
    /// Its drives were read at least once since it started.
    health_checked: AtomicBool,
    /// Members whose deletion was warned about (once each), by slot and
    /// device: a new file at the same path that goes too is warned again.
    deleted_warned: Mutex<std::collections::HashSet<(usize, raid_core::member::DeviceKey)>>,
    /// Why the record on disk lags the array's membership (it could not
    /// be written): the monitor writes it again every round until it can.
    record_unsaved: Mutex<Option<String>>,
    /// Held while a scrub is started and its running mark written, and
    /// by its end as it removes the mark: a scrub that ends at once
    /// cannot remove the mark before it is written.
    scrub_mark: Mutex<()>,
    /// Held by `stop` throughout: of two stops at once, the second waits
    /// for the first and is then told the array is not running, as it
    /// would be a moment later (both said they had stopped it).
    stopping: Mutex<()>,
    /// A thread clearing the array's lingering write-intent bits runs
    /// (`settle_bitmap`): one at a time.
    settling: Arc<AtomicBool>,
}

/// The daemon's stop after SIGTERM or SIGINT: every array it can stop is
/// stopped at once; one a mount keeps (a filesystem on its loop device, a
/// program holding its FUSE file) is not taken from under it, since its
/// unsynced writes would be lost with the device. It stays served, the
/// control socket answering, and is tried again every second; the daemon
/// ends once none is held and no request is under way.
#[derive(Default)]
struct SignalStop {
    /// When the daemon last tried, and the arrays that try left held, each
    /// with why (said again only when that changes).
    last: Option<(Instant, Vec<(String, String)>)>,
    /// Arrays whose stop failed for another reason than a mount: logged
    /// once, not tried every second (the last try is `shutdown`'s).
    given_up: std::collections::HashSet<String>,
}

impl SignalStop {
    /// One turn of the main loop after the signal, with `under_way`
    /// requests being served (a mount being made is let finish, and the
    /// next turn stops what it made). True: the daemon may end.
    fn turn(&mut self, d: &Daemon, under_way: usize) -> bool {
        match &self.last {
            Some((at, _)) if at.elapsed() < Duration::from_secs(1) => return false,
            Some(_) => {}
            None => {
                crate::systemd::stopping();
                tracing::info!("signal received: stopping every array cleanly");
            }
        }
        let still = d.stop_all(&mut self.given_up);
        if still.is_empty() && under_way == 0 {
            return true;
        }
        if !still.is_empty() && self.last.as_ref().is_none_or(|(_, said)| *said != still) {
            for (n, why) in &still {
                tracing::error!(array = %n, "not stopped, and still served: {why}; the daemon stops it and exits once that is done");
            }
            let names: Vec<&str> = still.iter().map(|(n, _)| n.as_str()).collect();
            crate::systemd::status(&format!(
                "stopping: waiting for {} to be unmounted",
                names.join(", ")
            ));
        }
        self.last = Some((Instant::now(), still));
        false
    }
}

pub struct Daemon {
    state: StateDir,
    arrays: Mutex<HashMap<String, Arc<Served>>>,
    /// Arrays a `start` is assembling now: a second start of the same one
    /// is refused as such, not left to fail on its devices being in use.
    starting: Mutex<std::collections::HashSet<String>>,
    /// The name lock (`StateDir::hold_name`) of each array started, held
    /// until it stops, so that a `delete` cannot remove what it runs on.
    name_locks: Mutex<HashMap<String, std::fs::File>>,
    /// A signal asked the daemon to stop (SIGTERM, SIGINT): no array is
    /// started or mounted from then on.
    term: Arc<AtomicBool>,
    /// The daemon is ending: its arrays are stopped, or it stops them now.
    /// The monitor and the health checks run until then, so an array a
    /// mount keeps served after a signal is looked after as before (a
    /// member that fails gets its spare, its alert).
    exiting: AtomicBool,
    rebuild_opts: RebuildOptions,
    alerts: Option<crate::alerts::AlertConfig>,
    alert_seq: std::sync::atomic::AtomicU64,
    /// Serialises `process_events`.
    events_lock: Mutex<()>,
    /// Runs the event hook in the events' order.
    hooks: crate::alerts::HookRunner,
    scrub_schedule: Option<crate::config::ScrubSchedule>,
    /// Given to every array started (`Array::set_bitmap_linger`).
    bitmap_linger: Duration,
    alert_counters: Arc<AlertCounters>,
    /// The daemon's clock for `iostat` intervals.
    started: Instant,
    /// A missing health tool was logged once (then only at debug level).
    health_tool_noted: AtomicBool,
    /// When the monitor last began a round (ms on `started`'s clock): the
    /// systemd watchdog is pinged only while it keeps going.
    monitor_tick: std::sync::atomic::AtomicU64,
    /// Tries at network members given up as unreachable.
    reconnects: Arc<reconnect::Tries>,
}

/// How the daemon runs.
pub struct DaemonOptions {
    /// Exit once no array has been served for a few seconds (a daemon the
    /// CLI started on demand).
    pub exit_when_idle: bool,
    /// Arrays to start at once (from --foreground or a config file).
    pub start: Vec<Request>,
    /// Where alerts go; None: events are logged only.
    pub alerts: Option<crate::alerts::AlertConfig>,
    /// The config file given (None: STATE_DIR/raidctl.toml), whose
    /// `[alerts]` the sender reads again before each try.
    pub config: Option<std::path::PathBuf>,
    /// Scrub every array on a schedule.
    pub scrub: Option<crate::config::ScrubSchedule>,
    /// Serve Prometheus metrics here.
    pub metrics: Option<std::net::SocketAddr>,
    /// How member drives' health is read.
    pub health: HealthConfig,
    /// How long a network member's I/O may take before it is given up.
    pub remote_timeout: Duration,
    /// Whether network members' servers say where their holes are.
    pub remote_trust_holes: bool,
    /// How long a write-intent bit stays set after its region's last write.
    pub bitmap_linger: Duration,
}

/// How long a daemon with no array stays up for alerts it cannot send.
const ALERT_HOLD: Duration = Duration::from_secs(3600);

impl Daemon {
    pub fn run(state: StateDir, opts: DaemonOptions) -> Result<()> {
        state.ensure()?;
        // One daemon per state directory, whatever the race: two CLIs that
        // both found no daemon start two, and only one gets this lock (the
        // other exits; its CLI finds the winner on the socket).
        let _single = lock_daemon(&state, opts.exit_when_idle)?;
        let sock = state.socket();
        if UnixStream::connect(&sock).is_ok() {
            return Err(CliError::refused(format!(
                "a daemon already serves {} (socket {})",
                state.root.display(),
                sock.display()
            )));
        }
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock)
            .map_err(|e| CliError::failed(format!("cannot listen on {}: {e}", sock.display())))?;
        let own_ino = std::fs::metadata(&sock)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap_or(0);
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| CliError::failed(format!("cannot restrict {}: {e}", sock.display())))?;
        let term = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::flag::register(sig, term.clone())
                .map_err(|e| CliError::failed(format!("signal handler: {e}")))?;
        }
        // SIGHUP: reopen the log (logrotate's habit), never die of it.
        let hup = Arc::new(AtomicBool::new(false));
        let to_state_log = logs_to_state_log(&state);
        signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone())
            .map_err(|e| CliError::failed(format!("signal handler: {e}")))?;
        crate::remote::set_timeout(opts.remote_timeout);
        crate::remote::set_trust_holes(opts.remote_trust_holes);
        let rate = std::env::var("RAIDCTL_REBUILD_RATE")
            .ok()
            .and_then(|v| parse_size(&v).ok());
        let d = Arc::new(Daemon {
            state,
            arrays: Mutex::new(HashMap::new()),
            starting: Default::default(),
            name_locks: Default::default(),
            term,
            exiting: AtomicBool::new(false),
            rebuild_opts: RebuildOptions {
                rate_limit: rate,
                ..Default::default()
            },
            alerts: opts.alerts.clone(),
            alert_seq: std::sync::atomic::AtomicU64::new(0),
            events_lock: Mutex::new(()),
            hooks: Default::default(),
            scrub_schedule: opts.scrub.clone(),
            bitmap_linger: opts.bitmap_linger,
            alert_counters: Default::default(),
            started: Instant::now(),
            health_tool_noted: AtomicBool::new(false),
            monitor_tick: std::sync::atomic::AtomicU64::new(0),
            reconnects: Default::default(),
        });
        // Bound before any array starts: a port in use fails the start
        // instead of leaving a daemon nobody can scrape.
        let metrics_stop = Arc::new(AtomicBool::new(false));
        let metrics = match opts.metrics {
            Some(addr) => {
                let w = Arc::downgrade(&d);
                let sample: Arc<dyn Fn() -> crate::metrics::Sample + Send + Sync> =
                    Arc::new(move || w.upgrade().map(|d| d.metrics_sample()).unwrap_or_default());
                match crate::metrics::serve(addr, sample, metrics_stop.clone()) {
                    Ok(h) => Some(h),
                    Err(e) => {
                        remove_own_socket(&sock, own_ino);
                        return Err(e);
                    }
                }
            }
            None => None,
        };
        let sender_stop = Arc::new(AtomicBool::new(false));
        let sender = d.alerts.clone().map(|cfg| {
            let (st, stop) = (d.state.clone(), sender_stop.clone());
            let counters = d.alert_counters.clone();
            tracing::info!(?cfg, "alerts enabled");
            let (from, path) = (st.clone(), opts.config.clone());
            let reload: crate::alerts::Reload =
                Box::new(move || Ok(crate::config::Config::load(&from, path.as_deref())?.alerts));
            std::thread::spawn(move || crate::alerts::sender(st, cfg, reload, stop, counters))
        });
        tracing::info!(socket = %sock.display(), pid = std::process::id(), "daemon listening");
        // Each array on its own: one that cannot start never keeps the
        // others from being served. Only when none starts does the daemon
        // give up (so `start --foreground` of one array still fails).
        let asked = opts.start.len();
        let mut first_error = None;
        let mut not_started: Vec<String> = Vec::new();
        for req in opts.start {
            let name = match &req {
                Request::Start { name, .. } => name.clone(),
                _ => String::new(),
            };
            let r = d.handle(req);
            if !r.ok {
                let e = CliError::new(r.code.unwrap_or(code::FAILED), r.error.unwrap_or_default());
                tracing::error!(array = %name, "array not started: {e}");
                // Not eprintln!, which panics where stderr fails (a log
                // file on a full filesystem).
                let _ = writeln!(
                    std::io::stderr(),
                    "raidctl: error: array '{name}' not started: {e}"
                );
                first_error.get_or_insert(e);
                not_started.push(name);
                continue;
            }
            if let Some(m) = r.message {
                let _ = writeln!(std::io::stdout(), "{m}");
            }
        }
        if let Some(e) = first_error.filter(|_| d.arrays.lock().is_empty() && asked > 0) {
            d.shutdown();
            remove_own_socket(&sock, own_ino);
            return Err(e);
        }
        {
            let d = d.clone();
            std::thread::spawn(move || d.monitor());
        }
        {
            let (d, cfg) = (d.clone(), opts.health.clone());
            std::thread::spawn(move || d.health_loop(cfg));
        }
        // An array of the config that did not start is in the status
        // line too: `systemctl status` must not read as all well.
        let left_out = match not_started.is_empty() {
            true => String::new(),
            false => format!("; NOT started (see the log): {}", not_started.join(", ")),
        };
        crate::systemd::ready(&format!(
            "serving {} array(s){left_out}; socket {}",
            d.arrays.lock().len(),
            sock.display()
        ));
        let mut watchdog = crate::systemd::Watchdog::from_env();
        listener.set_nonblocking(true).ok();
        let mut idle_since = Instant::now();
        // Requests accepted and not yet answered: an idle daemon exits only
        // with none, so a request it accepted is always answered (a client
        // whose connection is reset may then assume it was never seen).
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // Since when an idle daemon has stayed up for queued alerts.
        let mut alerts_held: Option<Instant> = None;
        // Since a signal: the stop it asked for, under way.
        let mut signalled: Option<SignalStop> = None;
        loop {
            if d.term.load(Ordering::Acquire) {
                let stop = signalled.get_or_insert_with(SignalStop::default);
                if stop.turn(&d, in_flight.load(Ordering::Acquire)) {
                    break;
                }
            }
            if hup.swap(false, Ordering::AcqRel) {
                reopen_log(&d.state, to_state_log);
            }
            if let Some(w) = &mut watchdog {
                let now = d.started.elapsed().as_millis() as u64;
                let last = d.monitor_tick.load(Ordering::Acquire);
                // Healthy while the monitor began a round within the period:
                // a round may wait on a slow drive (a command timeout while
                // a spare is activated) without the daemon being killed.
                w.tick(now.saturating_sub(last) < w.period().as_millis() as u64);
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    idle_since = Instant::now();
                    in_flight.fetch_add(1, Ordering::AcqRel);
                    let (d, in_flight) = (d.clone(), in_flight.clone());
                    std::thread::spawn(move || {
                        d.serve_connection(stream);
                        in_flight.fetch_sub(1, Ordering::AcqRel);
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => tracing::warn!("accept: {e}"),
            }
            if !d.arrays.lock().is_empty() || in_flight.load(Ordering::Acquire) > 0 {
                idle_since = Instant::now();
                alerts_held = None;
            } else if signalled.is_some() {
                // Stopping: the signal's turn above ends the loop.
            } else if opts.exit_when_idle && idle_since.elapsed() > Duration::from_secs(5) {
                // Alerts still queued (the mail server down when an array
                // failed and was stopped): no one would send them until
                // the next start, so the daemon stays up to deliver them.
                // Held an hour at most: a server that refuses them for good
                // (a wrong password, a rejected address) would keep it up
                // forever.
                if d.alerts.is_some() && !crate::alerts::queue_is_empty(&d.state) {
                    let held = alerts_held.get_or_insert_with(|| {
                        tracing::warn!("no array served, but alerts are still queued: the daemon stays up until they are sent (an hour at most; then the next start sends them)");
                        Instant::now()
                    });
                    if held.elapsed() < ALERT_HOLD {
                        // Asked again in a second.
                        idle_since = Instant::now() - Duration::from_secs(4);
                        continue;
                    }
                    tracing::error!("alerts still queued after an hour: the daemon exits; the next start sends them (its log says why they failed)");
                }
                tracing::info!("no array served: daemon exits");
                break;
            }
        }
        d.exiting.store(true, Ordering::Release);
        if signalled.is_none() {
            crate::systemd::stopping();
            // Idle, no array: stop listening at once, so a client from now
            // on starts a new daemon instead of waiting on this one (which
            // may still spend seconds sending queued alerts).
            drop(listener);
            remove_own_socket(&sock, own_ino);
        }
        d.shutdown();
        d.process_events();
        // Give queued alerts a moment to go out; what does not stays queued
        // for the next start.
        if let Some(cfg) = &d.alerts {
            let until = Instant::now() + Duration::from_secs(cfg.coalesce_seconds + 5);
            while !crate::alerts::queue_is_empty(&d.state) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        sender_stop.store(true, Ordering::Release);
        if let Some(s) = sender {
            let _ = s.join();
        }
        metrics_stop.store(true, Ordering::Release);
        if let Some(m) = metrics {
            let _ = m.join();
        }
        remove_own_socket(&sock, own_ino);
        Ok(())
    }

    /// Stops every array: rebuilds paused at their checkpoint, exports
    /// closed, data flushed, metadata marked clean.
    fn shutdown(&self) {
        for (n, why) in self.stop_all(&mut Default::default()) {
            tracing::error!(array = %n, "stop failed: {why}");
        }
    }

    /// Stops every array it can; returns those its mount keeps running (a
    /// filesystem on its loop device, a program holding its FUSE file:
    /// `stop` refuses those, and they stay served), each with why. Any
    /// other failure to stop is logged, and the array put in `given_up`,
    /// which later calls pass over.
    fn stop_all(&self, given_up: &mut std::collections::HashSet<String>) -> Vec<(String, String)> {
        let names: Vec<String> = self
            .arrays
            .lock()
            .keys()
            .filter(|n| !given_up.contains(*n))
            .cloned()
            .collect();
        let mut held = Vec::new();
        for n in names {
            // A shutdown stops every array, whatever it loses: said in
            // its message, which goes to the log.
            match self.stop(&n, true) {
                Ok(_) => {}
                Err(e) if self.served(&n).is_ok_and(|s| s.mount.lock().is_some()) => {
                    held.push((n, e.msg))
                }
                Err(e) => {
                    tracing::error!(array = %n, "stop failed: {e}");
                    given_up.insert(n);
                }
            }
        }
        held
    }

    fn serve_connection(&self, stream: UnixStream) {
        stream.set_nonblocking(false).ok();
        stream.set_read_timeout(Some(Duration::from_secs(30))).ok();
        let mut line = String::new();
        let mut reader = BufReader::new(&stream);
        // One request per connection, at most 64 KiB.
        let resp = match reader.by_ref().take(64 * 1024).read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => match serde_json::from_str::<Request>(&line) {
                Ok(req) => self.handle(req),
                Err(e) => Response::err(&CliError::usage(format!("malformed request: {e}"))),
            },
            Err(e) => Response::err(&CliError::usage(format!("unreadable request: {e}"))),
        };
        let mut w = &stream;
        let _ = w
            .write_all(serde_json::to_string(&resp).unwrap().as_bytes())
            .and_then(|_| w.write_all(b"\n"));
    }

    fn handle(&self, req: Request) -> Response {
        // Stopping on a signal: nothing new to start or mount (a mount made
        // now could outlive the daemon's last look at its arrays).
        if self.term.load(Ordering::Acquire)
            && matches!(req, Request::Start { .. } | Request::Mount { .. })
        {
            return Response::err(&CliError::refused(
                "the daemon is stopping (it was sent SIGTERM or SIGINT): wait for it to exit, then run the command again",
            ));
        }
        let r = match req {
            Request::Ping => Ok(Response::ok("pong")),
            Request::Start {
                name,
                members,
                nbd,
                tls,
                tls_verify_peer,
                insecure,
                parity,
                force,
                listed,
            } => {
                let sec = crate::export::Security {
                    tls,
                    verify_peer: tls_verify_peer,
                    insecure,
                };
                self.start(
                    &name,
                    members,
                    nbd.map(|n| (n, sec)),
                    parity,
                    (force, listed),
                )
                .map(Response::ok)
            }
            Request::Stop { name, force } => self.stop(&name, force).map(Response::ok),
            Request::Status { name } => self.status(name.as_deref()),
            Request::Fail {
                name,
                member,
                force,
            } => self.fail(&name, &member, force).map(Response::ok),
            Request::Remove { name, member } => self.remove(&name, &member).map(Response::ok),
            Request::Add { name, member } => self.add(&name, &member).map(Response::ok),
            Request::ReAdd { name, member } => self.re_add(&name, &member).map(Response::ok),
            Request::Replace { name, old, new } => {
                self.replace(&name, &old, &new).map(Response::ok)
            }
            Request::Rate {
                name,
                rebuild,
                scrub,
            } => self.rate(&name, rebuild, scrub).map(Response::ok),
            Request::Mount {
                name,
                dir,
                loop_dev,
            } => self.mount(&name, dir, loop_dev).map(Response::ok),
            Request::Unmount { name } => self.unmount(&name).map(Response::ok),
            Request::Scrub {
                name,
                repair,
                background,
                cancel,
            } => self.scrub(&name, repair, background, cancel),
            Request::Stats { name } => self.io_stats(name.as_deref()),
        };
        // What the command caused (a member failed, a scrub's mismatches,
        // the engine chosen at start) is in the event log, alerted, before
        // the caller hears back: `raidctl events` right after shows it.
        self.process_events();
        r.unwrap_or_else(|e| Response::err(&e))
    }

    /// The running array `name`; else why not: unknown here (exit 3, as
    /// without a daemon) or known and stopped (exit 4).
    fn served(&self, name: &str) -> Result<Arc<Served>> {
        if let Some(s) = self.arrays.lock().get(name).cloned() {
            return Ok(s);
        }
        if !self.state.exists(name) {
            self.state.load(name)?;
        }
        Err(CliError::refused(format!(
            "array '{name}' is not running (raidctl start {name})"
        )))
    }

    /// Starts the array's rebuild if a slot wants one and no copy runs.
    fn kick_rebuild(&self, s: &Arc<Served>) {
        s.array.kick_rebuild(&self.rebuild_opts);
    }

    /// Logs every new event of every array, queues the alert-worthy ones
    /// and runs the hook.
    fn process_events(&self) {
        // The monitor and request handlers both call this: one at a time,
        // so the log keeps the events' order.
        let _one = self.events_lock.lock();
        let arrays: Vec<Arc<Served>> = self.arrays.lock().values().cloned().collect();
        for s in arrays {
            self.process_events_of(&s);
        }
    }

    /// Callers hold `events_lock`.
    fn process_events_of(&self, s: &Served) {
        let seen = s.events_seen.load(Ordering::Acquire);
        let new = s.array.event_log_with_states_from(seen);
        s.events_seen.store(seen + new.len(), Ordering::Release);
        for (t, ev, state) in &new {
            // A spare the array dropped (it could not be written): the
            // record follows, so a restart does not offer it again.
            // Where it cannot be written, `save_record` logs it and the
            // monitor writes it again.
            if matches!(ev, raid_core::array::ArrayEvent::SpareDropped { .. })
                && s.record_spares(None)
            {
                let _ = self.save_record(s);
            }
            let unix = t
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let members = s.record.lock().members.clone();
            let r = crate::eventlog::record_of(&s.array, ev, *state, unix, &members);
            if let Err(e) = crate::eventlog::append(&self.state, &r) {
                tracing::error!("event log: {e}");
            }
            if let Some(cfg) = &self.alerts {
                let min = cfg
                    .min_severity()
                    .unwrap_or(raid_core::array::Severity::Warning);
                // An event below the threshold that puts a slot back in
                // service goes with the array's alerts still queued: the
                // message then says so, not only that the member failed.
                let follows = crate::alerts::follows_up(&r.event)
                    && crate::alerts::queued_for(&self.state, &r.array);
                if ev.severity() >= min || follows {
                    let seq = self.alert_seq.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = crate::alerts::enqueue(&self.state, &r, seq) {
                        tracing::error!("alert queue: {e}");
                    }
                }
                if let Some(hook) = cfg.hook.clone() {
                    self.hooks.run(hook, r);
                }
            }
        }
    }
}

/// What `take_spare` did.
enum SpareTurn {
    /// The spare (named) took the slot.
    Took(usize, String),
    /// A spare waits for the rebuild or hot replace (said) of a slot to
    /// end.
    Waits(&'static str, usize),
    /// No spare, no failed slot, or the activation failed (logged).
    Nothing,
}

impl Daemon {
    /// A spare takes the first failed slot while nothing else is being
    /// rebuilt; on RAID6 also while a rebuild runs or waits to, whose pass
    /// it joins (one pass of reads for both). The monitor's, every turn;
    /// `start`'s and `fail`'s, so that they say what happened, not what
    /// may.
    fn take_spare(&self, s: &Served) -> SpareTurn {
        if s.array.spares().is_empty() {
            return SpareTurn::Nothing;
        }
        let copy = s.array.copy_progress();
        let joins = s.array.geometry().level == raid_core::layout::Level::Raid6
            && copy
                .as_ref()
                .is_none_or(|c| c.kind == raid_core::array::CopyKind::Rebuild);
        let pending = s.array.rebuilding_slots().first().copied();
        if !joins {
            match (&copy, pending) {
                (Some(c), _) if c.kind != raid_core::array::CopyKind::Rebuild => {
                    return SpareTurn::Waits("hot replace", c.slot)
                }
                (Some(c), _) => return SpareTurn::Waits("rebuild", c.slot),
                (None, Some(k)) => return SpareTurn::Waits("rebuild", k),
                (None, None) => {}
            }
        }
        let Some(f) = s
            .array
            .slots()
            .into_iter()
            .find(|x| x.state == raid_core::metadata::SlotState::Failed)
        else {
            return SpareTurn::Nothing;
        };
        match s.array.activate_spare(f.slot) {
            Ok(Some(spare)) => {
                tracing::warn!(array = s.array.name(), slot = f.slot, spare = %spare, "spare activated");
                // A hold (a member left to the operator) was the old
                // device's: the spare, if it is a network member that
                // blinks later, comes back by itself like any.
                self.reconnects.release(s.array.name(), f.slot);
                self.reconnects.forget_returns(s.array.name(), f.slot);
                let member = s.array.member_of(f.slot);
                if let Some(m) = member.filter(|m| m.identity() == spare) {
                    s.record_slot(f.slot, m.device_key(), Path::new(&spare));
                }
                s.record_spares(None);
                let _ = self.save_record(s);
                SpareTurn::Took(f.slot, spare)
            }
            Ok(None) => SpareTurn::Nothing,
            Err(e) => {
                tracing::error!(array = s.array.name(), "spare activation failed: {e}");
                SpareTurn::Nothing
            }
        }
    }
}

/// Scrub options: `repair` as asked, rate from RAIDCTL_SCRUB_RATE (bytes
/// per second, e.g. 200M), for the command and the schedule alike.
fn scrub_options(repair: bool) -> raid_core::array::ScrubOptions {
    let rate_limit = std::env::var("RAIDCTL_SCRUB_RATE")
        .ok()
        .and_then(|v| parse_size(&v).ok());
    raid_core::array::ScrubOptions {
        repair,
        rate_limit,
        ..Default::default()
    }
}

pub fn describe(c: &Content) -> String {
    match c {
        Content::Nothing => "nothing recognisable".into(),
        Content::Filesystem(k) => format!("a {k} filesystem"),
        Content::PartitionTable(k) => format!("a {k} partition table"),
        Content::Array { name, uuid } => format!("metadata of array '{name}' (uuid {uuid})"),
        Content::UnreadableArray(why) => format!(
            "array metadata this version cannot read ({why}): a member of an array that a later raidctl made, or whose metadata is damaged"
        ),
    }
}

/// "64K", "1M", "4096", "2G" -> bytes.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a size: write a number with an optional K, M, G or T suffix (64K, 1M)"))
}
