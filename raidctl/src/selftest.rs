//! `raidctl selftest`: proves on this machine, at start-up speed, that every
//! parity kernel the CPU offers gives the scalar oracle's answer, including
//! every one- and two-chunk recovery of a RAID6 stripe; and the GPU engine,
//! when wgpu finds an adapter.

use raid_core::parity::{CpuEngine, ParityEngine, ParityKind, SimdLevel};
use std::time::Instant;

/// What `selftest` found, as `--format json` prints it.
#[derive(serde::Serialize)]
pub struct Report {
    pub width: usize,
    pub chunk_bytes: usize,
    pub engines: Vec<EngineCheck>,
    /// The GPU adapter checked, if one was.
    pub gpu_adapter: Option<String>,
    /// Why no GPU was checked.
    pub gpu_not_checked: Option<String>,
    /// The engine arrays use on this CPU.
    pub chosen: String,
    pub ok: bool,
}

/// One engine's row.
#[derive(serde::Serialize)]
pub struct EngineCheck {
    pub engine: String,
    /// P+Q generation, GB/s (a rough figure; the benchmark measures).
    pub pq_gb_per_second: f64,
    pub recovery_cases: usize,
    pub ok: bool,
}

pub fn run(width: usize, chunk: usize, json: bool) -> Result<(), String> {
    if !(2..=255).contains(&width) {
        return Err(format!(
            "--width {width} is out of range: RAID6 stripes take 2 to 255 data chunks"
        ));
    }
    let oracle = CpuEngine::with_level(SimdLevel::Scalar).map_err(|e| e.to_string())?;
    let data = pseudo_random(width, chunk);
    let reference = stripe(&oracle, &data)?;
    if !json {
        out!(
            "parity self-test: {width} data chunks of {} KiB, RAID6 (P+Q, md-compatible)",
            chunk / 1024
        );
        out!(
            "{:<14} {:>10} {:>10} {:>12}",
            "level",
            "P+Q GB/s",
            "recovery",
            "result"
        );
    }
    let mut engines = Vec::new();
    let mut row = |c: EngineCheck| {
        if !json {
            out!(
                "{:<14} {:>10.2} {:>10} {:>12}",
                c.engine,
                c.pq_gb_per_second,
                format!("{} cases", c.recovery_cases),
                if c.ok { "ok" } else { "MISMATCH" }
            );
        }
        engines.push(c);
    };
    for level in SimdLevel::available() {
        let e = CpuEngine::with_level(level)
            .map_err(|e| e.to_string())?
            .single_threaded();
        row(check(&e, level.name(), &data, &reference)?);
    }
    // The GPU engine too, when an adapter is present (lavapipe counts: it
    // runs the same shader).
    let (gpu_adapter, gpu_not_checked) = match raid_gpu::GpuEngine::new() {
        Ok(g) => {
            row(check(&g, "gpu", &data, &reference)?);
            (Some(g.adapter().to_string()), None)
        }
        Err(e) => (None, Some(e.to_string())),
    };
    let report = Report {
        width,
        chunk_bytes: chunk,
        ok: engines.iter().all(|c| c.ok),
        engines,
        gpu_adapter,
        gpu_not_checked,
        chosen: CpuEngine::new().name().to_string(),
    };
    if json {
        out!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report serialises")
        );
    } else {
        match (&report.gpu_adapter, &report.gpu_not_checked) {
            (Some(a), _) => out!("gpu adapter: {a}"),
            (None, e) => out!("gpu: not checked ({})", e.as_deref().unwrap_or("")),
        }
        out!("engine chosen: {}", report.chosen);
    }
    if !report.ok {
        return Err(
            "a parity kernel disagrees with the scalar oracle: do not use this build".into(),
        );
    }
    Ok(())
}

/// One engine against the oracle's stripe: generation, then every single
/// and double loss among the first data chunks, P and Q.
fn check(
    e: &dyn ParityEngine,
    label: &str,
    data: &[Vec<u8>],
    reference: &[Vec<u8>],
) -> Result<EngineCheck, String> {
    let (width, chunk) = (data.len(), data[0].len());
    let got = stripe(e, data)?;
    // A rough speed after the warm-up call above: the best of a few
    // repetitions (the benchmark, not this, is the measurement).
    let reps = 50;
    let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    let (mut p, mut q) = (vec![0u8; chunk], vec![0u8; chunk]);
    let t = Instant::now();
    for _ in 0..reps {
        e.gen_pq(&refs, &mut p, &mut q).map_err(|e| e.to_string())?;
    }
    let rate = (reps * width * chunk) as f64 / t.elapsed().as_secs_f64() / 1e9;
    let mut ok = got == reference;
    let mut cases = 0;
    let n = width + 2;
    let picks: Vec<usize> = (0..n.min(6)).chain([width, width + 1]).collect();
    for (i, &x) in picks.iter().enumerate() {
        for &y in picks[i..].iter() {
            let missing: Vec<usize> = if x == y { vec![x] } else { vec![x, y] };
            let mut broken = reference.to_vec();
            for &m in &missing {
                broken[m].fill(0);
            }
            let mut chunks: Vec<&mut [u8]> = broken.iter_mut().map(|c| &mut c[..]).collect();
            e.recover(ParityKind::PQ, &mut chunks, &missing)
                .map_err(|e| e.to_string())?;
            ok &= broken == reference;
            cases += 1;
        }
    }
    Ok(EngineCheck {
        engine: label.to_string(),
        pq_gb_per_second: rate,
        recovery_cases: cases,
        ok,
    })
}

fn pseudo_random(width: usize, chunk: usize) -> Vec<Vec<u8>> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..width)
        .map(|_| {
            (0..chunk)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
        .collect()
}

fn stripe(e: &dyn ParityEngine, data: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, String> {
    let len = data[0].len();
    let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
    let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    e.gen_pq(&refs, &mut p, &mut q).map_err(|e| e.to_string())?;
    let mut s = data.to_vec();
    s.push(p);
    s.push(q);
    Ok(s)
}
