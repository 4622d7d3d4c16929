//! Evaluations' record: the points, the model's health (divergence, stalls), early stopping
//! and the best point; the run joins evaluations in [`super::evaluating`].

use std::time::{Duration, Instant};

use super::{EvalPoint, TrainError};
use crate::model::{Baseline, Metric};

/// An evaluation loss above this many times a blind model's is divergence (an error).
pub const DIVERGED_ABOVE: f64 = 10.0;
/// Consecutive evaluations that make a stall or a rising loss.
pub const STALL_EVALS: usize = 3;
/// A rising loss is reported once it is this much above the best so far.
pub const RISEN_BY: f64 = 0.1;

/// How many evaluations came after the best of `points` (the first with the lowest loss; a later
/// one improves on it only by a strictly lower loss): 0 when the last is the best, `None` when
/// there are none. Early stopping ([`Config::early_stop`](super::Config::early_stop)) stops once
/// this reaches its count; the figure is a function of the evaluations alone, which every rank
/// holds alike and a checkpoint records, so that every rank, and a resumed run, decides alike.
pub fn evals_since_best(points: &[EvalPoint]) -> Option<usize> {
    let best = best_eval(points)?;
    Some(points.len() - 1 - best)
}

/// The index of the first evaluation with the lowest loss in `points`, if any.
fn best_eval(points: &[EvalPoint]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, p) in points.iter().enumerate() {
        if best.is_none_or(|b| p.loss < points[b].loss) {
            best = Some(i);
        }
    }
    best
}

/// The evaluation of the best model in `points` (see [`evals_since_best`]).
pub fn best_point(points: &[EvalPoint]) -> Option<EvalPoint> {
    best_eval(points).map(|i| points[i])
}

/// What the evaluations say about learning: the yardsticks, and what was reported.
pub(super) struct Health {
    baseline: Baseline,
    metric: Metric,
    pub warnings: Vec<String>,
    stalled: bool,
    rising: bool,
}

impl Health {
    pub(super) fn new(baseline: Baseline, metric: Metric) -> Self {
        Self { baseline, metric, warnings: Vec::new(), stalled: false, rising: false }
    }

    /// Judges the evaluations so far (the last one just added): an error if it diverged, else
    /// warnings (each reported once) for a stall at the constant prediction's metric (neither it
    /// nor the loss improving) and for a
    /// loss rising at each of the last [`STALL_EVALS`] evaluations; as errors if `stop`.
    pub(super) fn check(&mut self, points: &[EvalPoint], stop: bool) -> Result<(), TrainError> {
        let Some(last) = points.last() else { return Ok(()) };
        let blind = self.baseline.blind_loss;
        if !last.loss.is_finite() || last.loss > DIVERGED_ABOVE * blind {
            return Err(TrainError::Diverged { iter: last.iter, loss: last.loss, blind });
        }
        let Some(recent) = points.len().checked_sub(STALL_EVALS).map(|i| &points[i..]) else { return Ok(()) };
        let (first, n) = (recent[0].iter, STALL_EVALS);
        let constant = self.baseline.constant_metric;
        let no_better = |m: f64| match self.metric {
            Metric::Accuracy => m <= constant + 0.002,
            Metric::Rmse => m >= constant - 0.002,
            Metric::Perplexity => m >= 0.999 * constant,
        };
        // Still improving (however slowly from a poor start) is not a stall.
        let improving = match self.metric {
            Metric::Accuracy => last.metric > recent[0].metric + 0.002,
            Metric::Rmse => last.metric < recent[0].metric - 0.002,
            Metric::Perplexity => last.metric < 0.999 * recent[0].metric,
        };
        // A falling loss is learning too (the metric of imbalanced classes can stay at the
        // majority's while probabilities improve).
        let loss_falling = last.loss < 0.99 * recent[0].loss;
        if !self.stalled && !improving && !loss_falling && recent.iter().all(|p| no_better(p.metric)) {
            self.stalled = true;
            let (name, what) = match self.metric {
                Metric::Accuracy => ("accuracy", "always predicting the most frequent class"),
                Metric::Rmse => ("RMSE", "always predicting the mean rating"),
                Metric::Perplexity => ("perplexity", "every word and topic equally likely"),
            };
            self.report(
                format!(
                    "the {name} ({:.4}) is no better than {what} ({constant:.4}) at the last {n} evaluations \
                     (iterations {first} to {}): the model is not learning; a learning rate too high \
                     (or too low) does this, try one ten times lower (and higher)",
                    last.metric, last.iter
                ),
                stop,
            )?;
        }
        let best = points.iter().min_by(|a, b| a.loss.total_cmp(&b.loss)).expect("points");
        let rose = recent.windows(2).all(|w| w[1].loss > w[0].loss)
            && points.len() > STALL_EVALS
            && points[points.len() - STALL_EVALS - 1].loss < recent[0].loss;
        if !self.rising && rose && last.loss > (1.0 + RISEN_BY) * best.loss {
            self.rising = true;
            self.report(
                format!(
                    "the evaluation loss rose at each of the last {n} evaluations, to {:.4} at iteration {} \
                     (best {:.4} at iteration {}): lower the learning rate or add --lr-decay",
                    last.loss, last.iter, best.loss, best.iter
                ),
                stop,
            )?;
        }
        Ok(())
    }

    fn report(&mut self, warning: String, stop: bool) -> Result<(), TrainError> {
        if stop {
            return Err(TrainError::Stalled(warning));
        }
        self.warnings.push(warning);
        Ok(())
    }
}

/// Where this rank's evaluations stand.
pub(super) struct Evals {
    pub points: Vec<EvalPoint>,
    /// Time spent evaluating (and waiting for others to join an evaluation).
    pub time: Duration,
    pub to_target: Option<f64>,
    /// The iteration of the evaluation after which early stopping stopped the run.
    pub stopped_early: Option<u64>,
    /// Rank 0, with [`Config::keep_best`](super::Config::keep_best): the weights of the best
    /// evaluation so far ([`best_point`]); empty when none is kept.
    pub best: Vec<f32>,
    /// Evaluations this rank has joined.
    pub joined: u64,
    /// The full model, pulled for each evaluation (the replicas' average, when replicated).
    pub params: Vec<f32>,
    /// This rank's replica, when replicated.
    pub own: Vec<f32>,
    /// This rank's iterations done.
    pub iters: u64,
    /// This rank's training loss (summed over rows) and rows since the last evaluation.
    pub train_loss: f64,
    pub train_rows: f64,
    pub health: Health,
    start: Instant,
    /// Training seconds of the run this one resumed.
    before: f64,
}

impl Evals {
    /// No evaluation yet, training time counted from now; `params` parameters to pull; learning
    /// judged against `baseline`.
    pub(super) fn new(params: usize, baseline: Baseline, metric: Metric) -> Self {
        Self {
            points: Vec::new(),
            time: Duration::ZERO,
            to_target: None,
            stopped_early: None,
            best: Vec::new(),
            joined: 0,
            params: vec![0.0; params],
            own: Vec::new(),
            iters: 0,
            train_loss: 0.0,
            train_rows: 0.0,
            health: Health::new(baseline, metric),
            start: Instant::now(),
            before: 0.0,
        }
    }

    /// Goes on from checkpoint `s`: its evaluations, iterations and training time, the best
    /// model's weights (rank 0: `keep_best`) and, with `early_stop`, whether its evaluations
    /// already stop the run.
    pub(super) fn resume(&mut self, s: &super::Snapshot, keep_best: bool, early_stop: Option<u64>) {
        self.points = s.evals.clone();
        self.joined = 0;
        self.iters = s.iteration;
        self.before = s.train_seconds;
        if keep_best {
            self.best.clone_from(&s.best);
        }
        self.judge_early_stop(early_stop);
    }

    /// Whether an evaluation has stopped the run (a target reached, or early stopping).
    pub(super) fn stopping(&self) -> bool {
        self.to_target.is_some() || self.stopped_early.is_some()
    }

    /// With `early_stop` of `n`: stops the run once the loss has not improved for `n`
    /// evaluations ([`evals_since_best`]).
    pub(super) fn judge_early_stop(&mut self, early_stop: Option<u64>) {
        let since = evals_since_best(&self.points).unwrap_or(0) as u64;
        if self.stopped_early.is_none() && early_stop.is_some_and(|n| since >= n) {
            self.stopped_early = self.points.last().map(|p| p.iter);
        }
    }

    /// Training seconds so far (evaluations excluded).
    pub(super) fn train_time(&self) -> f64 {
        self.before + (self.start.elapsed().saturating_sub(self.time)).as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(losses_metrics: &[(f64, f64)]) -> Vec<EvalPoint> {
        losses_metrics
            .iter()
            .enumerate()
            .map(|(i, &(loss, metric))| EvalPoint {
                iter: 10 * (i as u64 + 1),
                time: i as f64,
                loss,
                metric,
                train_loss: None,
                consensus: None,
            })
            .collect()
    }

    /// Checks every prefix in turn, as the evaluations arrive.
    fn judge(h: &mut Health, p: &[EvalPoint], stop: bool) -> Result<(), TrainError> {
        (1..=p.len()).try_for_each(|n| h.check(&p[..n], stop))
    }

    const TEN_CLASSES: Baseline = Baseline { blind_loss: std::f64::consts::LN_10, constant_metric: 0.1 };

    #[test]
    fn a_learning_model_is_left_alone() {
        let mut h = Health::new(TEN_CLASSES, Metric::Accuracy);
        let p = points(&[(2.2, 0.3), (1.5, 0.5), (1.1, 0.6), (0.9, 0.7), (0.95, 0.7), (0.93, 0.71)]);
        judge(&mut h, &p, true).expect("healthy");
        assert!(h.warnings.is_empty(), "{:?}", h.warnings);
    }

    #[test]
    fn a_loss_not_a_number_or_ten_times_blind_diverged() {
        for bad in [f64::NAN, f64::INFINITY, 23.1, 6e28] {
            let mut h = Health::new(TEN_CLASSES, Metric::Accuracy);
            let e = judge(&mut h, &points(&[(2.0, 0.3), (bad, 0.1)]), false).expect_err("diverged");
            assert!(matches!(e, TrainError::Diverged { iter: 20, .. }), "{bad}: {e}");
            assert!(e.to_string().contains("predicts nothing scores 2.3026"), "{e}");
        }
        // Just under ten times: not (yet) divergence.
        let mut h = Health::new(TEN_CLASSES, Metric::Accuracy);
        judge(&mut h, &points(&[(2.0, 0.3), (23.0, 0.3)]), false).expect("below the limit");
    }

    #[test]
    fn three_evaluations_at_the_constant_prediction_are_a_stall() {
        // Accuracy at the majority class's share (0.1) three times: one warning, however long
        // it lasts; two times is not enough.
        let mut h = Health::new(TEN_CLASSES, Metric::Accuracy);
        judge(&mut h, &points(&[(2.3, 0.1), (2.3, 0.101)]), false).expect("warn");
        assert!(h.warnings.is_empty());
        let p = points(&[(2.3, 0.1), (2.3, 0.101), (2.3, 0.1), (2.3, 0.1), (2.3, 0.1)]);
        let mut h = Health::new(TEN_CLASSES, Metric::Accuracy);
        judge(&mut h, &p, false).expect("warn");
        assert_eq!(h.warnings.len(), 1, "{:?}", h.warnings);
        assert!(
            h.warnings[0].contains("most frequent class") && h.warnings[0].contains("iterations 10 to 30")
        );
        let mut h = Health::new(TEN_CLASSES, Metric::Accuracy);
        let e = judge(&mut h, &p, true).expect_err("stop");
        assert!(matches!(e, TrainError::Stalled(_)), "{e}");
        // RMSE: no better means no lower than the ratings' standard deviation.
        let ratings = Baseline { blind_loss: 13.5, constant_metric: 1.12 };
        let mut h = Health::new(ratings, Metric::Rmse);
        judge(&mut h, &points(&[(1.3, 1.14), (1.29, 1.135), (1.297, 1.139)]), false).expect("warn");
        assert_eq!(h.warnings.len(), 1);
        assert!(h.warnings[0].contains("mean rating"));
        // At the majority's accuracy but with a falling loss (rare positives, probabilities
        // still improving): learning.
        let mut h = Health::new(TEN_CLASSES, Metric::Accuracy);
        judge(&mut h, &points(&[(2.3, 0.1), (2.2, 0.1), (2.1, 0.1)]), false).expect("learning");
        assert!(h.warnings.is_empty(), "{:?}", h.warnings);
        // Above the constant prediction but coming down (MF from its near-zero start): learning.
        let mut h = Health::new(ratings, Metric::Rmse);
        judge(&mut h, &points(&[(9.0, 3.0), (4.0, 2.0), (2.3, 1.5)]), false).expect("learning");
        assert!(h.warnings.is_empty(), "{:?}", h.warnings);
        let mut h = Health::new(ratings, Metric::Rmse);
        judge(&mut h, &points(&[(1.0, 1.0), (0.9, 0.95), (0.85, 0.92)]), false).expect("learning");
        assert!(h.warnings.is_empty());
    }

    #[test]
    fn evaluations_since_the_best_count_from_the_first_lowest_loss() {
        let since =
            |losses: &[f64]| evals_since_best(&points(&losses.iter().map(|&l| (l, 0.5)).collect::<Vec<_>>()));
        assert_eq!(since(&[]), None);
        assert_eq!(since(&[0.9]), Some(0));
        assert_eq!(since(&[0.9, 0.8, 0.7]), Some(0));
        assert_eq!(since(&[0.9, 0.7, 0.8, 0.75]), Some(2));
        // A tie is no improvement: the first of equal losses stays the best.
        assert_eq!(since(&[0.9, 0.7, 0.7, 0.7]), Some(2));
        assert_eq!(best_point(&points(&[(0.9, 0.5), (0.7, 0.6), (0.7, 0.7)])).map(|p| p.iter), Some(20));
        // A new best resets the count.
        assert_eq!(since(&[0.9, 0.7, 0.8, 0.8, 0.6, 0.65]), Some(1));
    }

    /// Evaluations judged for early stopping as they arrive: the iteration it stopped after.
    fn early_stop(losses: &[f64], n: u64) -> Option<u64> {
        let mut ev = Evals::new(0, TEN_CLASSES, Metric::Accuracy);
        for p in points(&losses.iter().map(|&l| (l, 0.5)).collect::<Vec<_>>()) {
            ev.points.push(p);
            ev.judge_early_stop(Some(n));
            if ev.stopping() {
                break;
            }
        }
        ev.stopped_early
    }

    #[test]
    fn early_stopping_stops_at_the_nth_evaluation_without_improvement_and_not_before() {
        // Best at iteration 20, then three without improvement: stopped after the third (50).
        assert_eq!(early_stop(&[1.0, 0.8, 0.85, 0.81, 0.9, 0.7], 3), Some(50));
        // Two without improvement, then a new best: not stopped.
        assert_eq!(early_stop(&[1.0, 0.8, 0.85, 0.81, 0.7, 0.75], 3), None);
        // One: the first evaluation that is no better.
        assert_eq!(early_stop(&[1.0, 0.8, 0.8], 1), Some(30));
        // Off: never.
        let mut ev = Evals::new(0, TEN_CLASSES, Metric::Accuracy);
        ev.points = points(&[(1.0, 0.5), (1.1, 0.5), (1.2, 0.5), (1.3, 0.5)]);
        ev.judge_early_stop(None);
        assert!(!ev.stopping());
    }

    #[test]
    fn a_resumed_run_goes_on_with_the_count_and_best_model_of_its_checkpoint() {
        let s = crate::engine::Snapshot {
            iteration: 40,
            evals: points(&[(1.0, 0.5), (0.8, 0.5), (0.85, 0.5), (0.9, 0.5)]),
            best: vec![0.5, 0.25],
            ..Default::default()
        };
        // Two evaluations without improvement: a third stops the run, a better one does not.
        let mut ev = Evals::new(2, TEN_CLASSES, Metric::Accuracy);
        ev.resume(&s, true, Some(3));
        assert!(!ev.stopping());
        assert_eq!(ev.best, [0.5, 0.25]);
        ev.points.push(EvalPoint { iter: 50, loss: 0.95, ..s.evals[0] });
        ev.judge_early_stop(Some(3));
        assert_eq!(ev.stopped_early, Some(50));
        // Already at the count (a checkpoint taken after the stopping evaluation): stopping.
        let mut ev = Evals::new(2, TEN_CLASSES, Metric::Accuracy);
        ev.resume(&s, false, Some(2));
        assert_eq!(ev.stopped_early, Some(40));
        assert!(ev.best.is_empty(), "kept on rank 0 only");
    }

    #[test]
    fn a_loss_rising_three_times_past_the_best_is_reported() {
        let mut h = Health::new(TEN_CLASSES, Metric::Accuracy);
        // Best 0.8, then up three times, ending 25 % above it.
        let p = points(&[(1.5, 0.5), (0.8, 0.7), (0.85, 0.7), (0.9, 0.69), (1.0, 0.66)]);
        judge(&mut h, &p, false).expect("warn");
        assert_eq!(h.warnings.len(), 1, "{:?}", h.warnings);
        assert!(h.warnings[0].contains("best 0.8000 at iteration 20"), "{}", h.warnings[0]);
        // Rising but within 10 % of the best: noise, not reported.
        let mut h = Health::new(TEN_CLASSES, Metric::Accuracy);
        judge(&mut h, &points(&[(0.8, 0.7), (0.81, 0.7), (0.82, 0.7), (0.83, 0.7)]), false).expect("noise");
        assert!(h.warnings.is_empty(), "{:?}", h.warnings);
        let mut h = Health::new(TEN_CLASSES, Metric::Accuracy);
        assert!(matches!(judge(&mut h, &p, true), Err(TrainError::Stalled(_))));
    }
}
