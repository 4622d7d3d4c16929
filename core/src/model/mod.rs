//! Models over a flat parameter vector that lives, sharded, in one window.
//!
//! A model says how its parameters are laid out ([`Layout`]: keys of `width` parameters, the unit
//! in which sparse models read and write), which keys a set of rows reads ([`Model::keys`]), and
//! how to compute a set of rows against a parameter snapshot into a per-thread [`Model::Work`],
//! which it then drains as an update `delta` (`w <- w + delta`) for the engine to `accumulate`
//! into the owning shards. Gradient models drain `-lr / batch * gradient`; matrix factorization
//! runs SGD over its rows on a private copy of their factors and drains the difference.
//!
//! One window for all of a model's blocks (rather than one per block): a block boundary is just
//! an offset, a dense pull or push is one call, and sparse pulls coalesce neighbouring keys across
//! blocks the same way.
//!
//! Beside the [`Model`] trait and its [`Layout`], in their own files: key sets ([`KeySet`],
//! `keys.rs`), updates ([`Delta`], [`Copies`], `delta.rs`), evaluation metrics ([`Metric`],
//! [`EvalSums`], [`Baseline`], `metric.rs`), exported blocks ([`Block`], [`Export`], `block.rs`)
//! and opening the data ([`ModelError`], `data.rs`).

use std::ops::Range;

pub use crate::team::PassRows;

mod block;
mod data;
mod delta;
mod keys;
mod metric;

pub use block::{Block, Export, Held};
pub use data::{copy_training_sets_up_to, Built, ModelError, MIN_COPY};
pub(crate) use data::{dense_shape, same_cols, Sets};
pub use delta::{Copies, Delta};
pub use keys::KeySet;
pub use metric::{metric_value, Baseline, EvalSums, Metric};

pub mod lda;
pub mod lr;
pub mod mf;
pub mod mlp;
pub mod softmax;
pub mod synthetic;

/// A flat parameter vector cut into keys of `width` parameters (the last may be shorter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Parameters.
    pub params: usize,
    /// Parameters per key.
    pub width: usize,
}

impl Layout {
    /// One key holding everything: a dense model.
    pub fn dense(params: usize) -> Self {
        Self { params, width: params.max(1) }
    }

    /// Keys.
    pub fn keys(&self) -> usize {
        self.params.div_ceil(self.width)
    }

    /// The parameters of key `key`.
    #[inline]
    pub fn range(&self, key: u32) -> Range<usize> {
        let s = key as usize * self.width;
        s..(s + self.width).min(self.params)
    }
}

/// A model: parameters, data, and how rows turn into updates.
pub trait Model: Send + Sync {
    /// Per-thread buffers: what a chunk's computation accumulates into.
    type Work: Send;

    /// Name in reports.
    fn name(&self) -> &'static str;

    /// The parameter layout.
    fn layout(&self) -> Layout;

    /// Training rows.
    fn rows(&self) -> usize;

    /// Evaluation rows.
    fn eval_rows(&self) -> usize;

    /// What [`evaluate`](Self::evaluate) reports besides the loss.
    fn metric(&self) -> Metric;

    /// Initial values of parameters `range` (a function of the seed and the index only, so every
    /// world size starts from the same model).
    fn init(&self, seed: u64, range: Range<usize>, out: &mut [f32]);

    /// Whether the model reads only the keys its rows touch ([`keys`](Self::keys)); dense models
    /// read every parameter.
    fn sparse(&self) -> bool;

    /// Adds the keys training rows `rows` read to `set` (sparse models).
    fn keys(&self, rows: Range<usize>, set: &mut KeySet);

    /// Buffers for one thread computing chunks of `chunk` rows (a model that
    /// [`joins_chunks`](Self::joins_chunks) grows them in [`compute`](Self::compute) for more).
    fn work(&self, chunk: usize) -> Self::Work;

    /// Computes training rows `rows` against `params` (valid at least at the rows' keys), adding
    /// into `work`; returns the rows' summed loss before the update.
    fn compute(&self, rows: Range<usize>, params: &[f32], work: &mut Self::Work) -> f64;

    /// As [`compute`](Self::compute), for rows of pass `epoch` over the training data (0 the
    /// first): a model whose schedule changes with the pass overrides it (MF's adaptive rates
    /// step only the first factors in the first pass, as libmf does). The engine calls this.
    fn compute_in(&self, epoch: u64, rows: Range<usize>, params: &[f32], work: &mut Self::Work) -> f64 {
        let _ = epoch;
        self.compute(rows, params, work)
    }

    /// Training rows `rows` of pass `epoch` are probably the next this thread computes with
    /// `work` (the rank's next chunk): a model may ask for them in cache while it computes the
    /// current ones, so that its next compute does not begin by waiting on memory. A hint,
    /// given right before a [`compute_in`](Self::compute_in) (a team member's is
    /// [`Part::ahead`](crate::team::Part::ahead)); the default ignores it.
    fn ahead(&self, epoch: u64, rows: Range<usize>, work: &mut Self::Work) {
        let _ = (epoch, rows, work);
    }

    /// The parameters member `part` of a team of `parts` threads computes and steps when the
    /// rank's threads split the model's units (`--split units`, [`crate::team`]): ranges that
    /// cover every parameter once over the team. `None` (the default): the model does not split.
    fn units(&self, part: usize, parts: usize) -> Option<Vec<Range<usize>>> {
        let _ = (part, parts);
        None
    }

    /// The leader's gradient for a run of rows computed by a team: `work`'s buffer, which every
    /// member writes in its [`units`](Self::units) (its old values overwritten where `work`
    /// says so). Only for a model that splits its units.
    fn team_target(&self, work: &mut Self::Work) -> crate::team::SharedGrad {
        let _ = work;
        panic!("{} does not split its units", self.name())
    }

    /// Member `part`'s share of rows `rows` of pass `epoch` computed by a team (every member
    /// calls it, in its own thread, with its own `work` for scratch): writes the gradient of its
    /// [`units`](Self::units) into `part.target`; returns the rows' summed loss (every member
    /// computes it; the leader's counts). Only for a model that splits its units.
    fn compute_part(
        &self,
        epoch: u64,
        rows: Range<usize>,
        params: &[f32],
        work: &mut Self::Work,
        part: &crate::team::Part<'_>,
    ) -> f64 {
        let _ = (epoch, rows, params, work, part);
        panic!("{} does not split its units", self.name())
    }

    /// Whether the chunks of `chunk` rows that training rows `batch` (one iteration's batch)
    /// are cut into touch pairwise disjoint keys. Then, under a scheme whose ranks all start an
    /// iteration from one snapshot and apply every update whole (BSP), a key's value after the
    /// iteration is what the one chunk that touched it left: the engine has those chunks
    /// compute their keys' new values ([`compute_values`](Self::compute_values)) and pushes
    /// them as puts, instead of their changes as accumulates (no subtraction in the chunk, no
    /// read and sum at the target). No by default; MF's strata say yes for their batches of
    /// block pieces.
    fn disjoint(&self, batch: Range<usize>, chunk: usize) -> bool {
        let _ = (batch, chunk);
        false
    }

    /// As [`compute_in`](Self::compute_in), leaving in `work` the new values of the keys the
    /// rows touch instead of what the rows changed ([`drain`](Self::drain) with scale 1 then
    /// writes those values into an update that is zero there). The engine calls it only for the
    /// chunks of batches the model calls [`disjoint`](Self::disjoint); a model that can say so
    /// implements it.
    fn compute_values(&self, epoch: u64, rows: Range<usize>, params: &[f32], work: &mut Self::Work) -> f64 {
        let _ = (epoch, rows, params, work);
        unreachable!("{}: a model with disjoint batches computes new values", self.name())
    }

    /// Adds `scale` times what `work` accumulated to `delta`, and clears `work`.
    fn drain(&self, work: &mut Self::Work, scale: f32, delta: &mut Delta);

    /// The scale [`drain`](Self::drain) applies to an iteration of `rows` rows under SGD.
    fn scale(&self, rows: usize) -> f32;

    /// The learning rate of a gradient model, whose [`drain`](Self::drain) with scale `1 / rows`
    /// gives the mean gradient (what optimizers other than SGD step with); `None` for a model
    /// whose update is not a gradient (matrix factorization's SGD over its own ratings).
    fn lr(&self) -> Option<f32>;

    /// The model's L2 penalty, `0.5 l2 |w|^2` over the parameters in the ranges, where a step at
    /// the parameters' owners may apply it instead of the chunks (its gradient `l2 w` added to
    /// the batch's mean gradient, as PyTorch's optimizers apply `weight_decay`): the engine
    /// then builds the threads' work [`without_decay`](Self::without_decay). `None`: no
    /// penalty, or not one weight on fixed parameters (LR's counts the rows touching each
    /// feature).
    fn decay(&self) -> Option<(f32, Vec<Range<usize>>)> {
        None
    }

    /// Makes the chunks computed with `work` leave the [`decay`](Self::decay) penalty's
    /// gradient out: the owners' step applies it.
    fn without_decay(&self, _work: &mut Self::Work) {}

    /// Whether the engine computes a run of consecutive chunks a thread took at once in one
    /// call over all their rows, rather than chunk by chunk: for a model whose cost per call
    /// falls with more rows (matrix products, which pass the weights and their gradient
    /// through the cache once per call). Either way gives the same sums. No by default: MF's
    /// chunks are its strata's slots, each computed on its own rows gathered.
    fn joins_chunks(&self) -> bool {
        false
    }

    /// Parameters L1 regularization leaves alone (an intercept).
    fn unpenalized(&self) -> Range<usize> {
        0..0
    }

    /// Whether rows carry state of their own in the parameters that each visit updates by a
    /// delta against what it read (LDA's topic assignments): such a model needs every pull to
    /// follow every earlier update ([`crate::Scheme::pulls_every_update`]), or a delta lands on
    /// a state it was not computed from.
    fn needs_current_rows(&self) -> bool {
        false
    }

    /// Whether `compute` sleeps instead of computing (a stand-in workload): an injected delay is
    /// then scaled from a chunk's wall time, not from the thread's CPU time (which a sleep does
    /// not use).
    fn slept(&self) -> bool {
        false
    }

    /// What the user should know about how the model trains at the batch and chunk it was built
    /// for (matrix factorization without strata), if anything: rank 0 prints it once the plan
    /// is known to be valid.
    fn warning(&self) -> Option<&str> {
        None
    }

    /// Evaluates full parameters `params` on evaluation rows `rows`.
    fn evaluate(&self, params: &[f32], rows: Range<usize>) -> EvalSums;

    /// What learning nothing scores on the evaluation set ([`Baseline`]); one pass over its
    /// labels.
    fn baseline(&self) -> Baseline;
}

/// `z` turned into probabilities in place (a numerically stable softmax).
pub(crate) fn softmax_in_place(z: &mut [f32]) {
    let m = z.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    let mut sum = 0.0f64;
    for v in z.iter_mut() {
        let e = f64::from(*v - m).exp();
        *v = e as f32;
        sum += e;
    }
    for v in z.iter_mut() {
        *v = (f64::from(*v) / sum) as f32;
    }
}

/// A uniform value in `[-a, a)` for parameter `index` under `seed`.
pub fn uniform(seed: u64, index: usize, a: f32) -> f32 {
    let u = (crate::plan::mix(seed ^ crate::plan::mix(index as u64)) >> 40) as f32 / (1u64 << 24) as f32;
    (2.0 * u - 1.0) * a
}
