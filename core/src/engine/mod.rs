//! The training loop: every rank a worker, the parameters sharded over all ranks in one window, no
//! server code anywhere. The engine is mechanism only (windows, queues, the pool, pulls and
//! pushes, waits); what to wait for, whom to take chunks from and which update applies is the
//! scheme's [`Policy`](crate::scheme), asked at named hooks (`crate::scheme`'s README lists them
//! in order).
//!
//! One iteration `t` of rank `r` (`run`):
//! 1. **open**: its active threads and chunks of `t` (hooks `begin`, `threads`, `chunks`,
//!    `open`), announced ([`Clocks::start`](crate::clocks::Clocks::start)) and queued;
//! 2. **pull** (`comm`): `get` the whole model (dense) or only the keys its chunks read
//!    (sparse) into the rank's replica;
//! 3. **compute** (`compute`): the pool's active threads take chunks from the rank's queue (the
//!    same window word thieves use) as the policy says (`own_chunks`, `after_own_chunk`) and, when
//!    it is empty, take over chunks from other ranks (`victim`), reading their parameters
//!    themselves (dense models use the replica, sparse ones pull the chunk's keys into a
//!    per-thread buffer); if the policy lines up (`line_up`), the rank then waits until every
//!    rank's chunks of `t` are done, helping with queued ones or copying running ones (`copy`),
//!    so that nobody reads `t`'s parameters after someone changed them;
//! 4. **push** (`comm`): the threads' updates are summed, scaled as the policy admits
//!    (`admit`) and `accumulate`d into the owning shards, then flushed; the clock ticks
//!    (`before_tick`, `after_tick`);
//! 5. **wait** until the policy is `ready`; 6. **close**: the record (`end`), metrics,
//!    evaluations.
//!
//! Evaluation pauses the world without lining the ranks up by iteration (`evals`): at the first
//! of its iterations at or past each multiple of `eval_every` (once for several multiples, when it
//! skipped ahead past them) rank 0 raises a request counter (a word in a window); every rank
//! checks it at the end of each iteration and in every wait, and then all ranks evaluate the model
//! as it is (each on its share of the evaluation rows) and go on. Under ASP a fast rank is thus not
//! held back to the slow rank's iteration count by evaluations (a collective at fixed iterations
//! would make every evaluation a barrier). Evaluation time is excluded from the training time
//! reported.
//!
//! Checkpoints ([`Config::checkpoint_every`]) are taken at a point every rank agrees on: before
//! starting its first iteration at or after the checkpoint's, each rank raises an arrival
//! counter and waits (joining evaluations meanwhile) until all have arrived. Every rank has then
//! pushed all of its earlier iterations and started none of the later ones, so the windows hold
//! the model after exactly the iterations before the checkpoint's; rank 0 reads it with the
//! optimizer state and hands a [`Snapshot`] to the caller. A run started from a snapshot
//! ([`Config::resume`]), with any number of ranks, goes on from there: the batch order is a
//! function of the seed and the iteration only.
//!
//! A stop ([`Config::stop`], raised by a signal on any rank) and a timed checkpoint
//! ([`Config::checkpoint_seconds`], asked by rank 0) are requests for such a checkpoint at an
//! iteration the ranks agree on: a rank that sees its own request, or sees another rank's,
//! publishes the next iteration it would begin (at the top of its loop, or from any wait: every
//! wait joins evaluations and checks this) and begins no new one until every rank has published;
//! the checkpoint's iteration is then the largest published, which no rank has begun. Ranks
//! behind run up to it and all take the checkpoint. Requests are counted (one control word), so
//! a run makes any number of them, one at a time. At every checkpoint the ranks also agree
//! whether any was asked to stop; if so, the run ends there with [`TrainError::Stopped`].

use std::io::Write;

use peregrine_transport::Transport;

use crate::inject::{Injection, Pattern};
use crate::model::Model;
use crate::optim::{Optimizer, Schedule};
use crate::plan::{Plan, PlanError};
use crate::pool::RankPool;
use crate::scheme::{Scheme, SchemeError, SchemeSpec};

mod checkpoint;
mod comm;
mod compute;
pub use compute::thread_cpu_time;
mod evals;
mod evaluating;
pub use evals::{best_point, evals_since_best, DIVERGED_ABOVE, RISEN_BY, STALL_EVALS};
mod live;
mod metrics;
mod node;
mod owner;
mod params;
mod protocol;
mod run;
mod slot;
mod trace;
mod watch;
pub use watch::Watchdog;

pub use crate::record::{IterRecord, RankTotals};
pub use metrics::{EvalPoint, Progress, Report};

/// A run's state at a checkpoint: what a run needs to go on from there.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Iterations done: the next to run.
    pub iteration: u64,
    /// The parameter window's values (for FTRL, its `z`; see `weights`).
    pub params: Vec<f32>,
    /// The optimizer state window's values (empty for SGD).
    pub state: Vec<f32>,
    /// The model's weights (FTRL's derived from its state; the window's values otherwise).
    pub weights: Vec<f32>,
    /// The evaluations so far.
    pub evals: Vec<EvalPoint>,
    /// With [`Config::keep_best`]: the weights of the best evaluation's model
    /// ([`best_point`] of `evals`); empty when none is kept.
    pub best: Vec<f32>,
    /// Training seconds so far (evaluations excluded).
    pub train_seconds: f64,
    /// What the ranks' policies learned (`crate::scheme::Policy::state`): empty, or the world
    /// size, a stride, then per rank (one stride each) the length of its state and the state.
    /// A run resumed on as many ranks starts from it; on another number, afresh.
    pub scheme: Vec<f64>,
}

impl Snapshot {
    /// Rank `rank`'s policy state, if the snapshot has one for a world of `world` ranks.
    pub fn scheme_state(&self, rank: usize, world: usize) -> Option<&[f64]> {
        let (&w, rest) = self.scheme.split_first()?;
        let (&stride, all) = rest.split_first()?;
        let stride = stride as usize;
        // Checked: the figures come from a file (a checkpoint), and a stride or length near
        // usize::MAX must read as no state, not overflow.
        if w as usize != world || stride == 0 || Some(all.len()) != world.checked_mul(stride) || rank >= world
        {
            return None;
        }
        let mine = &all[rank * stride..(rank + 1) * stride];
        let len = mine[0] as usize;
        mine.get(1..len.checked_add(1)?)
    }
}

/// Errors of a training run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// A window operation or collective failed.
    #[error(transparent)]
    Transport(#[from] peregrine_transport::Error),
    /// The scheme cannot run in this world.
    #[error(transparent)]
    Scheme(#[from] SchemeError),
    /// The batches and chunks cannot be planned.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// An injected straggler pattern names a rank that does not exist.
    #[error("straggler pattern {pattern}: rank {rank} does not exist in a world of {world}")]
    NoSuchRank {
        /// The pattern.
        pattern: String,
        /// The rank it names.
        rank: usize,
        /// Ranks in the world.
        world: usize,
    },
    /// A setting is out of its range.
    #[error("{setting} must be {accepted}, got {got}")]
    Setting {
        /// The setting.
        setting: &'static str,
        /// What it accepts.
        accepted: String,
        /// What it was.
        got: String,
    },
    /// The loss stopped being a number, or exploded past [`DIVERGED_ABOVE`] times what a model
    /// that predicts nothing scores.
    #[error(
        "training diverged: the evaluation loss is {loss:.4e} after {iter} iterations, where a model that \
         predicts nothing scores {blind:.4}; lower the learning rate"
    )]
    Diverged {
        /// Iterations done.
        iter: u64,
        /// The loss.
        loss: f64,
        /// The loss of a model that predicts nothing ([`crate::model::Baseline::blind_loss`]).
        blind: f64,
    },
    /// With [`Config::stop_on_stall`]: the evaluations show the model not learning.
    #[error("training stopped: {0}")]
    Stalled(String),
    /// Asked to stop ([`Config::stop`]): stopped after the checkpoint of this iteration.
    #[error("stopped as asked, after the checkpoint of iteration {0}")]
    Stopped(u64),
    /// A checkpoint could not be taken or does not fit this run.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// Writing metrics failed.
    #[error("writing metrics to {path}: {source}")]
    Metrics {
        /// The file.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
}

impl TrainError {
    /// Whether the error is in the configuration (the user's to fix) rather than the run.
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Scheme(_) | Self::Plan(_) | Self::Setting { .. } | Self::NoSuchRank { .. })
    }
}

/// What a run does.
#[derive(Clone, Debug)]
pub struct Config {
    /// Synchronization scheme, and whether ranks take over each other's chunks.
    pub scheme: SchemeSpec,
    /// Global mini-batch rows per iteration.
    pub batch: usize,
    /// Rows per chunk.
    pub chunk: usize,
    /// Chunks a thread takes from its own queue at a time (a model that joins chunks computes
    /// them in one call: [`Model::joins_chunks`]).
    pub grain: u32,
    /// Iterations to run (at most).
    pub iterations: u64,
    /// Stop once the evaluation loss is at or below this.
    pub target_loss: Option<f64>,
    /// Early stopping: with `Some(n)`, stop once the evaluation loss has not improved (fallen
    /// below its lowest so far) for `n` evaluations in a row ([`evals_since_best`]). Decided
    /// from the evaluation figures every rank sees, like `target_loss`: every rank stops after
    /// the same evaluation.
    pub early_stop: Option<u64>,
    /// Rank 0 keeps a copy of the weights of the best evaluation so far (the lowest loss):
    /// [`Report::best_params`], and in every [`Snapshot`].
    pub keep_best: bool,
    /// Evaluate every this many iterations (0: only at the end).
    pub eval_every: u64,
    /// Fraction of a victim's remaining chunks a thief takes at once (unless the scheme sizes
    /// transfers itself, as Falcon does).
    pub steal_fraction: f64,
    /// Seed of the initial model and the batch order.
    pub seed: u64,
    /// Active compute threads per rank (at most the pool's size), unless `elastic` says otherwise.
    pub threads: usize,
    /// How a rank's active thread count changes between iterations.
    pub elastic: Elastic,
    /// Injected stragglers (see [`crate::inject`]).
    pub inject: Injection,
    /// Return the final parameters in the report.
    pub keep_params: bool,
    /// The update rule of gradient models (matrix factorization runs SGD on each rating).
    pub optimizer: Optimizer,
    /// How the learning rate changes over the run.
    pub schedule: Schedule,
    /// Stop with an error, not only a warning, when the evaluations show the model stalled (no
    /// better than a constant prediction) or its loss rising ([`TrainError::Stalled`]).
    pub stop_on_stall: bool,
    /// Take a checkpoint every this many iterations (0: never); see [`train_checkpointed`].
    pub checkpoint_every: u64,
    /// With `Some(f)`, checkpoints after the first are spaced further apart than
    /// `checkpoint_every` when that is needed to keep their cost at most the fraction `f` of the
    /// training time (rank 0 measures both and all ranks agree on the next checkpoint's iteration
    /// at each checkpoint).
    pub checkpoint_budget: Option<f64>,
    /// With `Some(s)`, rank 0 also asks for a checkpoint once `s` seconds of training have
    /// passed since the previous one (or the start); the ranks agree on its iteration as they do
    /// for a stop.
    pub checkpoint_seconds: Option<f64>,
    /// Raised (by a signal handler) on any rank: every rank stops at a checkpoint taken at an
    /// iteration they agree on, and the run ends with [`TrainError::Stopped`].
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Start from this checkpoint instead of the initial model.
    pub resume: Option<std::sync::Arc<Snapshot>>,
    /// Sparse models with at most this many parameters are pulled whole, like dense ones: a get
    /// of a small model costs less than finding the keys of a batch (Adult's 122 weights: one
    /// 0.5 KB get instead of a pass over 340k feature indices per iteration).
    pub dense_pull_below: usize,
    /// Under a synchronous scheme (BSP, LB-BSP) without copies of chunks, the iterations whose
    /// chunks touch pairwise disjoint keys ([`Model::disjoint`]: MF's strata) push their keys'
    /// new values as puts instead of their changes as accumulates; `false` always accumulates
    /// (the same model up to rounding: `w + (new - w)` against `new`).
    pub put_disjoint: bool,
    /// With `Some`, a thread beside each rank's loop ends the job when the rank makes no progress
    /// for [`Watchdog::after`] (see `watch`).
    pub watchdog: Option<Watchdog>,
    /// With `Some(dir)`, each rank writes its timeline to `dir/rank-<r>.jsonl`, one Chrome
    /// Trace Event per line (see `trace`).
    pub trace: Option<std::path::PathBuf>,
    /// Where ranks share nodes, a synchronous scheme's dense pulls and pushes go through one copy
    /// of the weights per node and the node's summed update (see `node`); `Off` keeps every
    /// rank's own.
    pub node_combine: NodeCombine,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            scheme: SchemeSpec::default(),
            batch: 1024,
            chunk: 64,
            grain: 1,
            iterations: 100,
            target_loss: None,
            early_stop: None,
            keep_best: false,
            eval_every: 0,
            steal_fraction: 0.5,
            seed: 1,
            threads: 1,
            elastic: Elastic::Fixed,
            inject: Injection::default(),
            keep_params: false,
            optimizer: Optimizer::Sgd,
            schedule: Schedule::default(),
            stop_on_stall: false,
            dense_pull_below: 1 << 16,
            put_disjoint: true,
            checkpoint_every: 0,
            checkpoint_budget: None,
            checkpoint_seconds: None,
            stop: None,
            resume: None,
            watchdog: None,
            trace: None,
            node_combine: NodeCombine::Auto,
        }
    }
}

impl Config {
    /// The first iteration to run: 0, or the resumed checkpoint's.
    pub fn start_iteration(&self) -> u64 {
        self.resume.as_ref().map_or(0, |s| s.iteration)
    }
}

/// Whether the ranks of a node combine their pulls and pushes (`--node-combine` of `train` and
/// `simulate`; see `node`): where ranks share nodes, a synchronous scheme's dense pulls and pushes
/// go through one copy of the weights per node and the node's summed update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeCombine {
    /// Wherever it applies: a synchronous scheme (every rank's update of an iteration in before
    /// anyone goes on: BSP and LB-BSP, with or without taking over), one model sharded over the
    /// ranks (not replicated), more than one node, some of more than one rank.
    #[default]
    Auto,
    /// Never: every rank pulls from and pushes to every shard itself.
    Off,
}

impl std::fmt::Display for NodeCombine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Off => "off",
        })
    }
}

impl std::str::FromStr for NodeCombine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "off" => Ok(Self::Off),
            _ => Err(format!("unknown node combine `{s}`: expected auto or off")),
        }
    }
}

/// Elastic parallelism set by the configuration: the active compute threads of a rank before each
/// iteration (the pool is built once with the most threads; the others stay parked). Policies may
/// change it further (Falcon's elastic parallelism).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Elastic {
    /// Always `Config::threads`.
    #[default]
    Fixed,
    /// `(rank, from iteration, threads)`: from that iteration on, that rank runs that many threads
    /// (the latest entry that applies wins; before any, `Config::threads`).
    Schedule(Vec<(usize, u64, usize)>),
}

impl Elastic {
    /// Active threads of `rank` in iteration `it`.
    pub fn threads(&self, rank: usize, it: u64, default: usize) -> usize {
        match self {
            Self::Fixed => default,
            Self::Schedule(s) => s
                .iter()
                .filter(|&&(r, from, _)| r == rank && from <= it)
                .max_by_key(|e| e.1)
                .map_or(default, |e| e.2),
        }
    }
}

/// Checks what [`train`] would refuse in `cfg` for a world of `world` ranks training on `rows`
/// rows, before anything is started or written: settings out of range, batches that cannot be
/// planned (or whose chunks would not fit one rank's queue), schemes that cannot run with this many ranks, straggler patterns naming ranks that do
/// not exist.
pub fn check(cfg: &Config, world: usize, rows: usize) -> Result<Plan, TrainError> {
    let setting = |setting, accepted: &str, got: String| TrainError::Setting {
        setting,
        accepted: accepted.into(),
        got,
    };
    if cfg.threads == 0 {
        return Err(setting("threads", "at least 1", cfg.threads.to_string()));
    }
    if cfg.grain == 0 {
        return Err(setting("grain", "at least 1", cfg.grain.to_string()));
    }
    if cfg.early_stop == Some(0) {
        return Err(setting("early stopping's count of evaluations", "at least 1", "0".into()));
    }
    if !(cfg.steal_fraction > 0.0 && cfg.steal_fraction <= 1.0) {
        return Err(setting("the steal fraction", "in (0, 1]", cfg.steal_fraction.to_string()));
    }
    let plan = Plan::new(rows, cfg.batch, world, cfg.chunk, cfg.seed)?;
    cfg.scheme.scheme.validate(world)?;
    if let Pattern::Persistent { ranks, .. } = &cfg.inject.pattern {
        if let Some(&rank) = ranks.iter().find(|&&r| r >= world) {
            return Err(TrainError::NoSuchRank { pattern: cfg.inject.pattern.to_string(), rank, world });
        }
    }
    Ok(plan)
}

/// Checks that `cfg`'s optimizer and schedule suit a model named `model` (a gradient model if
/// `gradient`).
pub fn check_optimizer(cfg: &Config, model: &str, gradient: bool) -> Result<(), TrainError> {
    let o = cfg.optimizer;
    if o != Optimizer::Sgd && !gradient {
        return Err(TrainError::Setting {
            setting: "the optimizer",
            accepted: format!("sgd for {model} (its update is SGD over each rating, not a gradient)"),
            got: o.to_string(),
        });
    }
    if o.derived() && !cfg.schedule.constant() {
        return Err(TrainError::Setting {
            setting: "the learning-rate schedule",
            accepted: format!("constant under {o} (its per-parameter rates decay by themselves)"),
            got: format!("warm-up {} iterations, decay {}", cfg.schedule.warmup, cfg.schedule.decay),
        });
    }
    Ok(())
}

/// Checks that `cfg` suits `model`: its optimizer and schedule ([`check_optimizer`]), and, for a
/// model whose rows carry state of their own ([`Model::needs_current_rows`]), a scheme whose
/// pulls follow every earlier update ([`crate::Scheme::pulls_every_update`]).
pub fn check_model<M: Model>(cfg: &Config, model: &M) -> Result<(), TrainError> {
    check_optimizer(cfg, model.name(), model.lr().is_some())?;
    check_scheme_for_rows(&cfg.scheme.scheme, model.name(), model.needs_current_rows())
}

/// Refuses `scheme` for a model named `model` whose rows carry state of their own
/// (`needs_current_rows`, [`Model::needs_current_rows`]) unless every pull under it follows every
/// earlier update.
pub fn check_scheme_for_rows(
    scheme: &Scheme,
    model: &str,
    needs_current_rows: bool,
) -> Result<(), TrainError> {
    if needs_current_rows && !scheme.pulls_every_update() {
        let fit: Vec<&str> =
            Scheme::names().filter(|n| n.parse::<Scheme>().is_ok_and(|s| s.pulls_every_update())).collect();
        return Err(TrainError::Setting {
            setting: "the scheme",
            accepted: format!(
                "one whose every pull follows every earlier update for {model} (its rows' own state, the topic \
                 of each token, is updated by deltas against what was read, and a stale read would corrupt \
                 it): {}",
                fit.join(", ")
            ),
            got: scheme.to_string(),
        });
    }
    Ok(())
}

/// Trains `model` on this rank (collective: every rank calls it with the same model and
/// configuration). `metrics`, if given, receives one JSON line per iteration; `progress` is called
/// on rank 0 after every iteration.
pub fn train<M: Model>(
    t: &Transport,
    model: &M,
    cfg: &Config,
    pool: &RankPool,
    metrics: Option<(&mut dyn Write, &str)>,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Report, TrainError> {
    train_checkpointed(t, model, cfg, pool, metrics, progress, &mut |_| Ok(()))
}

/// As [`train`], handing rank 0's [`Snapshot`] at every checkpoint to `checkpoint` (an error
/// from it stops the run on every rank with [`TrainError::Checkpoint`]).
pub fn train_checkpointed<M: Model>(
    t: &Transport,
    model: &M,
    cfg: &Config,
    pool: &RankPool,
    metrics: Option<(&mut dyn Write, &str)>,
    progress: &mut dyn FnMut(&Progress),
    checkpoint: &mut dyn FnMut(&Snapshot) -> Result<(), String>,
) -> Result<Report, TrainError> {
    let plan = check(cfg, t.world_size(), model.rows())?;
    check_model(cfg, model)?;
    if let Some(s) = &cfg.resume {
        let layout = model.layout();
        let slots = cfg.optimizer.slots();
        if s.params.len() != layout.params
            || s.state.len() != layout.params * slots
            || !(s.best.is_empty() || s.best.len() == layout.params)
            || s.iteration > cfg.iterations
        {
            return Err(TrainError::Checkpoint(format!(
                "the checkpoint holds {} parameters, {} state values, {} best weights and iteration {}; \
                 this run has {} parameters, {} state values per parameter and {} iterations",
                s.params.len(),
                s.state.len(),
                s.best.len(),
                s.iteration,
                layout.params,
                slots,
                cfg.iterations
            )));
        }
    }
    let watch = watch::Watch::new(cfg.start_iteration());
    std::thread::scope(|s| {
        // The watchdog watches until the run is over (its channel hung up).
        let (_over, over) = std::sync::mpsc::channel::<()>();
        if let Some(dog) = &cfg.watchdog {
            let (watch, rank, world) = (&watch, t.rank(), t.world_size());
            let stop = cfg.stop.as_deref();
            s.spawn(move || watch.guard(rank, world, dog, stop, &over));
        }
        let (run, mut policy) = run::Run::start(t, model, cfg, plan, pool, &watch)?;
        let result = run.train(&mut *policy, metrics, progress, checkpoint);
        // The windows are freed (collectively) whether training succeeded or not.
        run.free(policy)?;
        result
    })
}

#[cfg(test)]
mod tests {
    use super::Snapshot;

    fn with_scheme(scheme: Vec<f64>) -> Snapshot {
        Snapshot {
            iteration: 0,
            params: Vec::new(),
            state: Vec::new(),
            weights: Vec::new(),
            evals: Vec::new(),
            best: Vec::new(),
            train_seconds: 0.0,
            scheme,
        }
    }

    #[test]
    fn a_rank_reads_its_own_policy_state_and_absurd_figures_read_as_none() {
        // 2 ranks, stride 3: rank 0 has 2 values, rank 1 has 1.
        let s = with_scheme(vec![2.0, 3.0, 2.0, 0.5, 0.25, 1.0, 7.0, 0.0]);
        assert_eq!(s.scheme_state(0, 2), Some(&[0.5, 0.25][..]));
        assert_eq!(s.scheme_state(1, 2), Some(&[7.0][..]));
        assert_eq!(s.scheme_state(0, 3), None, "another world");
        // A stride whose product with the world overflows, a length past the end or at
        // usize::MAX (from a file): none, no overflow.
        for bad in [
            vec![2.0, 1e300, 0.0, 0.0],
            vec![2.0, f64::MAX, 0.0],
            vec![2.0, 3.0, 5.0, 0.5, 0.25, 1.0, 7.0, 0.0],
            vec![2.0, 3.0, 1e300, 0.5, 0.25, 1.0, 7.0, 0.0],
        ] {
            assert_eq!(with_scheme(bad.clone()).scheme_state(0, 2), None, "{bad:?}");
        }
    }
}
