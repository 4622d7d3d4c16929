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
//! - **moving average** of the last 5 speeds;
//! - **NARX** (`lb-bsp:narx`, [`super::narx`]), the paper's choice: a small tanh network over
//!   the last 8 speeds, a long-run mean, the level of the speed and the same two loads, trained
//!   online on the rank's last 256 observations within 5 % of its time.
//!
//! Until a rank has 4 observations the ARX predictor returns the last speed. `peregrine bench
//! predictors` compares the three on speed traces with and without structure ([`super::traces`]).
//!
//! LB-BSP synchronizes as BSP and never takes chunks over (resizing the shares is its answer to
//! stragglers). Up to `READ_ALL_UP_TO` ranks the predictions live in a window, two words per
//! rank (one per iteration parity), and every rank reads all of them and splits by water-filling
//! (`split_starts`). Past that, reading every rank's word each iteration was the scheme's cost
//! at scale (4,096 ranks: 2.45x the balanced bound, simulated): the predictions go into a tree of
//! sums ([`crate::sums`], in fixed point), and each rank reads the world's totals and the sums of
//! the ranks before it (O(log N) words) and takes its part of a split in proportion to the
//! predictions (`part_by_sums`), each part within a chunk of water-filling's. There, the
//! first iteration after a resume splits evenly (its round of the tree is empty).

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use peregrine_transport::{ShardMap, Window};

use crate::sums::{Sums, Totals, PARTS};

use super::narx::Narx;
use super::staleness::Bound;
use super::{Family, Parsed, Policy, Result, SchemeKind, Setup, Shared, View};
use crate::plan::Plan;
use crate::record::{Figure, IterRecord, RankTotals};

pub(crate) const FAMILY: Family = Family {
    forms: "lb-bsp[:arx|:ma|:narx]",
    names: &["lb-bsp", "lb-bsp:ma", "lb-bsp:narx"],
    compared: &["lb-bsp"],
    parse,
};

fn parse(s: &str) -> Option<Parsed> {
    let p = match s {
        "lb-bsp" | "lb-bsp:arx" => Predictor::Arx,
        "lb-bsp:ma" => Predictor::MovingAverage,
        "lb-bsp:narx" => Predictor::Narx,
        _ => return None,
    };
    Some(Ok(Arc::new(LbBsp { predictor: p })))
}

/// LB-BSP with its speed predictor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LbBsp {
    predictor: Predictor,
}

impl fmt::Display for LbBsp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.predictor {
            Predictor::Arx => f.write_str("lb-bsp"),
            p => write!(f, "lb-bsp:{p}"),
        }
    }
}

impl SchemeKind for LbBsp {
    fn pulls_every_update(&self) -> bool {
        true
    }

    fn policy(&self, setup: &Setup<'_>) -> Result<Box<dyn Policy>> {
        let t = setup.t;
        let preds = if t.world_size() > READ_ALL_UP_TO {
            Published::Tree(Sums::new(t, "speed predictions")?)
        } else {
            Published::Words(
                t.alloc_window("speed predictions", &ShardMap::from_lens(vec![2; t.world_size()]))?,
            )
        };
        Ok(Box::new(Balanced {
            preds,
            history: History::new(self.predictor),
            loads: (!setup.simulated).then(Loads::default),
            last: 0.0,
            error: 0.0,
            predictions: 0,
            speeds: Vec::new(),
            budget: (!setup.simulated && self.predictor == Predictor::Narx).then(TrainBudget::default),
            shared: setup.shared.clone(),
            level: None,
        }))
    }
}

/// The policy: shares from the published predictions, this rank's prediction published before
/// each tick.
struct Balanced {
    preds: Published,
    history: History,
    /// The node's loads (none in a simulated world).
    loads: Option<Loads>,
    /// This rank's last prediction (0: none yet).
    last: f64,
    /// Sum over iterations of `|predicted - measured| / measured`, and the iterations summed.
    error: f64,
    predictions: u64,
    speeds: Vec<f64>,
    /// NARX's training time (none in a simulated world: it trains every step there).
    budget: Option<TrainBudget>,
    /// In a simulated world, the split its ranks share ([`Shared::split`]): the first rank to
    /// open an iteration computes it, the others take their part (and are charged the reads).
    shared: Option<Arc<Shared>>,
    /// Past [`READ_ALL_UP_TO`] ranks, the totals of the last split and the chunks beyond one a
    /// rank of the next iteration: the level the next predictions' base counts are taken at
    /// ([`published`]).
    level: Option<(Totals, usize)>,
}

impl Balanced {
    /// Drops the shared split if it was computed from predictions of the parity of `slot`,
    /// which this rank is about to overwrite. Under BSP nobody writes a slot while a rank may
    /// still split by it (see `before_tick`), so this never drops a split still in use; it
    /// keeps the shared split exact whatever the order.
    fn overwrite(&self, slot: usize) {
        if let Some(shared) = &self.shared {
            let mut split = shared.split.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if split.as_ref().is_some_and(|(it, _)| (it % 2) as usize == slot) {
                *split = None;
            }
        }
    }
}

/// Ranks up to which every rank reads every prediction and splits by water-filling; past them,
/// the tree of sums. Where the two cost the same: simulated over InfiniBand (16 threads a rank,
/// 60 iterations, time per iteration / Ideal, reading every prediction -> the tree), 128 ranks
/// 1.04x -> 1.07x with no straggler and 1.29x -> 1.32x with one at half speed, 256 ranks 1.08x
/// -> 1.09x and 1.33x -> 1.33x, 512 ranks 1.16x -> 1.11x and 1.40x -> 1.35x, 4,096 ranks 2.45x ->
/// 1.35x with the straggler.
pub(crate) const READ_ALL_UP_TO: usize = 256;

/// Where the ranks' predictions are published.
enum Published {
    /// Every rank's predicted speed (f64 bits) for iterations of either parity, each rank
    /// reading all (up to [`READ_ALL_UP_TO`] ranks).
    Words(Window<u64>),
    /// Their sums in fixed point ([`fixed`]), a round per parity.
    Tree(Sums),
}

/// A prediction in the tree's fixed point: 1/1024 of a row per second (`None`: no prediction).
/// Capped at 2^38 (2.7 x 10^8 rows a second), so that sums over 2^24 ranks fit in 62 bits, and
/// scaled in [`part_by_sums`] by the count of predictions and the chunks, in 128.
fn fixed(speed: f64) -> Option<u64> {
    (speed.is_finite() && speed > 0.0).then(|| ((speed * 1024.0).round() as u64).clamp(1, 1 << 38))
}

/// Share of a rank's wall-clock time that NARX's training may take.
const TRAIN_SHARE: f64 = 0.05;

/// NARX's training time in a run: [`TRAIN_SHARE`] of the time between observations, spent in
/// whole steps (up to [`super::narx::STEPS`] per observation). A step over 256 pairs costs about
/// 50 us; with iterations of a millisecond, training every step would take a fifth of the run.
#[derive(Debug, Default)]
struct TrainBudget {
    /// Time earned and not spent.
    left: Duration,
    /// When the last observation ended.
    last: Option<Instant>,
    /// Measured cost of a step (0: not measured yet).
    step: Duration,
}

impl TrainBudget {
    /// Steps affordable now, the time since the last observation earned.
    fn steps(&mut self, now: Instant) -> usize {
        if let Some(last) = self.last {
            self.left += now.saturating_duration_since(last).mul_f64(TRAIN_SHARE);
        }
        let max = super::narx::STEPS;
        if self.step.is_zero() {
            return max;
        }
        // Unspent time is kept for at most one observation's full training.
        self.left = self.left.min(self.step * max as u32);
        ((self.left.as_secs_f64() / self.step.as_secs_f64()) as usize).min(max)
    }

    /// `steps` took `spent`.
    fn spent(&mut self, steps: usize, spent: Duration) {
        self.left = self.left.saturating_sub(spent);
        if steps > 0 {
            self.step = spent / steps as u32;
        }
        self.last = Some(Instant::now());
    }
}

/// Rows per second of a thread's time in chunks, times the threads (0 when the rank computed no
/// rows: it learned nothing).
pub(crate) fn measured_speed(rows: u64, threads: usize, busy: Duration) -> f64 {
    let busy = busy.as_secs_f64();
    if rows > 0 && busy > 0.0 {
        rows as f64 * threads as f64 / busy
    } else {
        0.0
    }
}

impl Policy for Balanced {
    fn takes_over(&self) -> bool {
        false
    }

    fn chunks(&mut self, view: &dyn View, it: u64, plan: &Plan) -> Result<Range<usize>> {
        // Every rank's prediction for this iteration (one of its two words), in one batch.
        let n = view.world();
        let r = view.rank();
        let slot = (it % 2) as usize;
        let preds = match &self.preds {
            Published::Tree(sums) => {
                let (world, (before, mine)) = (sums.totals(slot)?, sums.before(r, slot)?);
                let next = plan.batch_chunks(it + 1);
                self.level = Some((world, next - n * usize::from(next >= n)));
                return Ok(part_by_sums(plan.batch_chunks(it), n, r, world, before, mine));
            }
            Published::Words(w) => w,
        };
        let part = |starts: &[usize]| starts[r]..starts[r + 1];
        if let Some(shared) = &self.shared {
            let split = shared.split.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((_, starts)) = split.as_ref().filter(|(at, _)| *at == it) {
                preds.count_loads(n);
                return Ok(part(starts));
            }
        }
        let words: Vec<_> = (0..n).map(|r| 2 * r + slot..2 * r + slot + 1).collect();
        let mut bits = vec![0; n];
        preds.load_batch(&words, &mut bits)?;
        self.speeds.clear();
        self.speeds.extend(bits.into_iter().map(f64::from_bits));
        let starts: Arc<[usize]> = split_starts(plan.batch_chunks(it), &self.speeds).into();
        if let Some(shared) = &self.shared {
            *shared.split.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some((it, starts.clone()));
        }
        Ok(part(&starts))
    }

    fn state(&self) -> Vec<f64> {
        let mut v = vec![self.last];
        v.extend(self.history.to_vec());
        v
    }

    fn restore(&mut self, rank: usize, state: &[f64]) -> Result<()> {
        let predictor = self.history.predictor;
        let Some((&last, rest)) = state.split_first() else { return Ok(()) };
        if let (Some(h), true) = (History::from_vec(predictor, rest), last.is_finite() && last >= 0.0) {
            (self.history, self.last) = (h, last);
            // The first iterations after the resume split by this prediction (either parity).
            if let (Published::Words(preds), true) = (&self.preds, last > 0.0) {
                self.overwrite(0);
                self.overwrite(1);
                preds.swap(2 * rank, last.to_bits())?;
                preds.swap(2 * rank + 1, last.to_bits())?;
            }
        }
        Ok(())
    }

    fn before_tick(&mut self, view: &dyn View, it: u64, busy: Duration, rec: &mut IterRecord) -> Result<()> {
        // Publish the prediction before the tick: after the BSP wait everyone reads it. A rank
        // given no rows (all its chunks went to others) learned nothing: its prediction stands.
        let speed = measured_speed(rec.rows, rec.threads, busy);
        rec.scheme.set("speed", Figure::Value(speed.max(0.0)));
        if speed > 0.0 {
            let (cpu, mem) = self.loads.as_mut().map_or((0.0, 0.0), Loads::get);
            if self.last > 0.0 {
                self.error += (self.last - speed).abs() / speed;
                self.predictions += 1;
            }
            self.last = match self.budget.as_mut() {
                Some(b) => {
                    let now = Instant::now();
                    let steps = b.steps(now);
                    let p = self.history.observe_with(speed, cpu, mem, steps);
                    b.spent(steps, now.elapsed());
                    p
                }
                None => self.history.observe(speed, cpu, mem),
            };
        }
        rec.scheme.set("predicted", Figure::Value(self.last));
        // Slot (t + 1) mod 2: a rank still starting t reads slot t mod 2, and nobody can write
        // slot t mod 2 again (for t + 2) before everyone has started t + 1.
        let slot = ((it + 1) % 2) as usize;
        match &self.preds {
            Published::Words(preds) => {
                self.overwrite(slot);
                preds.swap(2 * view.rank() + slot, self.last.to_bits())?;
            }
            Published::Tree(sums) => {
                sums.add(view.rank(), slot, published(fixed(self.last), self.level, view.world()))?
            }
        }
        Ok(())
    }

    fn ready(&self, view: &dyn View, it: u64) -> Result<bool> {
        Bound::Bsp.ready(view, it)
    }

    fn staleness(&self) -> Option<u64> {
        Bound::Bsp.staleness()
    }

    /// BSP's wait: every rank's push of the iteration is in before anyone steps, so a dense
    /// model steps at the owners. Uneven batches change nothing there: each rank's push is its
    /// rows' part of the batch's mean gradient, and the parts sum to it.
    fn synchronous(&self) -> bool {
        true
    }

    fn totals(&self, totals: &mut RankTotals) {
        totals.prediction_error = self.error;
        totals.predictions = self.predictions;
    }

    fn free(self: Box<Self>) -> Result<()> {
        match self.preds {
            Published::Words(w) => w.free(),
            Published::Tree(sums) => sums.free(),
        }
    }
}

/// Which predictor sets the batch shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Predictor {
    /// Linear ARX over past speeds with CPU and memory load as inputs, recursive least squares.
    Arx,
    /// Mean of the last 5 speeds.
    MovingAverage,
    /// A nonlinear autoregressive network with the loads as exogenous inputs, trained online
    /// ([`Narx`]).
    Narx,
}

impl Predictor {
    /// Every predictor, in the order tables list them.
    pub const ALL: [Predictor; 3] = [Predictor::Arx, Predictor::MovingAverage, Predictor::Narx];
}

impl fmt::Display for Predictor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Arx => "arx",
            Self::MovingAverage => "ma",
            Self::Narx => "narx",
        })
    }
}

const FEATURES: usize = 5;
const FORGET: f64 = 0.98;
/// Largest trace of the RLS covariance. With forgetting, directions the inputs do not excite
/// (the loads barely move, and they move with the constant) see their covariance grow by
/// `1 / FORGET` every step until one small change swings the estimate wildly ("covariance
/// windup"): measured, predictions were off by 95% on average on steady ranks. Capping the trace
/// bounds the gain.
const MAX_TRACE: f64 = 1000.0;
const WINDOW: usize = 5;
/// The ARX prediction stays within this factor of the last speed.
const MAX_JUMP: f64 = 4.0;

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
    /// The network (NARX only).
    narx: Option<Box<Narx>>,
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
        let narx = (predictor == Predictor::Narx).then(|| Box::new(Narx::new()));
        Self { predictor, speeds: VecDeque::new(), scale: 0.0, last_x: None, theta, p, observed: 0, narx }
    }

    /// Records the speed of the iteration just done (with the loads seen during it) and returns
    /// the prediction for the next one (positive).
    pub fn observe(&mut self, speed: f64, cpu: f64, mem: f64) -> f64 {
        self.observe_with(speed, cpu, mem, super::narx::STEPS)
    }

    /// [`History::observe`] with at most `steps` training steps of the NARX network.
    pub fn observe_with(&mut self, speed: f64, cpu: f64, mem: f64, steps: usize) -> f64 {
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
            Predictor::Narx => {
                let net = self.narx.get_or_insert_with(|| Box::new(Narx::new()));
                let y = net.observe_with(speed, cpu, mem, steps) / self.scale;
                y.clamp(s / MAX_JUMP, MAX_JUMP * s)
            }
            Predictor::MovingAverage => self.speeds.iter().sum::<f64>() / self.speeds.len() as f64,
            Predictor::Arx if self.observed < 4 => s,
            Predictor::Arx => {
                let y: f64 = self.theta.iter().zip(&x).map(|(t, v)| t * v).sum();
                // A wild extrapolation is worse than none.
                y.clamp(s / MAX_JUMP, MAX_JUMP * s)
            }
        };
        predicted * self.scale
    }

    /// The history as numbers: scale, observations, the last features (a flag, then
    /// `FEATURES` values), theta, P row by row, the speeds in the window (as many as
    /// observations, up to 5), then the network's numbers (NARX only, [`Narx::to_vec`]).
    pub fn to_vec(&self) -> Vec<f64> {
        let mut v = vec![self.scale, self.observed as f64, f64::from(u8::from(self.last_x.is_some()))];
        v.extend(self.last_x.unwrap_or_default());
        v.extend(self.theta);
        v.extend(self.p.iter().flatten());
        v.extend(&self.speeds);
        if let Some(net) = &self.narx {
            v.extend(net.to_vec());
        }
        v
    }

    /// A history of `predictor` from [`History::to_vec`]'s numbers (`None` if they do not fit).
    pub fn from_vec(predictor: Predictor, v: &[f64]) -> Option<Self> {
        let fixed = 3 + FEATURES + FEATURES + FEATURES * FEATURES;
        if v.len() < fixed || v[..fixed].iter().any(|x| !x.is_finite()) || v[1] < 0.0 || v[1].fract() != 0.0 {
            return None;
        }
        let in_window = (v[1] as usize).min(WINDOW);
        let speeds = v.get(fixed..fixed + in_window)?;
        let rest = &v[fixed + in_window..];
        let narx = match predictor {
            Predictor::Narx => match Narx::from_vec(rest)? {
                (net, used) if used == rest.len() => Some(Box::new(net)),
                _ => return None,
            },
            _ if rest.is_empty() => None,
            _ => return None,
        };
        if speeds.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let arr = |at: usize| -> [f64; FEATURES] { std::array::from_fn(|i| v[at + i]) };
        let mut p = [[0.0; FEATURES]; FEATURES];
        for (i, row) in p.iter_mut().enumerate() {
            *row = arr(3 + 2 * FEATURES + i * FEATURES);
        }
        Some(Self {
            predictor,
            scale: v[0],
            observed: v[1] as usize,
            last_x: (v[2] != 0.0).then(|| arr(3)),
            theta: arr(3 + FEATURES),
            p,
            speeds: speeds.iter().copied().collect(),
            narx,
        })
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
        let trace: f64 = (0..FEATURES).map(|i| self.p[i][i]).sum();
        if trace > MAX_TRACE {
            let f = MAX_TRACE / trace;
            self.p.iter_mut().flatten().for_each(|v| *v *= f);
        }
    }
}

/// How old the node's loads may be before they are read again.
const LOADS_MAX_AGE: Duration = Duration::from_millis(200);

/// The node's loads, read again at most every 200 ms: reading /proc/meminfo costs tens of
/// microseconds, a noticeable share of a short iteration, and a 1-minute load average does not
/// move faster.
#[derive(Debug, Default)]
pub struct Loads {
    last: Option<(std::time::Instant, (f64, f64))>,
}

impl Loads {
    /// `(cpu, memory)` as [`loads`] reads them, at most 200 ms old.
    pub fn get(&mut self) -> (f64, f64) {
        match self.last {
            Some((at, v)) if at.elapsed() < LOADS_MAX_AGE => v,
            _ => {
                let v = loads();
                self.last = Some((std::time::Instant::now(), v));
                v
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

/// How much shorter (predicted) a weighted split must make the iteration before it replaces the
/// even split: moving chunks on the strength of noisy speed estimates costs more than it saves
/// (with one chunk of eight moved by a 10% measurement wobble, every iteration waits for the
/// rank that got the extra chunk).
const MIN_GAIN: f64 = 0.05;

/// Splits `chunks` chunks over ranks by predicted `speeds` (chunks per unit of time; non-positive
/// or non-finite ones count as the mean of the others, all such: even split): rank `r`'s chunks
/// are `starts[r]..starts[r + 1]`. The split minimizes the predicted makespan `max(n_r / s_r)`
/// over whole chunks with at least one chunk each (each chunk goes where it finishes first, ties
/// to the lower rank), and is used only when it beats the even split's by at least
/// [`MIN_GAIN`]; every rank derives the same split from the same speeds.
pub(crate) fn split_starts(chunks: usize, speeds: &[f64]) -> Vec<usize> {
    let n = speeds.len();
    let good: Vec<f64> = speeds.iter().copied().filter(|w| w.is_finite() && *w > 0.0).collect();
    let mean = if good.is_empty() { 1.0 } else { good.iter().sum::<f64>() / good.len() as f64 };
    let s: Vec<f64> = speeds.iter().map(|&x| if x.is_finite() && x > 0.0 { x } else { mean }).collect();
    let even: Vec<usize> = (0..n).map(|k| crate::plan::split(chunks, k, n).len()).collect();
    let makespan = |counts: &[usize]| counts.iter().zip(&s).map(|(&c, &v)| c as f64 / v).fold(0.0, f64::max);
    // Every rank keeps at least one chunk (when there are enough): a rank given none would never
    // measure its speed again, and a low estimate would stick.
    let floor = usize::from(chunks >= n);
    let best = fill(chunks, &s, floor);
    let counts = if makespan(&best) < (1.0 - MIN_GAIN) * makespan(&even) { best } else { even };
    std::iter::once(0)
        .chain(counts.iter().scan(0, |at, &c| {
            *at += c;
            Some(*at)
        }))
        .collect()
}

/// What a rank adds to the tree of sums past [`READ_ALL_UP_TO`] ranks ([`part_by_sums`] splits
/// by them): its prediction in fixed point (0: none); its base count, the chunks its prediction
/// earns at the last split's level (`spare * p / S` rounded down, `S` the predictions' sum then,
/// `spare` the chunks beyond one a rank of the next iteration), and its weight for the chunks
/// the base counts leave: its prediction if at least the last split's mean, else 0. Without a
/// last split in which every rank had a prediction, no base count and the prediction as weight.
pub(crate) fn published(pred: Option<u64>, level: Option<(Totals, usize)>, n: usize) -> [u64; PARTS] {
    let Some(p) = pred else { return [0; PARTS] };
    match level {
        Some((t, spare)) if t.count == n as u64 && t.sum[0] > 0 => {
            // At most `spare` (a prediction far above the last split's sum): the sum of the
            // base counts then exceeds the batch and the split falls back to proportions.
            let base = (u128::from(p) * spare as u128 / u128::from(t.sum[0])).min(spare as u128);
            let fast = u128::from(p) * u128::from(t.count) >= u128::from(t.sum[0]);
            [p, base as u64, if fast { p } else { 0 }]
        }
        _ => [p, 0, p],
    }
}

/// Rank `rank`'s part of `chunks` chunks split over `n` ranks by their predictions, from the
/// tree of sums ([`crate::sums`]) of what they [`published`]: `world`, every rank's, `before`,
/// those of ranks `0..rank`, and `mine`. Each rank keeps at least one chunk (when there are
/// enough), in integers from prefix sums alone, so that the parts of all ranks tile the batch
/// exactly:
/// - where every rank predicted and the base counts fit the batch: its base count, and of the
///   chunks left `L`, rank `k` starts at `B_k + round(L * F_k / F)` (`B_k`, `F_k` the base
///   counts and weights before it, `F` all weights). A rank slower than the mean gets its base
///   count, rounded down, as water-filling gives a slow rank no chunk it would finish last; the
///   others share the rest in proportion;
/// - otherwise, in proportion to the predictions, a rank without one counting as their mean
///   (as in [`split_starts`]): rank `k` starts at `round(spare * P_k / S)`;
/// - none at all: the even split.
///
/// Each part is within a chunk of its proportional share or of its base count. Used only
/// where it beats the even split by [`MIN_GAIN`], judged from the totals alone (the proportional
/// split's makespan is at most `spare / S + 2 / slowest`, against the even split's), so that
/// every rank decides alike.
pub(crate) fn part_by_sums(
    chunks: usize,
    n: usize,
    rank: usize,
    world: Totals,
    before: Totals,
    mine: [u64; PARTS],
) -> Range<usize> {
    let even = crate::plan::split(chunks, rank, n);
    if world.count == 0 || world.sum[0] == 0 || n == 0 {
        return even;
    }
    let floor = usize::from(chunks >= n);
    let spare = (chunks - floor * n) as u128;
    let mean = world.sum[0] as f64 / world.count as f64;
    let slowest = match world.min {
        Some(m) if world.count == n as u64 => m as f64,
        Some(m) => (m as f64).min(mean),
        None => mean,
    };
    let weighted = spare as f64 / (mean * n as f64) + (floor + 1) as f64 / slowest;
    if weighted >= (1.0 - MIN_GAIN) * chunks.div_ceil(n) as f64 / slowest {
        return even;
    }
    // `base + round(left * weight_before / weights)` from the start of the rank's parts.
    let at = |k: usize, base: u128, left: u128, p: u128, total: u128| {
        k * floor + (base + (2 * left * p + total) / (2 * total)) as usize
    };
    let [_, bases, weights] = world.sum.map(u128::from);
    if world.count == n as u64 && bases <= spare && weights > 0 {
        let (b, w) = (u128::from(before.sum[1]), u128::from(before.sum[2]));
        let left = spare - bases;
        let (own_b, own_w) = (u128::from(mine[1]), u128::from(mine[2]));
        return at(rank, b, left, w, weights)..at(rank + 1, b + own_b, left, w + own_w, weights);
    }
    // Every prediction times the count of predictions, a missing one as their sum (the mean,
    // times the count): integers throughout, so every rank computes the same starts.
    let (count, sum) = (u128::from(world.count), u128::from(world.sum[0]));
    let total = sum * n as u128;
    let own = if mine[0] > 0 { u128::from(mine[0]) * count } else { sum };
    let prefix = u128::from(before.sum[0]) * count + (rank as u128 - u128::from(before.count)) * sum;
    at(rank, 0, spare, prefix, total)..at(rank + 1, 0, spare, prefix + own, total)
}

/// Water-filling: `floor` chunks each, then each further chunk to the rank that would finish it
/// first (`(count + 1) / speed` smallest, ties to the lowest rank), until `chunks` are given.
/// Starts from a proportional share known not to exceed the result (see below) and fills the
/// rest from a heap: O(n log n) instead of O(chunks x n), which at 4,096 ranks and 65,536 chunks
/// was 268 M steps per rank and iteration.
fn fill(chunks: usize, s: &[f64], floor: usize) -> Vec<usize> {
    use std::cmp::Reverse;
    let n = s.len();
    let total: f64 = s.iter().sum();
    let spare = chunks - floor * n;
    // The greedy's last value `l` satisfies chunks <= n floor + l total, and every rank gets at
    // least ceil(l s_k) - 1 >= floor(spare s_k / total) - 1 chunks: a lower bound to start from.
    let mut counts: Vec<usize> = s
        .iter()
        .map(|&v| floor.max(((spare as f64 * v / total).floor() as usize).saturating_sub(1)))
        .collect();
    let mut given: usize = counts.iter().sum();
    if given > chunks {
        counts = vec![floor; n];
        given = floor * n;
    }
    /// `(count + 1) / speed` of rank `k`, ordered as f64 by total order, then by rank.
    #[derive(PartialEq)]
    struct Next(f64, usize);
    impl Eq for Next {}
    impl PartialOrd for Next {
        fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Next {
        fn cmp(&self, o: &Self) -> std::cmp::Ordering {
            self.0.total_cmp(&o.0).then(self.1.cmp(&o.1))
        }
    }
    let mut heap: std::collections::BinaryHeap<Reverse<Next>> =
        (0..n).map(|k| Reverse(Next((counts[k] + 1) as f64 / s[k], k))).collect();
    while given < chunks {
        let Some(Reverse(Next(_, k))) = heap.pop() else { break };
        counts[k] += 1;
        given += 1;
        heap.push(Reverse(Next((counts[k] + 1) as f64 / s[k], k)));
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank `r`'s part of [`split_starts`].
    fn split_weighted(chunks: usize, speeds: &[f64], r: usize) -> std::ops::Range<usize> {
        let starts = split_starts(chunks, speeds);
        starts[r]..starts[r + 1]
    }

    #[test]
    fn a_simulated_world_splits_once_and_each_rank_gets_what_it_would_compute() {
        use peregrine_transport::Transport;
        let n = 3;
        let world: Vec<Transport> = peregrine_transport::local::serial_world(n)
            .expect("a serial world")
            .into_iter()
            .map(Transport::Local)
            .collect();
        let plan = Plan::new(6400, 640, n, 64, 1).expect("a plan");
        let shared = Arc::new(Shared::default());
        let kind = LbBsp { predictor: Predictor::MovingAverage };
        let mut policies: Vec<_> = world
            .iter()
            .map(|t| {
                let setup = Setup {
                    t,
                    steal: false,
                    start: 0,
                    plan: &plan,
                    simulated: true,
                    params: 0,
                    shared: Some(shared.clone()),
                };
                kind.policy(&setup).expect("a policy")
            })
            .collect();
        let view = |r| super::super::Snapshot::new(r, n);
        // Iteration 0 publishes speeds 1, 2 and 1 for iteration 1 (rank r computed 640 rows).
        for (r, p) in policies.iter_mut().enumerate() {
            let mut rec = IterRecord { rows: 640, threads: 1, ..Default::default() };
            let busy = Duration::from_secs_f64(if r == 1 { 0.5 } else { 1.0 });
            p.before_tick(&view(r), 0, busy, &mut rec).expect("a hook");
        }
        for t in &world {
            t.take_ops();
        }
        let want = split_starts(plan.batch_chunks(1), &[640.0, 1280.0, 640.0]);
        assert_eq!(want, [0, 3, 8, 10]);
        for (r, p) in policies.iter_mut().enumerate() {
            assert_eq!(p.chunks(&view(r), 1, &plan).expect("a split"), want[r]..want[r + 1], "rank {r}");
            // Charged as reading every rank's word in one batch, computed or shared.
            assert_eq!(world[r].take_ops(), peregrine_transport::Ops::batch(n), "rank {r}");
        }
        assert_eq!(shared.split.lock().expect("the split").as_ref().map(|(it, _)| *it), Some(1));
        // A write of the other parity keeps it; a write of its own parity drops it.
        let mut rec = IterRecord { rows: 640, threads: 1, ..Default::default() };
        policies[0].before_tick(&view(0), 1, Duration::from_secs(1), &mut rec).expect("a hook");
        assert!(shared.split.lock().expect("the split").is_some());
        policies[0].before_tick(&view(0), 2, Duration::from_secs(1), &mut rec).expect("a hook");
        assert!(shared.split.lock().expect("the split").is_none());
    }

    #[test]
    fn narx_trains_within_its_share_of_the_time() {
        let mut b = TrainBudget::default();
        let t0 = Instant::now();
        assert_eq!(b.steps(t0), super::super::narx::STEPS, "cost unknown: a full observation");
        b.step = Duration::from_micros(50);
        b.left = Duration::ZERO;
        b.last = Some(t0);
        // 1 ms later, 5 % of it: one 50 us step.
        assert_eq!(b.steps(t0 + Duration::from_millis(1)), 1);
        b.spent(1, Duration::from_micros(50));
        assert!(b.left < Duration::from_micros(5), "{:?}", b.left);
        // 100 ms later: capped at a full observation's steps, and so is what is kept.
        b.last = Some(t0);
        assert_eq!(b.steps(t0 + Duration::from_millis(100)), 4);
        assert_eq!(b.left, Duration::from_micros(200));
    }

    #[test]
    fn measured_speed_counts_every_thread() {
        // 600 rows by 2 threads that were busy 0.3 s together: each thread did 300 rows in
        // 0.15 s of its own time, 2000 rows per second each, 4000 together.
        assert_eq!(measured_speed(600, 2, Duration::from_millis(300)), 4000.0);
        assert_eq!(measured_speed(0, 2, Duration::from_millis(300)), 0.0, "no rows, no measure");
    }

    /// The water-filling as first written: one chunk at a time over every rank.
    fn fill_slowly(chunks: usize, s: &[f64], floor: usize) -> Vec<usize> {
        let n = s.len();
        let mut best = vec![floor; n];
        for _ in 0..chunks - floor * n {
            let k = (0..n)
                .min_by(|&a, &b| ((best[a] + 1) as f64 / s[a]).total_cmp(&((best[b] + 1) as f64 / s[b])))
                .expect("at least one rank");
            best[k] += 1;
        }
        best
    }

    #[test]
    fn a_history_saved_and_restored_predicts_as_the_original_goes_on() {
        for predictor in Predictor::ALL {
            let mut a = History::new(predictor);
            for k in 0..9 {
                a.observe(100.0 + 10.0 * f64::from(k % 3), 0.1 * f64::from(k), 0.5);
            }
            let mut b = History::from_vec(predictor, &a.to_vec()).expect("fits");
            for k in 0..6 {
                let speed = 120.0 - 7.0 * f64::from(k);
                assert_eq!(a.observe(speed, 0.3, 0.4), b.observe(speed, 0.3, 0.4), "{predictor} step {k}");
            }
        }
        assert!(History::from_vec(Predictor::Arx, &[1.0, 2.0]).is_none());
        assert!(History::from_vec(Predictor::Arx, &[f64::NAN; 40]).is_none());
    }

    proptest::proptest! {
        #[test]
        fn the_fast_fill_is_the_one_chunk_at_a_time_fill(
            speeds in proptest::collection::vec(prop_oneof_speed(), 1..40),
            extra in 0usize..500,
        ) {
            let n = speeds.len();
            for floor in [0, 1] {
                let chunks = floor * n + extra;
                proptest::prop_assert_eq!(fill(chunks, &speeds, floor), fill_slowly(chunks, &speeds, floor));
            }
        }
    }

    /// Speeds with ties (small integers) and without.
    fn prop_oneof_speed() -> impl proptest::strategy::Strategy<Value = f64> {
        use proptest::strategy::Strategy;
        proptest::prop_oneof![(1u32..5).prop_map(f64::from), 0.01f64..100.0]
    }

    #[test]
    fn weighted_splits_cover_everything_in_proportion() {
        let w = [1.0, 0.5, 0.5];
        let parts: Vec<_> = (0..3).map(|r| split_weighted(100, &w, r)).collect();
        assert_eq!(parts, vec![0..50, 50..75, 75..100]);
        let even: Vec<_> = (0..4).map(|r| split_weighted(10, &[0.0; 4], r).len()).collect();
        assert_eq!(even.iter().sum::<usize>(), 10);
        assert!(even.iter().all(|&n| (2..=3).contains(&n)));
        assert_eq!(split_weighted(10, &[2.0, f64::NAN], 1), 5..10, "a missing weight counts as the mean");
        // 8 chunks at speeds 1 and 0.85: moving one makes 5 / 1 against 4 / 0.85 = 4.7, no gain;
        // at 1 and 0.7: 5 / 1 and 3 / 0.7 against 4 / 0.7 = 5.7, moved.
        assert_eq!(split_weighted(8, &[1.0, 0.85], 0), 0..4);
        assert_eq!(split_weighted(8, &[1.0, 0.7], 0), 0..5);
        assert_eq!(split_weighted(8, &[0.5, 1.0], 0), 0..3, "the slow rank gets fewer");
    }

    /// Every rank's part of [`part_by_sums`] when each [`published`] its prediction in `speeds`
    /// at `level`, the tree's totals computed here; and the totals.
    fn parts_by_sums(
        chunks: usize,
        speeds: &[Option<u64>],
        level: Option<(Totals, usize)>,
    ) -> (Vec<Range<usize>>, Totals) {
        let n = speeds.len();
        let values: Vec<[u64; PARTS]> = speeds.iter().map(|&p| published(p, level, n)).collect();
        let totals = |vs: &[[u64; PARTS]]| {
            vs.iter().fold(Totals::default(), |mut t, &v| {
                t.add(Totals::of(v));
                t
            })
        };
        let world = totals(&values);
        let parts =
            (0..n).map(|r| part_by_sums(chunks, n, r, world, totals(&values[..r]), values[r])).collect();
        (parts, world)
    }

    /// Two splits of `chunks` by `speeds`: the first without a level, the second at the first's.
    fn two_splits(chunks: usize, speeds: &[Option<u64>]) -> [Vec<Range<usize>>; 2] {
        let (first, world) = parts_by_sums(chunks, speeds, None);
        let spare = chunks - speeds.len() * usize::from(chunks >= speeds.len());
        [first, parts_by_sums(chunks, speeds, Some((world, spare))).0]
    }

    #[test]
    fn parts_from_the_tree_of_sums_are_proportional_and_tile_the_batch() {
        // 100 ranks, 3200 chunks; rank 0 at half the others' speed: one chunk each, then the 3100
        // left in proportion (99.5 shares: 31.16 chunks a share). The first split: rank 0 ends
        // at 1 + round(15.58) = 17 chunks, rank 1 at 2 + round(15.58 + 31.16) = 49.
        let mut speeds = vec![Some(2048); 100];
        speeds[0] = Some(1024);
        let [first, second] = two_splits(3200, &speeds);
        assert_eq!((first[0].clone(), first[1].clone(), first[99].end), (0..17, 17..49, 3200));
        // The second, at the first's level: base counts 15 (rank 0) and 31 (the others), 3084 in
        // all; the 16 left go to the ranks at or above the mean in proportion. Rank 0 gets
        // 1 + 15 = 16 chunks (as water-filling: at 16 it would finish its 17th after every fast
        // rank its 33rd), rank 1 2 + 46 + round(16 / 99) = 48.
        assert_eq!((second[0].clone(), second[1].clone(), second[99].end), (0..16, 16..48, 3200));
        assert_eq!(second.iter().filter(|p| p.len() == 33).count(), 16);
        // A missing prediction counts as the mean: all missing but one, the even split.
        let mut one = vec![None; 100];
        one[5] = Some(3000);
        assert!(two_splits(3200, &one).iter().flatten().all(|p| p.len() == 32));
        // Noise of a few percent moves nothing (the even split's makespan is not beaten by 5 %).
        let noisy: Vec<_> = (0..100).map(|r| Some(1000 + (r % 7) * 10)).collect();
        assert!(two_splits(3200, &noisy).iter().flatten().all(|p| p.len() == 32));
    }

    proptest::proptest! {
        #[test]
        fn parts_by_sums_cover_every_chunk_once_and_stay_within_a_chunk_of_the_share(
            chunks in 0usize..5000,
            speeds in proptest::collection::vec(proptest::option::weighted(0.9, 1u64..1 << 38), 1..300),
        ) {
            let n = speeds.len();
            let floor = usize::from(chunks >= n);
            let spare = (chunks - floor * n) as f64;
            let (_, world) = parts_by_sums(chunks, &speeds, None);
            let [first, second] = two_splits(chunks, &speeds);
            for (round, parts) in [first, second].iter().enumerate() {
                let mut at = 0;
                for p in parts {
                    proptest::prop_assert_eq!(p.start, at);
                    proptest::prop_assert!(p.end >= p.start);
                    if chunks >= n {
                        proptest::prop_assert!(!p.is_empty(), "every rank keeps a chunk");
                    }
                    at = p.end;
                }
                proptest::prop_assert_eq!(at, chunks);
                if (0..n).all(|r| parts[r] == crate::plan::split(chunks, r, n)) {
                    continue;
                }
                // Within a chunk of the share: in proportion to the predictions (a missing one as
                // their mean); in the second split with every rank predicting, of the base count
                // plus a share of what the base counts leave, by the weights.
                let v: Vec<f64> = speeds.iter().flatten().map(|&x| x as f64).collect();
                let mean = v.iter().sum::<f64>() / v.len() as f64;
                let s: Vec<f64> = speeds.iter().map(|x| x.map_or(mean, |x| x as f64)).collect();
                let total = s.iter().sum::<f64>();
                let level = (round == 1).then_some((world, chunks - floor * n));
                let values: Vec<_> = speeds.iter().map(|&p| published(p, level, n)).collect();
                let (bases, weights) = values.iter().fold((0, 0), |(b, w), v| (b + v[1], w + v[2]));
                for (p, (sk, v)) in parts.iter().zip(s.iter().zip(&values)) {
                    let share = if world.count == n as u64 && bases as f64 <= spare && weights > 0 {
                        floor as f64 + v[1] as f64 + (spare - bases as f64) * v[2] as f64 / weights as f64
                    } else {
                        floor as f64 + spare * sk / total
                    };
                    let off = (p.len() as f64 - share).abs();
                    proptest::prop_assert!(off <= 1.0 + 1e-6, "{} vs {share}", p.len());
                }
            }
        }
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
    fn arx_stays_calm_on_noise() {
        // Steady speed with 10% noise and steady loads, as on a quiet rank: the ARX fit must not
        // wind up (its error stays near the average's, not many times it).
        let (mut arx, mut ma) = (History::new(Predictor::Arx), History::new(Predictor::MovingAverage));
        let (mut ea, mut em, mut pa, mut pm) = (0.0, 0.0, 0.0, 0.0);
        for t in 0..2000u64 {
            let noise = (crate::plan::mix(t) % 1000) as f64 / 1000.0 - 0.5;
            let s = 1000.0 * (1.0 + 0.2 * noise);
            if t > 20 {
                ea += (pa - s).abs() / s;
                em += (pm - s).abs() / s;
            }
            pa = arx.observe(s, 0.5 + 1e-4 * (t % 7) as f64, 0.3);
            pm = ma.observe(s, 0.5, 0.3);
        }
        assert!(ea < 1.3 * em, "ARX error {ea} vs moving average {em}");
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
