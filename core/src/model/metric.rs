//! What an evaluation reports: the [`Metric`], the sums ranks add up ([`EvalSums`]) and the
//! [`Baseline`] a model that learned nothing scores.

/// What an evaluation reports besides the loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Fraction of rows classified right.
    Accuracy,
    /// Root mean squared error of predicted ratings.
    Rmse,
    /// `exp` of the negative log-likelihood per token (topic models; lower is better).
    Perplexity,
}

impl Metric {
    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Accuracy => "accuracy",
            Self::Rmse => "rmse",
            Self::Perplexity => "perplexity",
        }
    }
}

/// Sums over evaluated rows, to be added up over ranks: `[loss, metric sum, rows]` (the metric sum
/// is the count of right answers for accuracy, the squared error for RMSE).
pub type EvalSums = [f64; 3];

/// The value of `metric` for sums `s`.
pub fn metric_value(metric: Metric, s: EvalSums) -> f64 {
    match metric {
        Metric::Accuracy => s[1] / s[2].max(1.0),
        Metric::Rmse => (s[1] / s[2].max(1.0)).sqrt(),
        Metric::Perplexity => (s[1] / s[2].max(1.0)).exp(),
    }
}

/// What a model that learned nothing scores on the evaluation set: the yardsticks divergence and
/// stalls are judged by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Baseline {
    /// The mean loss of a model that predicts nothing: probability 1/2 (LR), a uniform
    /// distribution over the classes (softmax, MLP), rating 0 (MF).
    pub blind_loss: f64,
    /// The metric of the best constant prediction: the most frequent class's share (accuracy),
    /// the ratings' standard deviation (RMSE of the mean rating).
    pub constant_metric: f64,
}

impl Baseline {
    /// The most frequent class's share among `labels` (0 for none).
    pub fn majority(labels: impl Iterator<Item = usize>, classes: usize) -> f64 {
        let mut counts = vec![0u64; classes.max(1)];
        let mut n = 0u64;
        for y in labels {
            counts[y.min(classes.max(1) - 1)] += 1;
            n += 1;
        }
        counts.into_iter().max().unwrap_or(0) as f64 / n.max(1) as f64
    }
}
