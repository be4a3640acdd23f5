//! GPU against CPU parity, side by side in one run: GB/s of data for
//! batches of 1 to 1024 stripes, uploads and read-backs included (each
//! figure is a whole `gen_batch` call as the array makes it), with the two
//! engines' parity compared on every size.
//!
//!     cargo bench -p raid-gpu --bench gpu
//!
//! Environment: BENCH_KIND=p|pq (default pq), BENCH_DATA (data chunks,
//! default 8), BENCH_CHUNK (bytes, default 65536), BENCH_MAX_MIB (largest
//! batch's data, default 1024), BENCH_JSON (write the table there too), and
//! wgpu's WGPU_BACKEND / WGPU_ADAPTER_NAME to choose the adapter.
//!
//! On a CPU adapter (Mesa lavapipe) the GPU column proves the path runs end
//! to end, not what a GPU does: lavapipe runs the shader on this CPU.

use raid_core::parity::{CpuEngine, ParityEngine, ParityKind};
use raid_gpu::calibrate::{sweep, threshold, SweepLimits};
use raid_gpu::{GpuEngine, StripeShape};
use std::time::Duration;

/// Timed calls per engine and size, after one warm-up call.
const REPS: usize = 3;

fn env<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` would pass
    // nothing: run only when asked to bench.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let kind = match std::env::var("BENCH_KIND").as_deref() {
        Ok("p") => ParityKind::P,
        _ => ParityKind::PQ,
    };
    let shape = StripeShape {
        kind,
        data_chunks: env("BENCH_DATA", 8),
        chunk: env("BENCH_CHUNK", 65536),
    };
    let gpu = match GpuEngine::new() {
        Ok(g) => g,
        Err(e) => {
            println!("no GPU benchmark: {e}");
            return;
        }
    };
    let cpu = CpuEngine::new();
    let sizes: Vec<usize> = (0..=10).map(|i| 1usize << i).collect();
    println!(
        "{kind}, {} data chunks of {} KiB; CPU {} on {} threads; GPU {} [{}]",
        shape.data_chunks,
        shape.chunk / 1024,
        cpu.name(),
        rayon::current_num_threads(),
        gpu.adapter(),
        gpu.adapter().driver
    );
    let samples = sweep(
        &cpu,
        &gpu,
        shape,
        &sizes,
        SweepLimits {
            reps: REPS,
            budget: Duration::from_secs(env("BENCH_SECONDS", 300)),
            max_bytes: env::<u64>("BENCH_MAX_MIB", 1024) << 20,
        },
    );
    println!(
        "{:>8} {:>10} {:>12} {:>12} {:>10}",
        "stripes", "data MiB", "cpu GB/s", "gpu GB/s", "gpu/cpu"
    );
    for s in &samples {
        println!(
            "{:>8} {:>10.2} {:>12.2} {:>12.2} {:>10.2}",
            s.stripes,
            s.bytes as f64 / (1 << 20) as f64,
            s.cpu_gbps(),
            s.gpu_gbps(),
            s.gpu_gbps() / s.cpu_gbps()
        );
    }
    let st = gpu.stats();
    let data: u64 = samples.iter().map(|s| s.bytes * (REPS as u64 + 1)).sum();
    println!(
        "bus: {:.3} bytes up and {:.3} down per byte of data, {} sub-batches, ring {} deep",
        st.bytes_up as f64 / data as f64,
        st.bytes_down as f64 / data as f64,
        st.sub_batches,
        st.max_in_flight
    );
    match threshold(&samples) {
        Some(n) => println!("GPU faster from {n} stripes per call on"),
        None => println!("GPU not faster at any size measured"),
    }
    if let Ok(path) = std::env::var("BENCH_JSON") {
        let rows: Vec<String> = samples
            .iter()
            .map(|s| {
                format!(
                    "{{\"stripes\":{},\"bytes\":{},\"cpu_gbps\":{:.4},\"gpu_gbps\":{:.4}}}",
                    s.stripes,
                    s.bytes,
                    s.cpu_gbps(),
                    s.gpu_gbps()
                )
            })
            .collect();
        let json = format!(
            "{{\"adapter\":{:?},\"driver\":{:?},\"cpu\":{:?},\"kind\":{:?},\"data_chunks\":{},\"chunk\":{},\"samples\":[{}]}}\n",
            gpu.adapter().to_string(),
            gpu.adapter().driver,
            cpu.name(),
            kind.to_string(),
            shape.data_chunks,
            shape.chunk,
            rows.join(",")
        );
        std::fs::write(&path, json).expect("BENCH_JSON is writable");
    }
}
