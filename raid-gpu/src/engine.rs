//! The GPU parity engine: WGSL compute on wgpu.
//!
//! A call (one stripe or a batch of them) becomes a list of *jobs* (source
//! chunks, output chunks, and per output a row of GF(2^8) coefficients from
//! [`crate::plan`]). Jobs are cut into *sub-batches* that fit the device's
//! buffer limits ([`crate::pack`]), and each sub-batch goes through one of a
//! small ring of *slots*: a mapped staging buffer the CPU fills, device
//! buffers for the plan, the sources and the outputs, and a read-back
//! buffer. While the GPU computes sub-batch k, the CPU is already filling
//! k+1 and k+2, and reads k's results back only when it needs the slot
//! again, so uploads, compute and read-backs overlap.
//!
//! Only the sources and the outputs cross the bus: a RAID6 generation sends
//! n data chunks and brings back 2; a two-chunk recovery sends the present
//! chunks a row reads and brings back 2.
//!
//! A GPU that reports an error, loses its device or hangs past
//! [`WAIT_LIMIT`] is never used again by this engine: every later call
//! returns [`ParityError::EngineFailed`] at once, and the selecting engine
//! repeats the work on the CPU.

use crate::adapter::{self, AdapterSummary};
use crate::pack::{self, Limits, Shape};
use crate::plan::{self, Row};
use crate::GpuError;
use raid_core::parity::{
    ro, validate, validate_gen, validate_gen_batch, validate_recover_batch, GenJob, ParityEngine,
    ParityError, ParityKind, RecoverJob,
};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Sub-batches in flight at once: one being filled, one computing, one
/// being read back.
const DEPTH: usize = 3;

/// Smallest slot buffer; slots grow to what a sub-batch needs, up to the
/// device limit or [`DEFAULT_SLOT_MAX`].
const SLOT_MIN: u64 = 1 << 20;

/// Largest slot buffer unless `RAID_GPU_SLOT_MIB` says otherwise: big enough
/// that per-submission costs vanish against the transfer, small enough that
/// DEPTH slots of four buffers stay a modest share of host and GPU memory.
const DEFAULT_SLOT_MAX: u64 = 32 << 20;

/// How long one sub-batch may take before the GPU is called hung. Generous
/// because a CPU adapter (lavapipe) under a loaded test machine is slow.
pub const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// The most stripes [`GpuEngine::preferred_batch`] asks the array for.
pub const MAX_PREFERRED_BATCH: usize = 64;

/// Threads per workgroup (the shader's `@workgroup_size`).
const GROUP: u32 = 64;

/// Bytes one shader thread handles per step (a `vec4<u32>`).
const UNIT: usize = 16;

/// A unit of work: outputs that are combinations of sources, all of one
/// length. `rows[k]` is output k, its terms indexing `srcs`.
pub(crate) struct Job<'a> {
    pub srcs: Vec<&'a [u8]>,
    pub outs: Vec<&'a mut [u8]>,
    pub rows: Vec<Row>,
}

impl Job<'_> {
    fn shape(&self) -> Shape {
        Shape {
            srcs: self.srcs.len(),
            outs: self.outs.len(),
            terms: self.rows.iter().map(|r| r.sources().len()).sum(),
            len: self.outs[0].len(),
        }
    }
}

/// Builds the job for a stripe given its chunks, the rows (over stripe
/// chunk indices) and which chunks are written. Only chunks some row reads
/// are uploaded.
fn stripe_job<'a>(chunks: &'a mut [&mut [u8]], rows: Vec<(usize, Row)>) -> Job<'a> {
    let written: Vec<usize> = rows.iter().map(|r| r.0).collect();
    let mut read: Vec<usize> = rows.iter().flat_map(|r| r.1.sources()).collect();
    read.sort_unstable();
    read.dedup();
    let mut src_at = vec![usize::MAX; chunks.len()];
    let mut srcs = Vec::with_capacity(read.len());
    let mut outs_by_chunk: Vec<(usize, &'a mut [u8])> = Vec::new();
    for (i, c) in chunks.iter_mut().enumerate() {
        if written.contains(&i) {
            outs_by_chunk.push((i, &mut **c));
        } else if read.binary_search(&i).is_ok() {
            src_at[i] = srcs.len();
            srcs.push(&**c);
        }
    }
    let mut outs = Vec::with_capacity(rows.len());
    let mut out_rows = Vec::with_capacity(rows.len());
    for (chunk, row) in rows {
        let k = outs_by_chunk
            .iter()
            .position(|o| o.0 == chunk)
            .expect("written");
        outs.push(std::mem::take(&mut outs_by_chunk[k].1));
        out_rows.push(match row {
            Row::Linear(t) => Row::Linear(t.into_iter().map(|(i, c)| (src_at[i], c)).collect()),
            // Horner reads D0..Dn-1 in order; they were uploaded first and in order.
            Row::Horner(n) => {
                debug_assert!((0..n).all(|i| src_at[i] == i));
                Row::Horner(n)
            }
        });
    }
    Job {
        srcs,
        outs,
        rows: out_rows,
    }
}

/// One ring entry: the buffers one sub-batch passes through.
struct Slot {
    staging: wgpu::Buffer,
    plan: wgpu::Buffer,
    input: wgpu::Buffer,
    output: wgpu::Buffer,
    readback: wgpu::Buffer,
    bind: wgpu::BindGroup,
    /// Mapping state of `staging` / `readback`: 0 pending, 1 mapped, 2 failed.
    staging_mapped: Arc<AtomicU8>,
    readback_mapped: Arc<AtomicU8>,
    in_flight: Option<InFlight>,
}

/// What a submitted sub-batch owes its caller: where each output piece
/// lies in the read-back buffer.
struct InFlight {
    index: wgpu::SubmissionIndex,
    out_bytes: u64,
    /// (job, output, byte range of the chunk, offset in the read-back buffer)
    copies: Vec<(usize, usize, Range<usize>, u64)>,
}

/// What the engine has moved and how deep its ring has run, since it was
/// opened: for status, the benchmark, and the tests that hold the ring to
/// actually overlapping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuStats {
    /// Engine calls that reached the GPU.
    pub calls: u64,
    /// Sub-batches submitted (one submission each).
    pub sub_batches: u64,
    /// Bytes sent to the GPU: sources and plans.
    pub bytes_up: u64,
    /// Bytes read back: outputs.
    pub bytes_down: u64,
    /// Most sub-batches in flight at once.
    pub max_in_flight: u64,
}

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    sub_batches: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    max_in_flight: AtomicU64,
}

/// RAID5/RAID6 parity on a GPU through wgpu.
pub struct GpuEngine {
    device: wgpu::Device,
    queue: wgpu::Queue,
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    summary: AdapterSummary,
    limits: Limits,
    slots: Mutex<Vec<Option<Slot>>>,
    /// The first error the device reported (uncaptured error, device lost,
    /// hang). Once set the engine refuses all work.
    fault: Arc<Mutex<Option<String>>>,
    counters: Counters,
    /// Fault injection: flip a bit in every output piece read back.
    flip_bits: std::sync::atomic::AtomicBool,
}

impl GpuEngine {
    /// Opens the adapter the environment chooses (see [`crate::adapter`])
    /// and compiles the shader. Buffers of a sub-batch hold at most
    /// `RAID_GPU_SLOT_MIB` MiB (default 32), or less if the device says so.
    pub fn new() -> Result<GpuEngine, GpuError> {
        let slot_max = std::env::var("RAID_GPU_SLOT_MIB")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(|m| m << 20)
            .unwrap_or(DEFAULT_SLOT_MAX);
        GpuEngine::with_buffer_limit(slot_max)
    }

    /// As [`GpuEngine::new`], with sub-batch buffers of at most `bytes`
    /// (at least 1 MiB): small limits force many sub-batches through the
    /// ring, which is what the tests use to exercise it.
    pub fn with_buffer_limit(bytes: u64) -> Result<GpuEngine, GpuError> {
        let slot_max = bytes.max(SLOT_MIN);
        let o = adapter::open()?;
        let fault: Arc<Mutex<Option<String>>> = Arc::default();
        {
            let f = fault.clone();
            o.device
                .on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                    tracing::error!("GPU error: {e}");
                    f.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e.to_string());
                }));
            let f = fault.clone();
            o.device.set_device_lost_callback(move |reason, msg| {
                tracing::warn!("GPU device lost ({reason:?}): {msg}");
                f.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(format!("device lost ({reason:?}) {msg}"));
            });
        }
        let module = o.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("raid-gpu combine"),
            source: wgpu::ShaderSource::Wgsl(include_str!("combine.wgsl").into()),
        });
        let pipeline = o
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("raid-gpu combine"),
                layout: None,
                module: &module,
                entry_point: Some("combine"),
                compilation_options: Default::default(),
                cache: None,
            });
        let layout = pipeline.get_bind_group_layout(0);
        // Every bound buffer within the binding limit; the staging buffer
        // (plan + sources, up to twice that) within the buffer limit.
        let buffer_cap = slot_max
            .min(o.limits.max_storage_buffer_binding_size)
            .min(o.limits.max_buffer_size / 2);
        let limits = Limits {
            buffer_bytes: buffer_cap,
            tasks: o.limits.max_compute_workgroups_per_dimension as usize,
        };
        if let Some(e) = fault.lock().unwrap().clone() {
            return Err(GpuError::Device(format!("shader setup failed: {e}")));
        }
        Ok(GpuEngine {
            device: o.device,
            queue: o.queue,
            pipeline,
            layout,
            summary: o.summary,
            limits,
            slots: Mutex::new((0..DEPTH).map(|_| None).collect()),
            fault,
            counters: Counters::default(),
            flip_bits: Default::default(),
        })
    }

    /// The adapter this engine runs on.
    pub fn adapter(&self) -> &AdapterSummary {
        &self.summary
    }

    /// The most bytes one buffer of a sub-batch holds (from the device's
    /// limits and `RAID_GPU_SLOT_MIB`).
    pub fn buffer_limit(&self) -> u64 {
        self.limits.buffer_bytes
    }

    pub fn stats(&self) -> GpuStats {
        let c = &self.counters;
        GpuStats {
            calls: c.calls.load(Ordering::Relaxed),
            sub_batches: c.sub_batches.load(Ordering::Relaxed),
            bytes_up: c.bytes_up.load(Ordering::Relaxed),
            bytes_down: c.bytes_down.load(Ordering::Relaxed),
            max_in_flight: c.max_in_flight.load(Ordering::Relaxed),
        }
    }

    /// Lets the device deliver pending callbacks (device lost, errors)
    /// without waiting, then says why the engine stopped working, if it did.
    pub fn check(&self) -> Option<String> {
        // Only when no call is using the device: that call will see the fault.
        if let Ok(_idle) = self.slots.try_lock() {
            let _ = self.device.poll(wgpu::PollType::Poll);
        }
        self.fault()
    }

    /// Why the engine stopped working, if it did.
    pub fn fault(&self) -> Option<String> {
        self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Fault injection: from now on, flip the lowest bit of the first byte
    /// of every output piece read back, as failing GPU memory would. What
    /// the tests of result verification use; never set otherwise.
    pub fn inject_bit_flips(&self, on: bool) {
        self.flip_bits.store(on, Ordering::Relaxed);
    }

    /// Destroys the device, as a driver reset or a GPU falling off the bus
    /// would: what the fallback tests use to lose the GPU for real.
    pub fn destroy_device(&self) {
        self.device.destroy();
    }

    fn failed(&self, e: GpuError) -> ParityError {
        let reason = e.to_string();
        self.fault
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(reason.clone());
        ParityError::EngineFailed {
            engine: self.name(),
            reason,
        }
    }

    /// Runs the jobs to completion.
    fn run(&self, jobs: &mut [Job<'_>]) -> Result<(), ParityError> {
        if let Some(f) = self.fault() {
            return Err(ParityError::EngineFailed {
                engine: self.name(),
                reason: f,
            });
        }
        if jobs.is_empty() {
            return Ok(());
        }
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let shapes: Vec<Shape> = jobs.iter().map(Job::shape).collect();
        let batches = pack::pack(&shapes, &self.limits);
        let mut slots = self.slots.lock().map_err(|_| ParityError::EngineFailed {
            engine: self.name(),
            reason: "an earlier call panicked while using the GPU".into(),
        })?;
        let result = (|| {
            for (k, batch) in batches.iter().enumerate() {
                let slot = &mut slots[k % DEPTH];
                if let Some(s) = slot.as_mut() {
                    self.retire(s, jobs)?;
                }
                self.submit(slot, batch, jobs)?;
                let c = &self.counters;
                c.sub_batches.fetch_add(1, Ordering::Relaxed);
                c.bytes_up
                    .fetch_add(batch.plan_bytes() + batch.in_bytes, Ordering::Relaxed);
                c.bytes_down.fetch_add(batch.out_bytes, Ordering::Relaxed);
                let depth = slots
                    .iter()
                    .filter(|s| s.as_ref().is_some_and(|s| s.in_flight.is_some()))
                    .count();
                c.max_in_flight.fetch_max(depth as u64, Ordering::Relaxed);
            }
            for k in batches.len()..batches.len() + DEPTH {
                if let Some(s) = slots[k % DEPTH].as_mut() {
                    self.retire(s, jobs)?;
                }
            }
            match self.fault() {
                Some(f) => Err(GpuError::Lost(f)),
                None => Ok(()),
            }
        })();
        result.map_err(|e| {
            // The slots' mapping states are unknown now; drop them.
            slots.iter_mut().for_each(|s| *s = None);
            self.failed(e)
        })
    }

    fn new_slot(&self, plan: u64, input: u64, output: u64) -> Slot {
        let size = |need: u64| {
            need.next_power_of_two()
                .max(SLOT_MIN)
                .min(self.limits.buffer_bytes)
        };
        let (cap_plan, cap_in, cap_out) = (size(plan), size(input), size(output));
        let buf = |label, size, usage, mapped| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: mapped,
            })
        };
        use wgpu::BufferUsages as U;
        let staging = buf(
            "staging",
            cap_plan + cap_in,
            U::MAP_WRITE | U::COPY_SRC,
            true,
        );
        let plan_b = buf("plan", cap_plan, U::STORAGE | U::COPY_DST, false);
        let input = buf("input", cap_in, U::STORAGE | U::COPY_DST, false);
        let output = buf("output", cap_out, U::STORAGE | U::COPY_SRC, false);
        let readback = buf("readback", cap_out, U::MAP_READ | U::COPY_DST, false);
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("raid-gpu slot"),
            layout: &self.layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: plan_b.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: input.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: output.as_entire_binding(),
                },
            ],
        });
        Slot {
            staging,
            plan: plan_b,
            input,
            output,
            readback,
            bind,
            staging_mapped: Arc::new(AtomicU8::new(1)),
            readback_mapped: Arc::new(AtomicU8::new(0)),
            in_flight: None,
        }
    }

    /// Lays a sub-batch out in a slot's staging buffer and submits copy-in,
    /// compute and copy-out as one command buffer.
    fn submit(
        &self,
        slot: &mut Option<Slot>,
        batch: &pack::Batch,
        jobs: &[Job<'_>],
    ) -> Result<(), GpuError> {
        let plan_bytes = batch.plan_bytes();
        let plan_pad = plan_bytes.next_multiple_of(256);
        let fits = |s: &Slot| {
            s.plan.size() >= plan_pad
                && s.input.size() >= batch.in_bytes
                && s.output.size() >= batch.out_bytes
        };
        if !slot.as_ref().is_some_and(fits) {
            *slot = Some(self.new_slot(plan_pad, batch.in_bytes, batch.out_bytes));
        }
        let s = slot.as_mut().expect("just made");
        if s.staging_mapped.load(Ordering::Acquire) != 1 {
            return Err(GpuError::Lost(
                "the staging buffer could not be mapped".into(),
            ));
        }
        // The plan: tasks first (8 words each), then their terms.
        let mut words: Vec<u32> = Vec::with_capacity((plan_bytes / 4) as usize);
        let mut terms: Vec<u32> = Vec::new();
        let term_base = batch.tasks as u32 * 8;
        let mut copies = Vec::with_capacity(batch.tasks);
        let (mut in_at, mut out_at) = (0u64, 0u64);
        let mut view = s
            .staging
            .get_mapped_range_mut(..)
            .map_err(|e| GpuError::Lost(format!("staging buffer: {e}")))?;
        for piece in &batch.pieces {
            let job = &jobs[piece.job];
            let r = piece.range.clone();
            let units = (r.len() / UNIT) as u32;
            let mut src_units = Vec::with_capacity(job.srcs.len());
            for src in &job.srcs {
                let at = (plan_pad + in_at) as usize;
                view.slice(at..at + r.len())
                    .copy_from_slice(&src[r.clone()]);
                src_units.push((in_at / UNIT as u64) as u32);
                in_at += r.len() as u64;
            }
            for (k, row) in job.rows.iter().enumerate() {
                let first = term_base + terms.len() as u32;
                let (n, horner) = match row {
                    Row::Linear(t) => {
                        for &(i, c) in t {
                            terms.extend([src_units[i], u32::from(c)]);
                        }
                        (t.len() as u32, 0)
                    }
                    Row::Horner(n) => {
                        for &u in &src_units[..*n] {
                            terms.extend([u, 0]);
                        }
                        (*n as u32, 1)
                    }
                };
                words.extend([
                    (out_at / UNIT as u64) as u32,
                    units,
                    first,
                    n,
                    horner,
                    0,
                    0,
                    0,
                ]);
                copies.push((piece.job, k, r.clone(), out_at));
                out_at += r.len() as u64;
            }
        }
        words.extend(terms);
        debug_assert_eq!(words.len() as u64 * 4, plan_bytes);
        debug_assert_eq!((in_at, out_at), (batch.in_bytes, batch.out_bytes));
        let plan_le: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        view.slice(..plan_le.len()).copy_from_slice(&plan_le);
        drop(view);
        s.staging.unmap();
        s.staging_mapped.store(0, Ordering::Release);

        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("raid-gpu sub-batch"),
            });
        enc.copy_buffer_to_buffer(&s.staging, 0, &s.plan, 0, plan_bytes);
        enc.copy_buffer_to_buffer(&s.staging, plan_pad, &s.input, 0, batch.in_bytes);
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("raid-gpu combine"),
                timestamp_writes: None,
            });
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &s.bind, &[]);
            let units = batch.max_len / UNIT;
            let x = (units as u32)
                .div_ceil(GROUP)
                .clamp(1, self.limits_groups());
            pass.dispatch_workgroups(x, batch.tasks as u32, 1);
        }
        enc.copy_buffer_to_buffer(&s.output, 0, &s.readback, 0, batch.out_bytes);
        let index = self.queue.submit([enc.finish()]);
        let flag = s.readback_mapped.clone();
        flag.store(0, Ordering::Release);
        s.readback
            .slice(..batch.out_bytes)
            .map_async(wgpu::MapMode::Read, move |r| {
                flag.store(if r.is_ok() { 1 } else { 2 }, Ordering::Release)
            });
        let flag = s.staging_mapped.clone();
        s.staging
            .slice(..)
            .map_async(wgpu::MapMode::Write, move |r| {
                flag.store(if r.is_ok() { 1 } else { 2 }, Ordering::Release)
            });
        s.in_flight = Some(InFlight {
            index,
            out_bytes: batch.out_bytes,
            copies,
        });
        Ok(())
    }

    fn limits_groups(&self) -> u32 {
        u32::try_from(self.limits.tasks).unwrap_or(u32::MAX)
    }

    /// Waits for a slot's sub-batch and copies its outputs to the caller.
    fn retire(&self, s: &mut Slot, jobs: &mut [Job<'_>]) -> Result<(), GpuError> {
        let Some(f) = s.in_flight.take() else {
            return Ok(());
        };
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(f.index),
                timeout: Some(WAIT_LIMIT),
            })
            .map_err(|e| GpuError::Lost(format!("waiting for the GPU: {e}")))?;
        if let Some(e) = self.fault() {
            return Err(GpuError::Lost(e));
        }
        if s.readback_mapped.load(Ordering::Acquire) != 1 {
            return Err(GpuError::Lost(
                "the read-back buffer could not be mapped".into(),
            ));
        }
        {
            let view = s
                .readback
                .get_mapped_range(..f.out_bytes)
                .map_err(|e| GpuError::Lost(format!("read-back buffer: {e}")))?;
            for (j, k, range, at) in f.copies {
                let at = at as usize;
                jobs[j].outs[k][range.clone()].copy_from_slice(&view[at..at + range.len()]);
                if self.flip_bits.load(Ordering::Relaxed) {
                    jobs[j].outs[k][range.start] ^= 1;
                }
            }
        }
        s.readback.unmap();
        s.readback_mapped.store(0, Ordering::Release);
        Ok(())
    }
}

impl ParityEngine for GpuEngine {
    fn name(&self) -> String {
        format!("gpu/{}", self.summary.name)
    }

    /// Enough stripes for 16 MiB of data per call (at most 64): one
    /// submission's fixed cost then weighs little against its transfer.
    fn preferred_batch(&self, stripe_data_bytes: u64) -> usize {
        ((16u64 << 20) / stripe_data_bytes.max(1)).clamp(1, MAX_PREFERRED_BATCH as u64) as usize
    }

    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) -> Result<(), ParityError> {
        validate_gen(ParityKind::P, data, &[p])?;
        self.run(&mut [Job {
            srcs: data.to_vec(),
            outs: vec![p],
            rows: plan::gen_rows(ParityKind::P, data.len()),
        }])
    }

    fn gen_pq(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> Result<(), ParityError> {
        validate_gen(ParityKind::PQ, data, &[p, q])?;
        self.run(&mut [Job {
            srcs: data.to_vec(),
            outs: vec![p, q],
            rows: plan::gen_rows(ParityKind::PQ, data.len()),
        }])
    }

    fn recover(
        &self,
        kind: ParityKind,
        chunks: &mut [&mut [u8]],
        missing: &[usize],
    ) -> Result<(), ParityError> {
        validate(kind, &ro(chunks), missing)?;
        let n = chunks.len() - kind.parity_chunks();
        let rows = plan::recover_rows(kind, n, missing);
        if rows.is_empty() {
            return Ok(());
        }
        self.run(&mut [stripe_job(chunks, rows)])
    }

    fn gen_batch(&self, kind: ParityKind, jobs: &mut [GenJob<'_>]) -> Result<(), ParityError> {
        validate_gen_batch(kind, jobs)?;
        let mut work: Vec<Job> = jobs
            .iter_mut()
            .map(|j| Job {
                rows: plan::gen_rows(kind, j.data.len()),
                srcs: j.data.clone(),
                outs: j.parity.iter_mut().map(|p| &mut **p).collect(),
            })
            .collect();
        self.run(&mut work)
    }

    fn recover_batch(
        &self,
        kind: ParityKind,
        jobs: &mut [RecoverJob<'_>],
    ) -> Result<(), ParityError> {
        validate_recover_batch(kind, jobs)?;
        let mut work: Vec<Job> = jobs
            .iter_mut()
            .filter(|j| !j.missing.is_empty())
            .map(|j| {
                let n = j.chunks.len() - kind.parity_chunks();
                let rows = plan::recover_rows(kind, n, &j.missing);
                stripe_job(&mut j.chunks, rows)
            })
            .collect();
        self.run(&mut work)
    }
}
