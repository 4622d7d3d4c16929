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

use crate::sums::{Sums, Totals};

use super::narx::Narx;
use super::staleness::Bound;
use super::{Family, Parsed, Policy, Result, SchemeKind, Setup, Shared, View};
use crate::plan::Plan;
use crate::record::{Figure, IterRecord, RankTotals};
use split::{fixed, floor_and_spare, part_by_sums, published, split_starts};

mod split;

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
/// 60 iterations, time per iteration / Ideal, reading every prediction -> the tree, its reads
/// plain gets), 64 ranks 1.02x -> 1.05x with no straggler and 1.27x -> 1.30x with one at half
/// speed, 128 ranks 1.04x -> 1.05x and 1.29x -> 1.30x, 256 ranks 1.08x -> 1.06x and 1.33x ->
/// 1.31x; 4,096 ranks 2.45x -> 1.32x with the straggler.
pub(crate) const READ_ALL_UP_TO: usize = 128;

/// Where the ranks' predictions are published.
enum Published {
    /// Every rank's predicted speed (f64 bits) for iterations of either parity, each rank
    /// reading all (up to [`READ_ALL_UP_TO`] ranks).
    Words(Window<u64>),
    /// Their sums in fixed point ([`fixed`]), a round per parity.
    Tree(Sums),
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
        let n = view.world();
        let r = view.rank();
        let slot = (it % 2) as usize;
        let preds = match &self.preds {
            Published::Tree(sums) => {
                let (world, (before, mine)) = (sums.totals(slot)?, sums.before(r, slot)?);
                self.level = Some((world, floor_and_spare(plan.batch_chunks(it + 1), n).1));
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
        // Every rank's prediction for this iteration (one of its two words), in one batch.
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

#[cfg(test)]
mod tests {
    use super::*;

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
