//! What a run records: one line per iteration and rank ([`IterRecord`]), evaluations, per-rank
//! totals and the report every rank returns.

use std::io::Write;

use serde::Serialize;

use super::TrainError;
use crate::record::{IterRecord, RankTotals};

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
    /// Where the ranks of each node combined their pulls and pushes
    /// ([`Config::node_combine`](super::Config::node_combine)): the ranks on each node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_combined: Option<Vec<usize>>,
    /// The final parameters, if asked for ([`super::Config::keep_params`]).
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
    /// Writes the record as one JSON line to `out` (`path` names it in errors).
    pub(super) fn write(&self, out: &mut dyn Write, path: &str) -> Result<(), TrainError> {
        serde_json::to_writer(&mut *out, self)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .map_err(|source| TrainError::Metrics { path: path.to_string(), source })
    }
}
