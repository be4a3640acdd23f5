//! Choosing between the GPU and CPU engines, per call, and stepping aside
//! when the GPU fails.
//!
//! - `cpu`: the CPU engine only; no GPU is opened.
//! - `gpu`: every call on the GPU (any adapter, CPU ones included: that is
//!   how CI runs the shaders on lavapipe), the CPU when it is missing or lost.
//! - `auto`: the GPU only when a real (non-CPU) adapter is present and the
//!   call carries at least [`Selection::threshold_bytes`] of data, a figure
//!   measured when the engine starts by timing both engines on the array's
//!   own stripe shape; and only when the GPU is idle, so a small call never
//!   queues behind a large one. Everything else runs on the CPU.
//!
//! When the GPU fails (an error, a lost device, a hang), the call that saw
//! it is repeated on the CPU (inputs are never modified and every output is
//! rewritten, so the repeat is exact), the GPU is never used again by this
//! engine, and the fallback hook fires once, so the array logs an event.

use crate::engine::MAX_PREFERRED_BATCH;
use crate::{calibrate, verify, GpuEngine};
use raid_core::parity::{CpuEngine, GenJob, ParityEngine, ParityError, ParityKind, RecoverJob};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The operator's choice, from `--parity` or the config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParityMode {
    Cpu,
    Gpu,
    Auto,
}

impl ParityMode {
    pub fn name(self) -> &'static str {
        match self {
            ParityMode::Cpu => "cpu",
            ParityMode::Gpu => "gpu",
            ParityMode::Auto => "auto",
        }
    }
}

impl std::str::FromStr for ParityMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(ParityMode::Cpu),
            "gpu" => Ok(ParityMode::Gpu),
            "auto" => Ok(ParityMode::Auto),
            _ => Err(format!("parity engine '{s}' is not one of cpu, gpu, auto")),
        }
    }
}

impl std::fmt::Display for ParityMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The stripe shape `auto` calibrates with: the array's own.
#[derive(Clone, Copy, Debug)]
pub struct StripeShape {
    pub kind: ParityKind,
    pub data_chunks: usize,
    pub chunk: usize,
}

/// The GPU stopped serving; parity moved to the CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fallback {
    pub from: String,
    pub to: String,
    pub reason: String,
}

type Hook = Box<dyn Fn(Fallback) + Send + Sync>;

/// What `status` shows about the engine.
#[derive(Clone, Debug, Default)]
pub struct EngineReport {
    pub mode: String,
    /// The engine serving calls now, e.g. "gpu/NVIDIA H200" or "cpu/avx2".
    pub engine: String,
    /// The GPU adapter opened, if any.
    pub adapter: Option<String>,
    /// `auto`: data bytes per call from which the GPU is used (None: never).
    pub threshold_bytes: Option<u64>,
    /// Why the GPU is not in use, if it is not.
    pub note: Option<String>,
    pub gpu_calls: u64,
    pub cpu_calls: u64,
}

/// The parity engine the array runs: one of the two, per call.
pub struct Selection {
    mode: ParityMode,
    cpu: CpuEngine,
    gpu: Option<Arc<GpuEngine>>,
    threshold: Option<u64>,
    note: Mutex<Option<String>>,
    lost: AtomicBool,
    gpu_busy: AtomicBool,
    /// GPU calls so far, for sampling; verify one in `verify_every`.
    gpu_seq: AtomicU64,
    verify_every: AtomicU64,
    gpu_calls: AtomicU64,
    cpu_calls: AtomicU64,
    hook: Mutex<Option<Hook>>,
    /// A fallback that happened before a hook was set (no GPU at start in
    /// `gpu` mode): delivered when one is.
    pending: Mutex<Option<Fallback>>,
    /// The array's level computes no parity (see [`Selection::no_parity`]).
    parity_free: bool,
}

impl Selection {
    /// Builds the engine for `mode`. Never fails: without a usable GPU it
    /// is the CPU engine, with the reason in [`Selection::report`].
    pub fn new(mode: ParityMode, shape: StripeShape) -> Selection {
        let cpu_adapter_ok = std::env::var("RAID_GPU_AUTO_CPU_ADAPTER").is_ok_and(|v| v == "1");
        Selection::with_policy(mode, shape, cpu_adapter_ok)
    }

    /// For an array whose level computes no parity (RAID0/1/10): the
    /// operator's choice is kept and shown, no GPU is opened, and the CPU
    /// engine stands by for nothing.
    pub fn no_parity(mode: ParityMode, why: impl Into<String>) -> Selection {
        let mut s = Selection::bare(mode);
        *s.note.get_mut().unwrap() = Some(why.into());
        s.parity_free = true;
        s
    }

    fn bare(mode: ParityMode) -> Selection {
        Selection {
            mode,
            cpu: CpuEngine::new(),
            gpu: None,
            threshold: None,
            note: Mutex::new(None),
            lost: AtomicBool::new(false),
            gpu_busy: AtomicBool::new(false),
            gpu_seq: AtomicU64::new(0),
            verify_every: AtomicU64::new(verify::verify_every_from_env()),
            gpu_calls: AtomicU64::new(0),
            cpu_calls: AtomicU64::new(0),
            hook: Mutex::new(None),
            pending: Mutex::new(None),
            parity_free: false,
        }
    }

    /// As [`Selection::new`]; `cpu_adapter_ok` lets `auto` calibrate and
    /// use a CPU adapter (what `RAID_GPU_AUTO_CPU_ADAPTER=1` does), so the
    /// measuring and routing can be tested on a machine without a GPU.
    pub fn with_policy(mode: ParityMode, shape: StripeShape, cpu_adapter_ok: bool) -> Selection {
        let mut s = Selection::bare(mode);
        if mode == ParityMode::Cpu {
            return s;
        }
        let gpu = match GpuEngine::new() {
            Ok(g) => Arc::new(g),
            Err(e) => {
                let why = format!("no GPU: {e}");
                if mode == ParityMode::Gpu {
                    tracing::warn!(mode = %mode, "{why}; parity runs on the CPU");
                } else {
                    tracing::info!(mode = %mode, "{why}; parity runs on the CPU");
                }
                if mode == ParityMode::Gpu {
                    *s.pending.get_mut().unwrap() = Some(Fallback {
                        from: "gpu".into(),
                        to: s.cpu.name(),
                        reason: why.clone(),
                    });
                }
                *s.note.get_mut().unwrap() = Some(why);
                return s;
            }
        };
        if mode == ParityMode::Auto {
            if gpu.adapter().is_cpu && !cpu_adapter_ok {
                *s.note.get_mut().unwrap() = Some(format!(
                    "the only GPU adapter is a CPU one ({}): auto keeps parity on the CPU engine",
                    gpu.adapter().name
                ));
                return s;
            }
            let cal = calibrate::calibrate(&s.cpu, &*gpu, shape);
            s.threshold = cal
                .threshold_stripes
                .map(|n| n as u64 * (shape.data_chunks * shape.chunk) as u64);
            if s.threshold.is_none() {
                *s.note.get_mut().unwrap() = Some(format!(
                    "the CPU engine was faster at every batch measured ({} stripes at most)",
                    cal.samples.last().map(|x| x.stripes).unwrap_or(0)
                ));
            }
        }
        s.gpu = Some(gpu);
        s
    }

    /// Wires the fallback hook (the array's event log). A fallback that has
    /// already happened is delivered now.
    pub fn on_fallback(&self, hook: impl Fn(Fallback) + Send + Sync + 'static) {
        if let Some(f) = self.pending.lock().unwrap().take() {
            hook(f);
        }
        *self.hook.lock().unwrap() = Some(Box::new(hook));
    }

    pub fn mode(&self) -> ParityMode {
        self.mode
    }

    /// The GPU engine, while it is in use.
    pub fn gpu(&self) -> Option<&Arc<GpuEngine>> {
        self.gpu
            .as_ref()
            .filter(|_| !self.lost.load(Ordering::Acquire))
    }

    /// Data bytes per call from which `auto` uses the GPU.
    pub fn threshold_bytes(&self) -> Option<u64> {
        self.threshold
    }

    /// One line on why the engine is what it is, for the start event.
    pub fn describe_choice(&self) -> String {
        let r = self.report();
        let mut s = format!("mode {}", r.mode);
        if let Some(a) = &r.adapter {
            s.push_str(&format!(", adapter {a}"));
        }
        if let Some(t) = r.threshold_bytes {
            s.push_str(&format!(", GPU for calls from {t} bytes"));
        }
        if let Some(n) = &r.note {
            s.push_str(&format!(": {n}"));
        }
        s
    }

    /// Notices a GPU that was lost while no call used it (its device-lost
    /// or error callback has fired), so the fallback event and `status` do
    /// not wait for the next GPU call. Cheap: the daemon calls it every tick.
    pub fn check_health(&self) {
        if let Some(g) = self.gpu() {
            if let Some(f) = g.check() {
                self.lose(g, f);
            }
        }
    }

    pub fn report(&self) -> EngineReport {
        let engine = match (self.mode, self.gpu()) {
            _ if self.parity_free => "none".to_string(),
            (ParityMode::Gpu, Some(g)) => g.name(),
            (ParityMode::Auto, Some(g)) if self.threshold.is_some() => {
                format!("{} + {}", g.name(), self.cpu.name())
            }
            _ => self.cpu.name(),
        };
        EngineReport {
            mode: self.mode.name().into(),
            engine,
            adapter: self.gpu.as_ref().map(|g| g.adapter().to_string()),
            threshold_bytes: self.threshold,
            note: self.note.lock().unwrap().clone(),
            gpu_calls: self.gpu_calls.load(Ordering::Relaxed),
            cpu_calls: self.cpu_calls.load(Ordering::Relaxed),
        }
    }

    /// Runs `op` on the GPU if this call should go there, else (or when the
    /// GPU fails) on the CPU.
    ///
    /// `op` gets the engine and, on the GPU calls sampled for verification,
    /// the CPU engine to check the result with (see [`crate::verify`]).
    fn dispatch<T>(
        &self,
        data_bytes: u64,
        mut op: impl FnMut(&dyn ParityEngine, Option<&CpuEngine>) -> Result<T, ParityError>,
    ) -> Result<T, ParityError> {
        if let Some(gpu) = self.gpu() {
            // gpu: every call, queueing for the GPU. auto: calls above the
            // threshold, and only when the GPU is idle.
            let take = match self.mode {
                ParityMode::Gpu => true,
                _ => {
                    self.threshold.is_some_and(|t| data_bytes >= t)
                        && self
                            .gpu_busy
                            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                }
            };
            if take {
                let every = self.verify_every.load(Ordering::Relaxed);
                let seq = self.gpu_seq.fetch_add(1, Ordering::Relaxed);
                let check = (every > 0 && seq.is_multiple_of(every)).then_some(&self.cpu);
                let r = catch_unwind(AssertUnwindSafe(|| op(&**gpu, check)));
                if self.mode != ParityMode::Gpu {
                    self.gpu_busy.store(false, Ordering::Release);
                }
                match r {
                    Ok(Err(ParityError::EngineFailed { reason, .. })) => self.lose(gpu, reason),
                    Err(panic) => {
                        let what = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "panic".into());
                        self.lose(gpu, format!("the GPU path panicked: {what}"))
                    }
                    Ok(done) => {
                        self.gpu_calls.fetch_add(1, Ordering::Relaxed);
                        return done;
                    }
                }
            }
        }
        self.cpu_calls.fetch_add(1, Ordering::Relaxed);
        op(&self.cpu, None)
    }

    /// Verify the first GPU call and then one in `n` (0: never); the
    /// default comes from `RAID_GPU_VERIFY_EVERY`, else 64.
    pub fn set_verify_every(&self, n: u64) {
        self.verify_every.store(n, Ordering::Relaxed);
    }

    fn lose(&self, gpu: &GpuEngine, reason: String) {
        if self.lost.swap(true, Ordering::AcqRel) {
            return;
        }
        let ev = Fallback {
            from: gpu.name(),
            to: self.cpu.name(),
            reason: reason.clone(),
        };
        tracing::warn!(from = %ev.from, to = %ev.to, "GPU parity failed ({reason}); the CPU engine takes over");
        *self.note.lock().unwrap() = Some(format!("GPU lost: {reason}"));
        match &*self.hook.lock().unwrap() {
            Some(h) => h(ev),
            None => *self.pending.lock().unwrap() = Some(ev),
        }
    }
}

fn stripe_bytes(kind: ParityKind, s: &[&mut [u8]]) -> u64 {
    (s.len().saturating_sub(kind.parity_chunks()) * s.first().map_or(0, |c| c.len())) as u64
}

impl ParityEngine for Selection {
    fn name(&self) -> String {
        self.report().engine
    }

    /// The GPU's batch where calls go to the GPU: always in `gpu` mode; in
    /// `auto`, enough stripes to reach the threshold, if a batch can (else
    /// the CPU's one stripe, since the GPU would not be used).
    fn preferred_batch(&self, stripe_data_bytes: u64) -> usize {
        let Some(g) = self.gpu() else {
            return self.cpu.preferred_batch(stripe_data_bytes);
        };
        let gpu = g.preferred_batch(stripe_data_bytes);
        match (self.mode, self.threshold) {
            (ParityMode::Gpu, _) => gpu,
            (_, Some(t)) => {
                let need = t.div_ceil(stripe_data_bytes.max(1)) as usize;
                if need <= MAX_PREFERRED_BATCH {
                    need.max(gpu).min(MAX_PREFERRED_BATCH)
                } else {
                    self.cpu.preferred_batch(stripe_data_bytes)
                }
            }
            _ => self.cpu.preferred_batch(stripe_data_bytes),
        }
    }

    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) -> Result<(), ParityError> {
        let bytes = (data.len() * p.len()) as u64;
        self.dispatch(bytes, |e, check| {
            e.gen_p(data, p)?;
            check.map_or(Ok(()), |cpu| {
                verify::parity_matches(cpu, ParityKind::P, data, &[p])
            })
        })
    }

    fn gen_pq(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> Result<(), ParityError> {
        let bytes = (data.len() * p.len()) as u64;
        self.dispatch(bytes, |e, check| {
            e.gen_pq(data, p, q)?;
            check.map_or(Ok(()), |cpu| {
                verify::parity_matches(cpu, ParityKind::PQ, data, &[p, q])
            })
        })
    }

    /// Routed like the other calls by its bytes (a read-modify-write's few
    /// chunks: the CPU in `auto`). Not sampled for verification: checking
    /// an in-place update would need a copy of the old parity on every
    /// sampled call, and in `gpu` mode the update is the GPU's generation
    /// of the deltas, which sampling already checks on full calls. A GPU
    /// that fails leaves the parity untouched (the default computes the
    /// deltas' parity aside, then adds it), so the CPU repeats it safely.
    fn update_parity(
        &self,
        kind: ParityKind,
        deltas: &[(usize, &[u8])],
        parity: &mut [&mut [u8]],
    ) -> Result<(), ParityError> {
        let bytes = deltas.iter().map(|(_, d)| d.len() as u64).sum();
        self.dispatch(bytes, |e, _check| e.update_parity(kind, deltas, parity))
    }

    fn recover(
        &self,
        kind: ParityKind,
        chunks: &mut [&mut [u8]],
        missing: &[usize],
    ) -> Result<(), ParityError> {
        let bytes = stripe_bytes(kind, chunks);
        self.dispatch(bytes, |e, check| {
            e.recover(kind, chunks, missing)?;
            check.map_or(Ok(()), |cpu| {
                verify::recovery_matches(cpu, kind, chunks, missing)
            })
        })
    }

    fn gen_batch(&self, kind: ParityKind, jobs: &mut [GenJob<'_>]) -> Result<(), ParityError> {
        let bytes = jobs
            .iter()
            .map(|j| (j.data.len() * j.data.first().map_or(0, |c| c.len())) as u64)
            .sum();
        self.dispatch(bytes, |e, check| {
            e.gen_batch(kind, jobs)?;
            check.map_or(Ok(()), |cpu| {
                jobs.iter().try_for_each(|j| {
                    verify::parity_matches(cpu, kind, &j.data, &raid_core::parity::ro(&j.parity))
                })
            })
        })
    }

    fn recover_batch(
        &self,
        kind: ParityKind,
        jobs: &mut [RecoverJob<'_>],
    ) -> Result<(), ParityError> {
        let bytes = jobs.iter().map(|j| stripe_bytes(kind, &j.chunks)).sum();
        self.dispatch(bytes, |e, check| {
            e.recover_batch(kind, jobs)?;
            check.map_or(Ok(()), |cpu| {
                jobs.iter()
                    .filter(|j| !j.missing.is_empty())
                    .try_for_each(|j| verify::recovery_matches(cpu, kind, &j.chunks, &j.missing))
            })
        })
    }
}
