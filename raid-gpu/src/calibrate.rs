//! Measuring where the GPU starts to pay: both engines, side by side, on the
//! same stripes, at growing batch sizes, transfers included.
//!
//! `auto` runs a short sweep when the engine starts (the threshold is
//! measured on the machine, not guessed); `cargo bench -p raid-gpu` runs the
//! full one and prints the table.

use raid_core::parity::{GenJob, ParityEngine};
use std::time::{Duration, Instant};

use crate::select::StripeShape;

/// One batch size, both engines.
#[derive(Clone, Debug)]
pub struct Sample {
    pub stripes: usize,
    /// Data bytes per call.
    pub bytes: u64,
    pub cpu: Duration,
    pub gpu: Duration,
}

impl Sample {
    /// GB/s of data (10^9 bytes per second).
    pub fn cpu_gbps(&self) -> f64 {
        self.bytes as f64 / self.cpu.as_secs_f64() / 1e9
    }
    pub fn gpu_gbps(&self) -> f64 {
        self.bytes as f64 / self.gpu.as_secs_f64() / 1e9
    }
}

/// What the start-up sweep found.
#[derive(Clone, Debug)]
pub struct Calibration {
    pub samples: Vec<Sample>,
    /// The smallest batch from which the GPU was faster at every size
    /// measured; None when it never was.
    pub threshold_stripes: Option<usize>,
}

/// Data bytes one start-up sample may use at most.
const CALIBRATE_BYTES_MAX: u64 = 256 << 20;

/// Stripes of the given shape with data filled and parity zeroed.
pub struct TestStripes {
    shape: StripeShape,
    bufs: Vec<Vec<Vec<u8>>>,
}

impl TestStripes {
    pub fn new(shape: StripeShape, stripes: usize) -> TestStripes {
        let width = shape.data_chunks + shape.kind.parity_chunks();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let bufs = (0..stripes)
            .map(|_| {
                (0..width)
                    .map(|_| {
                        (0..shape.chunk)
                            .map(|_| {
                                seed ^= seed << 13;
                                seed ^= seed >> 7;
                                seed ^= seed << 17;
                                seed as u8
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        TestStripes { shape, bufs }
    }

    pub fn bytes(&self) -> u64 {
        (self.bufs.len() * self.shape.data_chunks * self.shape.chunk) as u64
    }

    /// One batched generation call on `e`.
    pub fn generate(&mut self, e: &dyn ParityEngine) -> Duration {
        let nd = self.shape.data_chunks;
        let mut jobs: Vec<GenJob> = self
            .bufs
            .iter_mut()
            .map(|s| {
                let (data, parity) = s.split_at_mut(nd);
                GenJob {
                    data: data.iter().map(|c| &c[..]).collect(),
                    parity: parity.iter_mut().map(|c| &mut c[..]).collect(),
                }
            })
            .collect();
        let t = Instant::now();
        e.gen_batch(self.shape.kind, &mut jobs)
            .expect("valid stripes");
        t.elapsed()
    }

    /// The parity chunks, to compare two engines' output.
    pub fn parity(&self) -> Vec<&[u8]> {
        self.bufs
            .iter()
            .flat_map(|s| s[self.shape.data_chunks..].iter().map(|c| &c[..]))
            .collect()
    }
}

/// Best of `reps` timed calls, after one untimed warm-up call.
pub fn best_of(t: &mut TestStripes, e: &dyn ParityEngine, reps: usize) -> Duration {
    t.generate(e);
    (0..reps.max(1)).map(|_| t.generate(e)).min().unwrap()
}

/// How far a sweep goes.
#[derive(Clone, Copy, Debug)]
pub struct SweepLimits {
    /// Timed calls per engine and size (the best counts), after a warm-up.
    pub reps: usize,
    /// No size is started once this much time has passed.
    pub budget: Duration,
    /// Sizes whose data exceeds this are not run.
    pub max_bytes: u64,
}

/// Times both engines at each batch size in `sizes`, on the same stripes,
/// and checks that their parity is identical.
pub fn sweep(
    cpu: &dyn ParityEngine,
    gpu: &dyn ParityEngine,
    shape: StripeShape,
    sizes: &[usize],
    limits: SweepLimits,
) -> Vec<Sample> {
    let start = Instant::now();
    let mut out = Vec::new();
    for &n in sizes {
        if (n * shape.data_chunks * shape.chunk) as u64 > limits.max_bytes
            || start.elapsed() > limits.budget
        {
            break;
        }
        let reps = limits.reps;
        let mut t = TestStripes::new(shape, n);
        let gpu_t = best_of(&mut t, gpu, reps);
        let gpu_parity: Vec<Vec<u8>> = t.parity().iter().map(|c| c.to_vec()).collect();
        let cpu_t = best_of(&mut t, cpu, reps);
        assert!(
            t.parity()
                .iter()
                .zip(&gpu_parity)
                .all(|(a, b)| *a == &b[..]),
            "GPU and CPU parity differ at {n} stripes of {shape:?}"
        );
        let s = Sample {
            stripes: n,
            bytes: t.bytes(),
            cpu: cpu_t,
            gpu: gpu_t,
        };
        tracing::debug!(
            stripes = n,
            cpu_gbps = s.cpu_gbps(),
            gpu_gbps = s.gpu_gbps(),
            "calibration sample"
        );
        out.push(s);
    }
    out
}

/// The smallest batch from which the GPU won at every larger size too.
pub fn threshold(samples: &[Sample]) -> Option<usize> {
    let mut t = None;
    for s in samples.iter().rev() {
        if s.gpu < s.cpu {
            t = Some(s.stripes);
        } else {
            break;
        }
    }
    t
}

/// The start-up sweep `auto` runs: powers of four from 1 to 1024 stripes of
/// the array's shape, within about two seconds.
pub fn calibrate(
    cpu: &dyn ParityEngine,
    gpu: &dyn ParityEngine,
    shape: StripeShape,
) -> Calibration {
    let samples = sweep(
        cpu,
        gpu,
        shape,
        &[1, 4, 16, 64, 256, 1024],
        SweepLimits {
            reps: 2,
            budget: Duration::from_secs(2),
            max_bytes: CALIBRATE_BYTES_MAX,
        },
    );
    let threshold_stripes = threshold(&samples);
    tracing::info!(
        gpu = gpu.name(),
        threshold_stripes = ?threshold_stripes,
        measured = samples.len(),
        "auto parity calibrated: {}",
        samples
            .iter()
            .map(|s| format!("{}: cpu {:.2} GB/s gpu {:.2} GB/s", s.stripes, s.cpu_gbps(), s.gpu_gbps()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Calibration {
        samples,
        threshold_stripes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(stripes: usize, cpu: u64, gpu: u64) -> Sample {
        Sample {
            stripes,
            bytes: 1,
            cpu: Duration::from_micros(cpu),
            gpu: Duration::from_micros(gpu),
        }
    }

    #[test]
    fn threshold_is_where_the_gpu_wins_for_good() {
        assert_eq!(
            threshold(&[s(1, 10, 50), s(4, 40, 60), s(16, 160, 90), s(64, 640, 200)]),
            Some(16)
        );
        // A win that does not last is not a threshold.
        assert_eq!(threshold(&[s(1, 10, 5), s(4, 40, 60)]), None);
        assert_eq!(threshold(&[]), None);
        assert_eq!(threshold(&[s(1, 10, 5)]), Some(1));
    }
}
