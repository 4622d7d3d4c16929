//! LB-BSP (load-balanced BSP): each iteration, every rank's share of the global batch is set in
//! proportion to its predicted speed, so that all ranks finish together and nobody waits.
//!
//! Each rank predicts its own next speed (rows per second of compute) from its history and
//! publishes the prediction in a window before it ticks its clock; after the BSP wait every rank
//! reads the same predictions and derives the same split. Two predictors:
//! - **ARX** (the reference; LB-BSP used NARX, a recurrent network over past speeds driven by CPU
//!   and memory load): a linear autoregressive model with exogenous inputs,
//!   `s(t+1) = a0 + a1 s(t) + a2 s(t-1) + b1 cpu(t) + b2 mem(t)`, fitted online by recursive least
//!   squares with forgetting (0.95), inputs: the node's CPU load (1-minute load average per CPU)
//!   and memory load (1 - available/total);
//! - **moving average** of the last 5 speeds.
//!
//! Until a rank has 4 observations the ARX predictor returns the last speed.

use std::collections::VecDeque;
use std::fmt;

/// Which predictor sets the batch shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Predictor {
    /// Linear ARX over past speeds with CPU and memory load as inputs, recursive least squares.
    Arx,
    /// Mean of the last 5 speeds.
    MovingAverage,
}

impl fmt::Display for Predictor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Arx => "arx",
            Self::MovingAverage => "ma",
        })
    }
}

const FEATURES: usize = 5;
const FORGET: f64 = 0.95;
const WINDOW: usize = 5;

/// One rank's speed history and predictor state.
#[derive(Clone, Debug)]
pub struct History {
    predictor: Predictor,
    speeds: VecDeque<f64>,
    /// Scale of the speeds (the first one), so that the least-squares problem is well conditioned.
    scale: f64,
    /// Features of the last prediction, to be paired with the next observed speed.
    last_x: Option<[f64; FEATURES]>,
    theta: [f64; FEATURES],
    p: [[f64; FEATURES]; FEATURES],
    observed: usize,
}

impl History {
    /// An empty history.
    pub fn new(predictor: Predictor) -> Self {
        let mut p = [[0.0; FEATURES]; FEATURES];
        for (i, row) in p.iter_mut().enumerate() {
            row[i] = 100.0;
        }
        // Start from "the next speed is the last one".
        let mut theta = [0.0; FEATURES];
        theta[1] = 1.0;
        Self { predictor, speeds: VecDeque::new(), scale: 0.0, last_x: None, theta, p, observed: 0 }
    }

    /// Records the speed of the iteration just done (with the loads seen during it) and returns
    /// the prediction for the next one (positive).
    pub fn observe(&mut self, speed: f64, cpu: f64, mem: f64) -> f64 {
        let speed = speed.max(1e-9);
        if self.scale == 0.0 {
            self.scale = speed;
        }
        let s = speed / self.scale;
        if let Some(x) = self.last_x {
            self.rls_update(&x, s);
        }
        self.speeds.push_back(s);
        if self.speeds.len() > WINDOW {
            self.speeds.pop_front();
        }
        self.observed += 1;
        let prev = self.speeds.iter().rev().nth(1).copied().unwrap_or(s);
        let x = [1.0, s, prev, cpu, mem];
        self.last_x = Some(x);
        let predicted = match self.predictor {
            Predictor::MovingAverage => self.speeds.iter().sum::<f64>() / self.speeds.len() as f64,
            Predictor::Arx if self.observed < 4 => s,
            Predictor::Arx => {
                let y: f64 = self.theta.iter().zip(&x).map(|(t, v)| t * v).sum();
                // A wild extrapolation is worse than none.
                y.clamp(0.25 * s, 4.0 * s)
            }
        };
        predicted * self.scale
    }

    /// Recursive least squares with forgetting: one observation `(x, y)`.
    fn rls_update(&mut self, x: &[f64; FEATURES], y: f64) {
        let mut px = [0.0; FEATURES];
        for (i, row) in self.p.iter().enumerate() {
            px[i] = row.iter().zip(x).map(|(a, b)| a * b).sum();
        }
        let denom = FORGET + x.iter().zip(&px).map(|(a, b)| a * b).sum::<f64>();
        if !(denom.is_finite() && denom > 1e-12) {
            return;
        }
        let k: Vec<f64> = px.iter().map(|v| v / denom).collect();
        let err = y - self.theta.iter().zip(x).map(|(t, v)| t * v).sum::<f64>();
        for (t, ki) in self.theta.iter_mut().zip(&k) {
            *t += ki * err;
        }
        // P <- (P - k x^T P) / lambda  (P symmetric: x^T P = px^T)
        for (row, ki) in self.p.iter_mut().zip(&k) {
            for (v, pj) in row.iter_mut().zip(&px) {
                *v = (*v - ki * pj) / FORGET;
            }
        }
    }
}

/// The node's CPU load (1-minute load average per CPU) and memory load (1 - available/total),
/// from /proc (0 where unavailable).
pub fn loads() -> (f64, f64) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let cpu = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()))
        .map_or(0.0, |l| l / cpus);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
    };
    let mem = match (field("MemTotal:"), field("MemAvailable:")) {
        (Some(t), Some(a)) if t > 0.0 => 1.0 - a / t,
        _ => 0.0,
    };
    (cpu, mem)
}

/// Splits `chunks` chunks over ranks in proportion to `weights` (non-positive or non-finite
/// weights count as the mean of the others; all such: even split): rank `r`'s chunk range.
pub fn split_weighted(chunks: usize, weights: &[f64], r: usize) -> std::ops::Range<usize> {
    let good: Vec<f64> = weights.iter().copied().filter(|w| w.is_finite() && *w > 0.0).collect();
    let mean = if good.is_empty() { 1.0 } else { good.iter().sum::<f64>() / good.len() as f64 };
    let w: Vec<f64> = weights.iter().map(|&x| if x.is_finite() && x > 0.0 { x } else { mean }).collect();
    let total: f64 = w.iter().sum();
    let edge = |k: usize| -> usize {
        let cum: f64 = w[..k].iter().sum();
        ((cum / total) * chunks as f64).round() as usize
    };
    edge(r)..edge(r + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_splits_cover_everything_in_proportion() {
        let w = [1.0, 0.5, 0.5];
        let parts: Vec<_> = (0..3).map(|r| split_weighted(100, &w, r)).collect();
        assert_eq!(parts, vec![0..50, 50..75, 75..100]);
        let even: Vec<_> = (0..4).map(|r| split_weighted(10, &[0.0; 4], r).len()).collect();
        assert_eq!(even.iter().sum::<usize>(), 10);
        assert!(even.iter().all(|&n| (2..=3).contains(&n)));
        assert_eq!(split_weighted(10, &[2.0, f64::NAN], 1), 5..10, "a missing weight counts as the mean");
    }

    #[test]
    fn predictors_follow_a_speed_change() {
        for p in [Predictor::Arx, Predictor::MovingAverage] {
            let mut h = History::new(p);
            let mut last = 0.0;
            for _ in 0..30 {
                last = h.observe(1000.0, 0.5, 0.3);
            }
            assert!((last - 1000.0).abs() < 1.0, "{p}: steady {last}");
            // The rank halves its speed for good: both end up near 500.
            for _ in 0..30 {
                last = h.observe(500.0, 0.5, 0.3);
            }
            assert!((last - 500.0).abs() < 25.0, "{p}: after the drop {last}");
        }
    }

    #[test]
    fn arx_beats_the_average_on_a_trend() {
        // A rank slowing down steadily: the average lags the trend, ARX extrapolates it.
        let (mut arx, mut ma) = (History::new(Predictor::Arx), History::new(Predictor::MovingAverage));
        let (mut ea, mut em) = (0.0, 0.0);
        let mut pa = 0.0;
        let mut pm = 0.0;
        for t in 0..60 {
            let s = 1000.0 - 10.0 * t as f64;
            if t > 10 {
                ea += (pa - s).abs();
                em += (pm - s).abs();
            }
            pa = arx.observe(s, 0.5, 0.3);
            pm = ma.observe(s, 0.5, 0.3);
        }
        assert!(ea < em / 2.0, "ARX error {ea} vs moving average {em}");
    }
}
