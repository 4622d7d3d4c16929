//! What a run records: one line per iteration and rank ([`IterRecord`]), evaluations, per-rank
//! totals and the report every rank returns.

use std::io::Write;

use serde::Serialize;

use super::TrainError;

/// One iteration of one rank, as written to its metrics file.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IterRecord {
    /// The rank.
    pub rank: usize,
    /// The iteration.
    pub iter: u64,
    /// Training seconds (evaluations excluded) at the iteration's start.
    pub start: f64,
    /// Seconds computing (own chunks and chunks taken over).
    pub compute: f64,
    /// Seconds its threads spent in chunks (compute and injected delay), per active thread.
    pub busy: f64,
    /// Seconds pulling and pushing parameters.
    pub comm: f64,
    /// Seconds waiting for other ranks.
    pub wait: f64,
    /// Own chunks computed.
    pub own: u64,
    /// Chunks taken over from other ranks and computed.
    pub taken: u64,
    /// Active compute threads.
    pub threads: usize,
    /// Rows computed.
    pub rows: u64,
    /// Mean loss of the rows computed (before their update).
    pub loss: f64,
    /// Injected delay factor: after each chunk the rank slept this many times its compute time.
    pub delay: f64,
    /// Whether an injected disruptor was burning the rank's cores at the iteration's end.
    pub disrupted: bool,
    /// DynSGD: model versions (N updates each) pushed between this rank's pull and push (its
    /// update was scaled by `1 / (1 + staleness)`).
    pub staleness: u64,
    /// Backup workers: `b` of this iteration.
    pub backups: usize,
    /// Backup workers: this rank's update came too late and was dropped.
    pub dropped: bool,
    /// LB-BSP: this rank's predicted speed (rows per second) for its next iteration.
    pub predicted: f64,
    /// LB-BSP: this rank's measured speed in this iteration (rows per second of its threads'
    /// chunk time, times its threads; 0 when it had no rows).
    pub speed: f64,
    /// FlexRR: chunks taken over by rapid reassignment, before this rank's own were done.
    pub reassigned: u64,
    /// Speculative execution: chunks of late ranks this rank computed a copy of and applied
    /// (its copy finished first).
    pub cloned: u64,
    /// Speculative execution: copies this rank computed (own chunks or clones) that finished
    /// second and were dropped.
    pub discarded: u64,
    /// Own chunks this rank was given for the iteration (its split; LB-BSP sizes it).
    pub chunks: u64,
    /// The rank this rank waited for last in the iteration (the slowest it saw), if it waited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_for: Option<usize>,
    /// Chunks taken over from each rank: `[victim, chunks]` pairs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taken_from: Vec<(usize, u64)>,
}

/// One evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct EvalPoint {
    /// Iterations done.
    pub iter: u64,
    /// Training seconds (evaluations excluded).
    pub time: f64,
    /// Mean evaluation loss.
    pub loss: f64,
    /// Accuracy or RMSE.
    pub metric: f64,
    /// Mean training loss of the rows computed since the previous evaluation (every rank's),
    /// before their updates; `None` if none were.
    pub train_loss: Option<f64>,
    /// Replicated schemes (DBW), whose evaluated model is the replicas' average: their
    /// root-mean-square distance from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consensus: Option<f64>,
}

/// Totals of one rank.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct RankTotals {
    /// Seconds computing.
    pub compute: f64,
    /// Seconds pulling and pushing.
    pub comm: f64,
    /// Seconds waiting.
    pub wait: f64,
    /// Seconds its threads spent in chunks, per active thread (the compute rate's time).
    pub busy: f64,
    /// Own chunks computed.
    pub own: u64,
    /// Chunks taken over and computed.
    pub taken: u64,
    /// Rows computed (and applied).
    pub rows: u64,
    /// Speculative execution: copies of late ranks' chunks computed and applied.
    pub cloned: u64,
    /// Speculative execution: copies computed and dropped (they finished second).
    pub discarded: u64,
    /// LB-BSP: the sum over iterations of `|predicted - measured| / measured` speed, and the
    /// number of iterations summed.
    pub prediction_error: f64,
    /// LB-BSP: see `prediction_error`.
    pub predictions: u64,
    /// Own chunks it was given (its splits summed).
    pub assigned: u64,
    /// Seconds other ranks waited for it (each wait counted for the rank last waited for).
    pub waited_for_me: f64,
    /// The 90th percentile of its iteration rates (rows per second of compute).
    pub best_rate: f64,
    /// The median of its iteration rates.
    pub median_rate: f64,
    /// Share of its iterations under the straggler threshold of its own best rate (see
    /// `crate::straggler`).
    pub slow_share: f64,
    /// Runs of those slow iterations.
    pub episodes: u64,
    /// Whether the runs start at whole multiples of one period.
    pub periodic: bool,
}

/// Numbers in [`RankTotals`], as summed over ranks.
pub(super) const TOTALS: usize = 18;

impl RankTotals {
    pub(super) fn to_array(self) -> [f64; TOTALS] {
        [
            self.compute,
            self.comm,
            self.wait,
            self.own as f64,
            self.taken as f64,
            self.rows as f64,
            self.cloned as f64,
            self.discarded as f64,
            self.prediction_error,
            self.predictions as f64,
            self.assigned as f64,
            self.waited_for_me,
            self.best_rate,
            self.median_rate,
            self.slow_share,
            self.episodes as f64,
            f64::from(u8::from(self.periodic)),
            self.busy,
        ]
    }

    pub(super) fn from_array(a: &[f64]) -> Self {
        Self {
            compute: a[0],
            comm: a[1],
            wait: a[2],
            own: a[3] as u64,
            taken: a[4] as u64,
            rows: a[5] as u64,
            cloned: a[6] as u64,
            discarded: a[7] as u64,
            prediction_error: a[8],
            predictions: a[9] as u64,
            assigned: a[10] as u64,
            waited_for_me: a[11],
            best_rate: a[12],
            median_rate: a[13],
            slow_share: a[14],
            episodes: a[15] as u64,
            periodic: a[16] != 0.0,
            busy: a[17],
        }
    }
}

/// What a run reports (the same on every rank).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Model name.
    pub model: String,
    /// Scheme.
    pub scheme: String,
    /// Ranks.
    pub ranks: usize,
    /// Iterations run.
    pub iterations: u64,
    /// Training rows computed, by all ranks.
    pub samples: u64,
    /// Training seconds, evaluations excluded (the slowest rank's).
    pub train_seconds: f64,
    /// Seconds spent evaluating.
    pub eval_seconds: f64,
    /// The evaluations, in order.
    pub evals: Vec<EvalPoint>,
    /// Name of the evaluation metric.
    pub metric: String,
    /// The target loss, if any.
    pub target_loss: Option<f64>,
    /// Training seconds until the evaluation loss first reached the target.
    pub time_to_target: Option<f64>,
    /// Early stopping's count of evaluations without improvement, if on
    /// ([`Config::early_stop`](super::Config::early_stop)).
    pub early_stop: Option<u64>,
    /// The iteration of the evaluation after which early stopping stopped the run, if it did.
    pub stopped_early: Option<u64>,
    /// With [`Config::keep_best`](super::Config::keep_best): the evaluation with the lowest loss
    /// (the first such), whose model is `best_params`.
    pub best: Option<EvalPoint>,
    /// Per-rank totals.
    pub per_rank: Vec<RankTotals>,
    /// What the evaluations showed going wrong without stopping the run (a stall, a rising
    /// loss), each with advice.
    pub warnings: Vec<String>,
    /// Checkpoints taken.
    pub checkpoints: u64,
    /// Seconds rank 0 spent on them, counted in the training time.
    pub checkpoint_seconds: f64,
    /// Which ranks were slow, by how much, and the run's pattern.
    pub stragglers: crate::straggler::StragglerReport,
    /// The final parameters, if asked for ([`Config::keep_params`]).
    #[serde(skip)]
    pub params: Option<Vec<f32>>,
    /// Rank 0, with [`Config::keep_best`](super::Config::keep_best): the weights of the `best`
    /// evaluation's model.
    #[serde(skip)]
    pub best_params: Option<Vec<f32>>,
}

impl Report {
    /// The last evaluation.
    pub fn last_eval(&self) -> Option<EvalPoint> {
        self.evals.last().copied()
    }

    /// Training rows per second.
    pub fn samples_per_second(&self) -> f64 {
        self.samples as f64 / self.train_seconds.max(1e-12)
    }
}

/// What rank 0 is told after each iteration (for a progress display).
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Iterations done.
    pub iter: u64,
    /// Iterations planned.
    pub iterations: u64,
    /// Training rows processed.
    pub samples: u64,
    /// Training seconds.
    pub seconds: f64,
    /// Mean loss of this rank's last batch.
    pub batch_loss: f64,
    /// The last evaluation.
    pub eval: Option<EvalPoint>,
}

impl IterRecord {
    /// Adds this iteration to `totals`.
    pub(crate) fn add_to(&self, totals: &mut RankTotals) {
        totals.compute += self.compute;
        totals.comm += self.comm;
        totals.wait += self.wait;
        totals.own += self.own;
        totals.taken += self.taken;
        totals.rows += self.rows;
        totals.cloned += self.cloned;
        totals.discarded += self.discarded;
        totals.assigned += self.chunks;
        totals.busy += self.busy;
    }

    /// Writes the record as one JSON line to `out` (`path` names it in errors).
    pub(super) fn write(&self, out: &mut dyn Write, path: &str) -> Result<(), TrainError> {
        serde_json::to_writer(&mut *out, self)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .map_err(|source| TrainError::Metrics { path: path.to_string(), source })
    }
}
