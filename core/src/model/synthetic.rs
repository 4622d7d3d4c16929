//! A stand-in workload for many ranks on few cores: every chunk costs a set time, slept, over a
//! dense model of a set size that every rank pulls and pushes whole each iteration, as a real
//! dense model is. Pulls, pushes, waits, taking over and the schemes are all real; only the
//! arithmetic is replaced by a sleep, so 8-32 ranks of mostly sleeping threads share two cores
//! and their times can be set beside the simulator's (`peregrine simulate --replay`).
//!
//! The dataset gives the rows (its features are not read); the update pushed is zeros, so the
//! model never changes and its loss is 0.

use std::ops::Range;
use std::path::Path;
use std::time::{Duration, Instant};

use peregrine_kernels::data::Dataset;

use super::{Baseline, Block, Built, Delta, EvalSums, Export, KeySet, Layout, Metric, Model, ModelError};

/// The most parameters (1 GiB of `f32` a rank holds in its replica).
pub const MAX_PARAMS: usize = 1 << 28;
/// The most a chunk may cost (a typo such as `2s` for `2ms` would otherwise sleep for hours).
pub const MAX_CHUNK_COST: Duration = Duration::from_secs(60);

/// The synthetic workload.
#[derive(Debug)]
pub struct Synthetic {
    rows: usize,
    params: usize,
    /// What one chunk of `chunk` rows costs.
    cost: Duration,
    chunk: usize,
    /// How much longer than asked a sleep of this machine lasts (measured once).
    overshoot: Duration,
}

/// Per-thread update: zeros, pushed whole.
#[derive(Debug)]
pub struct Work {
    update: Vec<f32>,
}

impl Synthetic {
    /// `params` parameters; each chunk of `chunk` rows of `train` costs `cost` (rows of other
    /// chunks in proportion).
    pub fn new(train: &Path, params: usize, cost: Duration, chunk: usize) -> Built<Self> {
        if params == 0 || params > MAX_PARAMS {
            return Err(ModelError::Unfit(format!(
                "synthetic: {params} parameters; between 1 and {MAX_PARAMS} (1 GiB of f32 a rank)"
            )));
        }
        if cost.is_zero() || cost > MAX_CHUNK_COST {
            return Err(ModelError::Unfit(format!(
                "synthetic: a chunk cost of {cost:?}; more than 0 and at most {MAX_CHUNK_COST:?}"
            )));
        }
        let rows =
            Dataset::open(train).map_err(|source| ModelError::Open { what: "training set", source })?.rows();
        Ok(Self { rows, params, cost, chunk: chunk.max(1), overshoot: sleep_overshoot() })
    }

    /// What `rows` rows cost.
    fn cost_of(&self, rows: usize) -> Duration {
        self.cost.mul_f64(rows as f64 / self.chunk as f64)
    }
}

/// The median overshoot of 15 sleeps of 1 ms on this machine (the timer slack and the wake-up),
/// taken off every chunk's sleep so that a chunk lasts what it is set to.
fn sleep_overshoot() -> Duration {
    let mut over: Vec<Duration> = (0..15)
        .map(|_| {
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_millis(1));
            t0.elapsed().saturating_sub(Duration::from_millis(1))
        })
        .collect();
    over.sort();
    over[over.len() / 2]
}

impl Model for Synthetic {
    type Work = Work;

    fn name(&self) -> &'static str {
        "synthetic"
    }

    fn layout(&self) -> Layout {
        Layout::dense(self.params)
    }

    fn rows(&self) -> usize {
        self.rows
    }

    fn eval_rows(&self) -> usize {
        0
    }

    fn metric(&self) -> Metric {
        Metric::Accuracy
    }

    fn init(&self, _seed: u64, _range: Range<usize>, out: &mut [f32]) {
        out.fill(0.0);
    }

    fn sparse(&self) -> bool {
        false
    }

    fn keys(&self, _rows: Range<usize>, _set: &mut KeySet) {}

    fn work(&self, _chunk: usize) -> Work {
        Work { update: vec![0.0; self.params] }
    }

    /// Sleeps for the rows' cost: first less the machine's usual sleep overshoot, then whatever is
    /// still missing.
    fn compute(&self, rows: Range<usize>, _params: &[f32], _work: &mut Work) -> f64 {
        let t0 = Instant::now();
        let want = self.cost_of(rows.len());
        std::thread::sleep(want.saturating_sub(self.overshoot));
        // What the overshoot did not cover this time (a sleep never ends early, so the chunk
        // lasts its cost at least).
        if let Some(left) = want.checked_sub(t0.elapsed()).filter(|d| !d.is_zero()) {
            std::thread::sleep(left);
        }
        0.0
    }

    fn slept(&self) -> bool {
        true
    }

    fn drain(&self, work: &mut Work, scale: f32, delta: &mut Delta) {
        delta.take_all(scale, &mut work.update);
    }

    fn scale(&self, _rows: usize) -> f32 {
        0.0
    }

    /// Zeros, pushed as they are: nothing to step.
    fn lr(&self) -> Option<f32> {
        None
    }

    fn evaluate(&self, _params: &[f32], _rows: Range<usize>) -> EvalSums {
        [0.0, 0.0, 0.0]
    }

    /// No evaluation rows: nothing is judged against it.
    fn baseline(&self) -> Baseline {
        Baseline { blind_loss: 1.0, constant_metric: 0.0 }
    }
}

impl Export for Synthetic {
    fn blocks(&self) -> Vec<Block> {
        vec![Block::new("weight", &[self.params], 0)]
    }

    fn outputs(&self) -> Vec<String> {
        Vec::new()
    }

    fn predict(&self, _params: &[f32], _rows: Range<usize>, _out: &mut Vec<f32>) {}

    fn label(&self, _row: usize) -> String {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_lasts_its_cost_and_bad_settings_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("d.pgd");
        peregrine_kernels::data::gen::dense(
            &peregrine_kernels::data::gen::DenseSpec { rows: 100, cols: 3, classes: 2, noise: 0.1, seed: 1 },
            &p,
        )
        .expect("gen");
        let m = Synthetic::new(&p, 1000, Duration::from_millis(4), 10).expect("model");
        assert_eq!((m.rows(), m.layout().params), (100, 1000));
        let mut w = m.work(10);
        // Two chunks' rows: twice the cost, never less.
        let t0 = Instant::now();
        m.compute(0..20, &[], &mut w);
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(8), "{took:?}");
        for (params, cost) in [(0, 1), (MAX_PARAMS + 1, 1), (10, 0), (10, 61_000)] {
            let e = Synthetic::new(&p, params, Duration::from_millis(cost), 10).expect_err("refused");
            assert!(e.to_string().contains("synthetic"), "{e}");
        }
    }
}
