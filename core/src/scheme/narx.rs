//! NARX: a nonlinear autoregressive network with exogenous inputs, LB-BSP's speed predictor
//! (Chen et al., SoCC 2020, predict each worker's next speed from its past speeds and its node's
//! CPU and memory load), trained online on the rank's own history.
//!
//! One hidden layer of [`HIDDEN`] tanh units and a linear output, on the project's dense-layer
//! kernels ([`peregrine_kernels::mlp`]). Inputs, all relative so that one network serves any
//! speed scale:
//! - the last [`LAGS`] speeds as `s(t - i) / base - 1`, `base` their mean (the tapped delay line);
//! - a long-run mean (exponential, weight 1/32) relative to the same base;
//! - the level `ln(base / s0)`, `s0` the first speed seen (where in a slowdown the rank is);
//! - the CPU and memory loads of the iteration just done (the exogenous inputs).
//!
//! The output is the next speed relative to the same base: the prediction is
//! `base (1 + net(x))`, so a network that has learned nothing (its output weights start at zero)
//! predicts the mean of the last [`LAGS`] speeds, which is what to do on noise; what it learns is
//! the structure on top (a period, a trend, a load that slows the rank).
//!
//! A linear bypass from the inputs to the output sits beside the hidden layer (so what is linear
//! in the history, a trend, needs no hidden units).
//!
//! Training: every observation pairs the previous inputs with the speed that followed and goes
//! into a window of the last [`REPLAY`] pairs; then [`STEPS`] Adam steps on the whole window
//! (Huber loss, a small weight decay). A window, not one pair per step: one noisy iteration moves
//! the weights by a 1/[`REPLAY`] share. The Huber loss keeps rare jumps (a sawtooth's reset, a
//! hiccup) from dominating the fit: with a squared loss the network lost to ARX on the trend.
//!
//! Sizes and rates were chosen on two seeds of the traces of [`super::traces`] (1 and 5) and are
//! judged on three others in the tests; `peregrine bench predictors` prints the comparison. An
//! observation costs about 200 us (4 steps over 256 pairs, 12 hidden units: about 2 Mflop in
//! products too small for the kernels to run near peak): a share of a millisecond iteration
//! that LB-BSP pays on every rank, and why the window and steps are not larger (8 steps were
//! a little more accurate on the periodic trace, at twice the cost).

use std::collections::VecDeque;

use peregrine_kernels::mlp::{dense_backward, dense_forward, Matmul, Weights};

/// Past speeds in the inputs.
pub const LAGS: usize = 8;
/// Inputs: the lags, the long-run mean, the level, CPU and memory load.
const INPUTS: usize = LAGS + 4;
/// Weight of a new speed in the long-run mean (an exponential average over about 32).
const LONG_RUN: f64 = 1.0 / 32.0;
/// Hidden tanh units.
pub const HIDDEN: usize = 12;
/// Observations in the training window.
pub const REPLAY: usize = 256;
/// Adam steps per observation, each on the whole window (at most: a run may take fewer, see
/// [`Narx::observe_with`]).
pub const STEPS: usize = 4;
const LEARNING_RATE: f32 = 0.02;
const BETA1: f32 = 0.9;
const BETA2: f32 = 0.999;
/// Errors beyond this (relative to the base) count linearly in the loss, not squared (Huber):
/// a rare jump (a reset, a hiccup) must not dominate the fit of the usual behaviour.
const HUBER: f32 = 0.05;
const WEIGHT_DECAY: f32 = 1e-4;
/// Observations before the network's output is used (until then: the mean of the lags).
const WARM_UP: usize = 16;
/// Relative inputs and targets are clamped to this range (one wild measurement must not blow
/// the network up).
const CLAMP: f32 = 4.0;

/// Parameter layout in one vector: `W1` (`HIDDEN x INPUTS`), `b1`, `W2` (`1 x HIDDEN`), `b2`,
/// then the linear bypass `L` (`1 x INPUTS`).
const W1: std::ops::Range<usize> = 0..HIDDEN * INPUTS;
const B1: std::ops::Range<usize> = W1.end..W1.end + HIDDEN;
const W2: std::ops::Range<usize> = B1.end..B1.end + HIDDEN;
const B2: std::ops::Range<usize> = W2.end..W2.end + 1;
const L: std::ops::Range<usize> = B2.end..B2.end + INPUTS;
const PARAMS: usize = L.end;

/// One rank's NARX predictor.
#[derive(Clone, Debug)]
pub struct Narx {
    /// The last [`LAGS`] speeds, oldest first.
    lags: VecDeque<f64>,
    /// The first speed seen (0: none yet).
    first: f64,
    /// Exponential average of the speeds.
    long_run: f64,
    /// The inputs of the last prediction and their base, to pair with the next speed.
    pending: Option<([f32; INPUTS], f64)>,
    /// Training pairs, oldest first: inputs then the target.
    replay: VecDeque<[f32; INPUTS + 1]>,
    params: Vec<f32>,
    /// Adam's first and second moments.
    m: Vec<f32>,
    v: Vec<f32>,
    /// Adam steps taken.
    steps: u64,
    mm: Matmul,
}

impl Default for Narx {
    fn default() -> Self {
        Self::new()
    }
}

impl Narx {
    /// A network with small deterministic hidden weights and a zero output layer (it predicts
    /// the mean of the lags until it learns better).
    pub fn new() -> Self {
        let mut params = vec![0.0; PARAMS];
        let scale = 1.0 / (INPUTS as f32).sqrt();
        for (i, w) in params[W1].iter_mut().enumerate() {
            let u = (crate::plan::mix(0x4E41_5258 ^ i as u64) >> 40) as f32 / (1u64 << 24) as f32;
            *w = (2.0 * u - 1.0) * scale;
        }
        Self {
            lags: VecDeque::with_capacity(LAGS + 1),
            first: 0.0,
            long_run: 0.0,
            pending: None,
            replay: VecDeque::with_capacity(REPLAY + 1),
            params,
            m: vec![0.0; PARAMS],
            v: vec![0.0; PARAMS],
            steps: 0,
            mm: Matmul::default(),
        }
    }

    /// Records the speed of the iteration just done and the loads seen during it; returns the
    /// predicted speed of the next iteration (positive).
    pub fn observe(&mut self, speed: f64, cpu: f64, mem: f64) -> f64 {
        self.observe_with(speed, cpu, mem, STEPS)
    }

    /// [`Narx::observe`] with `steps` training steps (0: the pair is kept, the weights stay).
    pub fn observe_with(&mut self, speed: f64, cpu: f64, mem: f64, steps: usize) -> f64 {
        let speed = speed.max(1e-9);
        if self.first == 0.0 {
            (self.first, self.long_run) = (speed, speed);
        }
        self.long_run += LONG_RUN * (speed - self.long_run);
        if let Some((x, base)) = self.pending.take() {
            let mut pair = [0.0; INPUTS + 1];
            pair[..INPUTS].copy_from_slice(&x);
            pair[INPUTS] = rel(speed, base);
            self.replay.push_back(pair);
            if self.replay.len() > REPLAY {
                self.replay.pop_front();
            }
            self.train(steps);
        }
        self.lags.push_back(speed);
        if self.lags.len() > LAGS {
            self.lags.pop_front();
        }
        let base = self.lags.iter().sum::<f64>() / self.lags.len() as f64;
        let mut x = [0.0f32; INPUTS];
        // Lags newest first; missing ones (the first iterations) repeat the oldest.
        let oldest = self.lags[0];
        for (i, xi) in x[..LAGS].iter_mut().enumerate() {
            let s = self.lags.iter().rev().nth(i).copied().unwrap_or(oldest);
            *xi = rel(s, base);
        }
        x[LAGS] = rel(self.long_run, base);
        x[LAGS + 1] = ((base / self.first).ln() as f32).clamp(-CLAMP, CLAMP);
        x[LAGS + 2] = (cpu as f32).clamp(0.0, CLAMP);
        x[LAGS + 3] = (mem as f32).clamp(0.0, CLAMP);
        self.pending = Some((x, base));
        if self.replay.len() < WARM_UP {
            return base;
        }
        let mut out = [0.0f32];
        self.forward(&x, 1, &mut vec![0.0; HIDDEN], &mut out);
        base * (1.0 + f64::from(out[0].clamp(-0.9, CLAMP)))
    }

    /// `out <- net(x)` for `n` rows of `x`, the hidden activations left in `h`.
    fn forward(&mut self, x: &[f32], n: usize, h: &mut Vec<f32>, out: &mut [f32]) {
        h.resize(n * HIDDEN, 0.0);
        let p = &self.params;
        dense_forward(&mut self.mm, x, &p[W1], Weights::OutIn, &p[B1], h);
        h.iter_mut().for_each(|v| *v = v.tanh());
        let mut linear = vec![0.0; n];
        dense_forward(&mut self.mm, x, &p[L], Weights::OutIn, &[0.0], &mut linear);
        dense_forward(&mut self.mm, h, &p[W2], Weights::OutIn, &p[B2], out);
        peregrine_kernels::dense::axpy(1.0, &linear, out);
    }

    /// The training window as inputs (`pairs x INPUTS`, row-major) and targets.
    fn window(&self) -> (Vec<f32>, Vec<f32>) {
        let mut x = Vec::with_capacity(self.replay.len() * INPUTS);
        let mut y = Vec::with_capacity(self.replay.len());
        for pair in &self.replay {
            x.extend_from_slice(&pair[..INPUTS]);
            y.push(pair[INPUTS]);
        }
        (x, y)
    }

    /// `steps` Adam steps on the training window (Huber loss plus weight decay); the window is
    /// gathered once for all of them.
    fn train(&mut self, steps: usize) {
        if steps == 0 || self.replay.is_empty() {
            return;
        }
        let (x, y) = self.window();
        for _ in 0..steps {
            self.step(&x, &y);
        }
    }

    /// One Adam step on inputs `x` and targets `y`.
    fn step(&mut self, x: &[f32], y: &[f32]) {
        let (_, grad) = self.gradient(x, y);
        self.steps += 1;
        let t = self.steps as f32;
        let (c1, c2) = (1.0 - BETA1.powf(t), 1.0 - BETA2.powf(t));
        for (((w, m), v), &g) in self.params.iter_mut().zip(&mut self.m).zip(&mut self.v).zip(&grad) {
            let g = g + WEIGHT_DECAY * *w;
            *m = BETA1 * *m + (1.0 - BETA1) * g;
            *v = BETA2 * *v + (1.0 - BETA2) * g * g;
            *w -= LEARNING_RATE * (*m / c1) / ((*v / c2).sqrt() + 1e-8);
        }
    }

    /// The mean Huber loss of inputs `x` against targets `y` and its gradient in the
    /// parameters.
    fn gradient(&mut self, x: &[f32], y: &[f32]) -> (f64, Vec<f32>) {
        let n = y.len();
        let mut h = Vec::new();
        let mut out = vec![0.0; n];
        self.forward(x, n, &mut h, &mut out);
        let dout: Vec<f32> =
            out.iter().zip(y).map(|(o, t)| (o - t).clamp(-HUBER, HUBER) / n as f32).collect();
        let mut grad = vec![0.0; PARAMS];
        let mut dh = vec![0.0; n * HIDDEN];
        {
            let (g1, g2) = grad.split_at_mut(W2.start);
            let (gw2, g2) = g2.split_at_mut(HIDDEN);
            let (gb2, gl) = g2.split_at_mut(1);
            dense_backward(&mut self.mm, x, &self.params[L], Weights::OutIn, &dout, gl, &mut [0.0], None);
            dense_backward(
                &mut self.mm,
                &h,
                &self.params[W2],
                Weights::OutIn,
                &dout,
                gw2,
                gb2,
                Some(&mut dh),
            );
            for (d, a) in dh.iter_mut().zip(&h) {
                *d *= 1.0 - a * a;
            }
            let (gw1, gb1) = g1.split_at_mut(B1.start);
            dense_backward(&mut self.mm, x, &self.params[W1], Weights::OutIn, &dh, gw1, gb1, None);
        }
        let loss = out.iter().zip(y).map(|(o, t)| huber(f64::from(o - t))).sum::<f64>() / n as f64;
        (loss, grad)
    }

    /// The predictor as numbers (for checkpoints): first speed, long-run mean, steps, lag count and lags, a
    /// pending flag with its inputs and base, pair count and pairs, parameters, moments.
    pub fn to_vec(&self) -> Vec<f64> {
        let mut v = vec![self.first, self.long_run, self.steps as f64, self.lags.len() as f64];
        v.extend(&self.lags);
        match &self.pending {
            Some((x, base)) => {
                v.push(1.0);
                v.extend(x.iter().map(|&a| f64::from(a)));
                v.push(*base);
            }
            None => v.push(0.0),
        }
        v.push(self.replay.len() as f64);
        v.extend(self.replay.iter().flatten().map(|&a| f64::from(a)));
        for part in [&self.params, &self.m, &self.v] {
            v.extend(part.iter().map(|&a| f64::from(a)));
        }
        v
    }

    /// A predictor from [`Narx::to_vec`]'s numbers and how many it used (`None` if they do not
    /// fit).
    pub fn from_vec(v: &[f64]) -> Option<(Self, usize)> {
        let mut at = 0;
        let mut take = |k: usize| -> Option<&[f64]> {
            let s = v.get(at..at + k)?;
            at += k;
            Some(s)
        };
        let count =
            |x: f64, max: usize| (x >= 0.0 && x.fract() == 0.0 && x <= max as f64).then_some(x as usize);
        let head = take(4)?;
        let (first, long_run, steps) = (head[0], head[1], head[2]);
        let lags: VecDeque<f64> = take(count(head[3], LAGS)?)?.iter().copied().collect();
        let pending = match take(1)?[0] {
            0.0 => None,
            1.0 => {
                let s = take(INPUTS + 1)?;
                Some((std::array::from_fn(|i| s[i] as f32), s[INPUTS]))
            }
            _ => return None,
        };
        let pairs = count(take(1)?[0], REPLAY)?;
        let flat = take(pairs * (INPUTS + 1))?;
        let replay = flat.chunks_exact(INPUTS + 1).map(|c| std::array::from_fn(|i| c[i] as f32)).collect();
        let f32s = |s: &[f64]| s.iter().map(|&a| a as f32).collect::<Vec<_>>();
        let params = f32s(take(PARAMS)?);
        let m = f32s(take(PARAMS)?);
        let second = f32s(take(PARAMS)?);
        let ok =
            first >= 0.0 && steps >= 0.0 && lags.iter().all(|&s| s > 0.0) && (first > 0.0 || lags.is_empty());
        if !ok || v[..at].iter().any(|a| !a.is_finite()) || (pending.is_some() && lags.is_empty()) {
            return None;
        }
        let narx = Self {
            lags,
            first,
            long_run,
            pending,
            replay,
            params,
            m,
            v: second,
            steps: steps as u64,
            mm: Matmul::default(),
        };
        Some((narx, at))
    }
}

/// The Huber loss of an error `e`: `e^2 / 2` within [`HUBER`], linear beyond.
fn huber(e: f64) -> f64 {
    let d = f64::from(HUBER);
    if e.abs() <= d {
        0.5 * e * e
    } else {
        d * (e.abs() - 0.5 * d)
    }
}

/// `s / base - 1`, clamped.
fn rel(s: f64, base: f64) -> f32 {
    ((s / base - 1.0) as f32).clamp(-CLAMP, CLAMP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_untrained_network_predicts_the_mean_of_the_lags() {
        let mut n = Narx::new();
        assert_eq!(n.observe(100.0, 0.5, 0.3), 100.0);
        assert_eq!(n.observe(200.0, 0.5, 0.3), 150.0);
        assert_eq!(n.observe(300.0, 0.5, 0.3), 200.0);
    }

    #[test]
    fn the_gradient_is_the_loss_derivative() {
        // Central differences of the window's loss against the analytic gradient, on parameters
        // of every block (hidden weights and biases, output weights and bias, the bypass).
        let mut n = Narx::new();
        n.params[W2].iter_mut().enumerate().for_each(|(i, w)| *w = 0.3 * (i as f32 - 5.0) / 5.0);
        n.params[L].iter_mut().enumerate().for_each(|(i, w)| *w = 0.1 * (i as f32 - 4.0) / 4.0);
        for t in 0..40 {
            n.observe(100.0 + 30.0 * f64::from(t % 4), 0.2 + 0.01 * f64::from(t % 3), 0.3);
        }
        let (x, y) = n.window();
        let (_, grad) = n.gradient(&x, &y);
        for i in [W1.start, W1.start + 17, B1.start + 3, W2.start + 2, B2.start, L.start + 1, L.end - 2] {
            let h = 1e-2;
            let p = n.params[i];
            n.params[i] = p + h;
            let up = n.gradient(&x, &y).0;
            n.params[i] = p - h;
            let down = n.gradient(&x, &y).0;
            n.params[i] = p;
            let numeric = (up - down) / (2.0 * f64::from(h));
            let g = f64::from(grad[i]);
            assert!((numeric - g).abs() <= 1e-3 + 0.02 * g.abs(), "parameter {i}: {g} vs {numeric}");
        }
        // And training lowers the loss of a window with a nonlinear rule in it (a sigmoid in the
        // CPU load, a share of the last lag).
        let mut fresh = Narx::new();
        for k in 0..REPLAY {
            let mut pair = [0.0; INPUTS + 1];
            for (i, v) in pair[..INPUTS].iter_mut().enumerate() {
                *v = (crate::plan::mix((k * INPUTS + i) as u64) % 1000) as f32 / 1000.0 - 0.5;
            }
            pair[INPUTS] = 0.5 * pair[0] - 0.3 * (4.0 * pair[LAGS + 2]).tanh();
            fresh.replay.push_back(pair);
        }
        let (x, y) = fresh.window();
        let before = fresh.gradient(&x, &y).0;
        fresh.train(1000);
        let after = fresh.gradient(&x, &y).0;
        assert!(after < 0.2 * before, "{before} -> {after}");
    }

    #[test]
    fn a_saved_predictor_goes_on_as_the_original() {
        let mut a = Narx::new();
        for t in 0..30 {
            a.observe(500.0 + 50.0 * f64::from(t % 5), 0.1, 0.2);
        }
        let v = a.to_vec();
        let (mut b, used) = Narx::from_vec(&v).expect("fits");
        assert_eq!(used, v.len());
        for t in 0..10 {
            let s = 400.0 + 7.0 * f64::from(t);
            assert_eq!(a.observe(s, 0.3, 0.2), b.observe(s, 0.3, 0.2), "step {t}");
        }
        assert!(Narx::from_vec(&v[..v.len() - 1]).is_none(), "cut short");
        let mut bad = v.clone();
        bad[3] = f64::NAN;
        assert!(Narx::from_vec(&bad).is_none(), "not finite");
        assert!(Narx::from_vec(&[1.0, 1.0, 0.0, 99.0]).is_none(), "too many lags");
    }
}
