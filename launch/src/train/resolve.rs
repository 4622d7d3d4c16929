//! The resolved configuration of a training run: the flags over the configuration file, every
//! default filled in (the models' tuned defaults of docs/defaults.md), and the checks of flags
//! that do not go together, all before anything runs.

use std::path::{Path, PathBuf};

use peregrine_core::engine;
use peregrine_core::inject::Pattern;
use peregrine_core::optim::{Decay, Optimizer};
use peregrine_core::Scheme;
use serde::Serialize;

use super::args::{parse_cost, read_file, ModelKind, Split, TrainArgs, TrainFile};
use crate::error::AppError;

/// Seconds without progress before the watchdog ends a job (PyTorch's default collective
/// time-out): generous, since an iteration, an evaluation or a checkpoint of a large model on a
/// slow file system may take minutes.
const DEFAULT_WATCHDOG: f64 = 600.0;

/// Most compute threads a rank may ask for.
const MAX_THREADS: usize = 1024;

/// A model's training defaults, chosen by the sweep of docs/defaults.md
/// (`scripts/defaults_sweep.py`: tuning data only, Adult, heart_scale, Fashion-MNIST and
/// generated problems other than those the quality tests judge).
#[derive(Clone, Copy, Debug)]
struct Defaults {
    optimizer: Optimizer,
    batch: usize,
    chunk: usize,
    /// Iterations at least, when the length is not given: 5 epochs of a small set are too few
    /// steps.
    at_least: u64,
}

impl ModelKind {
    /// The defaults on training data whose features are mostly absent if `sparse` (see
    /// [`mostly_absent`]; it matters to `lr` alone).
    fn defaults(self, sparse: bool) -> Defaults {
        let adam = Optimizer::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 };
        let adagrad = Optimizer::AdaGrad { eps: peregrine_core::optim::EPS };
        let (optimizer, batch, chunk, at_least) = match self {
            // One-hot and bag-of-ids rows: per-coordinate rates (a rare feature's gradient,
            // averaged over a batch it is nearly absent from, is too small for one global rate),
            // for 5 epochs (longer, rare features overfit: the sweep's best length).
            Self::Lr if sparse => (adagrad, 4096, 512, 0),
            Self::Lr => (Optimizer::Sgd, 4096, 512, 1000),
            Self::Softmax => (adam, 256, 64, 3000),
            Self::Mf => (adagrad, 8192, 1024, 0),
            Self::Mlp => (Optimizer::Momentum { mu: 0.9, nesterov: false }, 128, 64, 10_000),
            // One epoch is one Gibbs sweep; documents are rows.
            Self::Lda => (Optimizer::Sgd, 256, 32, 0),
            Self::Synthetic => (Optimizer::Sgd, 1024, 64, 0),
        };
        Defaults { optimizer, batch, chunk, at_least }
    }

    /// The default (learning rate, decay) under `o`, the sweep's best for that optimizer
    /// (decay: inverse-time per epoch, or cosine); under momentum with another MU than 0.9 the
    /// rate is scaled by `(1 - MU) / 0.1` (the same step once the velocity has built up). `lr`'s
    /// rates on `sparse` data are the sparse sweep's.
    fn tuned(self, o: Optimizer, sparse: bool) -> (f32, Decay) {
        use Optimizer::{AdaGrad, Adam, Ftrl, Momentum, Sgd};
        const NONE: Decay = Decay::Inverse(0.0);
        const COSINE: Decay = Decay::Cosine;
        let (lr, decay) = match (self, o) {
            (Self::Mf, AdaGrad { .. }) => (0.1, NONE),
            (Self::Mf, _) => (0.01, NONE),
            // Not a gradient model: the rate is not used.
            (Self::Lda | Self::Synthetic, _) => (1.0, NONE),
            (Self::Lr, Sgd) => (1.0, NONE),
            (Self::Lr, Momentum { .. }) if sparse => (0.3, NONE),
            (Self::Lr, Momentum { .. }) => (0.1, NONE),
            (Self::Lr, AdaGrad { .. }) if sparse => (0.1, NONE),
            (Self::Lr, AdaGrad { .. }) => (0.03, NONE),
            (Self::Lr, Adam { .. }) if sparse => (0.03, NONE),
            (Self::Lr, Adam { .. }) => (0.003, NONE),
            (Self::Lr | Self::Softmax | Self::Mlp, Ftrl { .. }) => (1.0, NONE),
            (Self::Softmax, Sgd) => (0.1, NONE),
            (Self::Softmax, Momentum { .. }) => (0.03, NONE),
            (Self::Softmax, AdaGrad { .. }) => (0.1, NONE),
            (Self::Softmax, Adam { .. }) => (0.003, COSINE),
            (Self::Mlp, Sgd) => (0.3, NONE),
            (Self::Mlp, Momentum { .. }) => (0.1, COSINE),
            (Self::Mlp, AdaGrad { .. }) => (0.03, NONE),
            (Self::Mlp, Adam { .. }) => (0.01, COSINE),
        };
        match o {
            Momentum { mu, .. } => (lr * (1.0 - mu) / 0.1, decay),
            _ => (lr, decay),
        }
    }
}

/// The resolved configuration, as written to `config.toml`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct Resolved {
    pub(super) model: ModelKind,
    pub(super) data: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) eval: Option<PathBuf>,
    pub(super) scheme: Scheme,
    #[serde(serialize_with = "short_f32")]
    pub(super) lr: f32,
    pub(super) lr_decay: Decay,
    pub(super) warmup: u64,
    pub(super) optimizer: Optimizer,
    #[serde(serialize_with = "short_f32")]
    pub(super) l1: f32,
    pub(super) batch: usize,
    pub(super) chunk: usize,
    pub(super) grain: u32,
    pub(super) iterations: u64,
    /// Iterations at least when the length is derived from the default epochs.
    #[serde(skip)]
    pub(super) at_least: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) target_loss: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) early_stop: Option<u64>,
    pub(super) eval_every: u64,
    pub(super) checkpoint_every: u64,
    /// 0: none.
    pub(super) checkpoint_seconds: f64,
    /// 0: no watchdog.
    pub(super) watchdog: f64,
    pub(super) threads: usize,
    pub(super) steal: bool,
    pub(super) steal_fraction: f64,
    pub(super) seed: u64,
    pub(super) stop_on_stall: bool,
    pub(super) intercept: bool,
    pub(super) k: usize,
    /// LR: hashed features' bits (none: a weight a column).
    pub(super) hash_bits: Option<u32>,
    pub(super) alpha: f64,
    pub(super) eta: f64,
    #[serde(serialize_with = "short_f32")]
    pub(super) l2: f32,
    /// `l2` is still to be set to 1 / training rows (the default; scikit-learn's C = 1).
    #[serde(skip)]
    pub(super) l2_per_row: bool,
    pub(super) hidden: Vec<usize>,
    /// Synthetic: seconds a chunk costs, and the model's parameters.
    pub(super) chunk_cost: f64,
    pub(super) params: usize,
    pub(super) split: Split,
    pub(super) straggler: String,
    /// Also write the model as `.npy` files (how the run is written out, not what it computes).
    #[serde(skip)]
    pub(super) npy: bool,
    /// None for the models without features.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) standardize: Option<crate::scaling::Standardize>,
    pub(super) node_combine: peregrine_core::engine::NodeCombine,
    /// The scaling the sets are read through, once measured (`--standardize`; a function of the
    /// training data, measured again on a resume).
    #[serde(skip)]
    pub(super) scaling: Option<peregrine_kernels::data::standardize::Scaling>,
    /// Why the features are far from unit scale, when they are and were left so.
    #[serde(skip)]
    pub(super) off_scale: Option<String>,
}

/// An `f32` written as its shortest decimal (`0.1`, not the `0.10000000149011612` of its `f64`
/// value).
fn short_f32<S: serde::Serializer>(x: &f32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(x.to_string().parse().unwrap_or(f64::from(*x)))
}

impl Resolved {
    /// The configuration as TOML, without the keys of other models (an LR run lists no `hidden`).
    pub(super) fn to_toml(&self) -> Result<String, toml::ser::Error> {
        let mut t = toml::Table::try_from(self)?;
        let others: &[&str] = match self.model {
            ModelKind::Lr => &["k", "hidden", "split", "alpha", "eta"],
            ModelKind::Softmax => &["intercept", "k", "hidden", "split", "l1", "alpha", "eta"],
            ModelKind::Mf => &["hidden", "split", "l1", "alpha", "eta"],
            ModelKind::Mlp => &["intercept", "k", "l1", "alpha", "eta"],
            ModelKind::Lda => {
                &["intercept", "hidden", "split", "l1", "l2", "optimizer", "lr", "lr-decay", "warmup"]
            }
            ModelKind::Synthetic => &[
                "intercept",
                "k",
                "hidden",
                "split",
                "l1",
                "l2",
                "alpha",
                "eta",
                "optimizer",
                "lr",
                "lr-decay",
                "warmup",
            ],
        };
        for k in others {
            t.remove(*k);
        }
        if self.model != ModelKind::Synthetic {
            t.remove("chunk-cost");
            t.remove("params");
        }
        toml::to_string(&t)
    }

    /// Threads per rank, if set (else the rank's CPUs, decided when the rank starts).
    pub(crate) fn threads(&self) -> Option<usize> {
        (self.threads > 0).then_some(self.threads)
    }

    pub(super) fn model_name(&self) -> &'static str {
        self.model.name()
    }

    /// Why the model cannot run under the scheme, if it cannot: the engine's refusal
    /// ([`engine::check_scheme_for_rows`]) before the model is built (LDA's rows carry state of
    /// their own, `Lda::needs_current_rows`).
    pub(crate) fn unsuited_scheme(&self) -> Option<String> {
        engine::check_scheme_for_rows(&self.scheme, self.model.name(), self.model == ModelKind::Lda)
            .err()
            .map(|e| e.to_string())
    }
}

pub(super) fn usage(s: impl std::fmt::Display) -> AppError {
    AppError::Usage(s.to_string())
}

/// Whether the dataset at `data` holds sparse rows whose features are mostly absent (fewer
/// nonzeros than half its cells: one-hot categories, bags of ids, hashed features), read from its
/// header alone. False for dense data, and where the header cannot be read (the data check names
/// the problem when the run opens it).
fn mostly_absent(data: &Path) -> bool {
    let Ok(ds) = peregrine_kernels::data::Dataset::open(data) else { return false };
    let h = ds.header();
    ds.kind() == peregrine_kernels::data::Kind::Sparse
        && u128::from(h.nnz) * 2 < u128::from(h.rows) * u128::from(h.cols)
}

/// The configuration's checks, without running anything (the fuzz targets' entry).
pub(crate) fn check(a: &TrainArgs) -> Result<(), AppError> {
    resolve(a).map(drop)
}

pub(super) fn resolve(a: &TrainArgs) -> Result<(Resolved, Option<f64>), AppError> {
    let f = match &a.config {
        Some(p) => read_file(p)?,
        None => TrainFile::default(),
    };
    let (mut r, epochs) = finish(f.overlay(a.as_file()))?;
    r.npy = a.npy;
    Ok((r, epochs))
}

/// The configuration `f` with every default filled in and checked; `Some(epochs)` when the
/// iteration count is still to be derived from the data.
pub(crate) fn finish(f: TrainFile) -> Result<(Resolved, Option<f64>), AppError> {
    let model = f.model.ok_or_else(|| {
        usage("no model: give --model lr|softmax|mf|mlp|lda|synthetic (or `model` in --config)")
    })?;
    let data = f.data.ok_or_else(|| usage("no training data: give --data FILE (or `data` in --config)"))?;
    let sparse = model == ModelKind::Lr && mostly_absent(&data);
    let d = model.defaults(sparse);
    let (epochs, iterations) = (f.epochs, f.iterations);
    if epochs.is_some() && iterations.is_some() {
        return Err(usage("give epochs or iterations, not both"));
    }
    if let Some(e) = epochs.filter(|e| !(e.is_finite() && *e > 0.0)) {
        return Err(usage(format!("epochs must be positive, got {e}")));
    }
    if iterations == Some(0) {
        return Err(usage("iterations must be at least 1, got 0"));
    }
    match (f.early_stop, &f.eval) {
        (Some(0), _) => {
            return Err(usage(
                "--early-stop must be at least 1 (evaluations without improvement before stopping), got 0",
            ))
        }
        (Some(_), None) => {
            return Err(usage(
                "--early-stop needs held-out data to judge by: give --eval FILE (without it the evaluations \
                 are on the training set, whose loss keeps falling as the model overfits); `peregrine data \
                 split` makes one",
            ))
        }
        _ => {}
    }
    if let Some(t) = f.threads.filter(|&t| t > MAX_THREADS) {
        return Err(usage(format!(
            "threads per rank must be at most {MAX_THREADS} (more than the cores only oversubscribes them), got {t}"
        )));
    }
    let scheme = f.scheme.unwrap_or_else(Scheme::bsp);
    let l1 = f.l1.unwrap_or(0.0);
    if !(l1.is_finite() && l1 >= 0.0) {
        return Err(usage(format!("--l1 must be 0 or more, got {l1}")));
    }
    let optimizer = match (f.optimizer, l1 > 0.0) {
        (None, true) => Optimizer::Ftrl { beta: peregrine_core::optim::FTRL_BETA, l1 },
        (Some(o @ Optimizer::Ftrl { .. }), _) => o.with_l1(l1),
        (Some(o), true) => {
            return Err(usage(format!(
                "--l1 is applied by FTRL-Proximal (--optimizer ftrl, which keeps exact zeros under \
                 concurrent updates), not by {o}"
            )))
        }
        (o, false) => o.unwrap_or(d.optimizer),
    };
    if l1 > 0.0 && model != ModelKind::Lr {
        return Err(usage(format!("--l1 is for --model lr, not {}", model.name())));
    }
    if matches!(optimizer, Optimizer::Ftrl { .. }) && model != ModelKind::Lr {
        return Err(usage(format!("--optimizer ftrl is for --model lr, not {}", model.name())));
    }
    if model == ModelKind::Lda {
        let set: Vec<&str> = [
            ("--lr", f.lr.is_some()),
            ("--optimizer", f.optimizer.is_some()),
            ("--l2", f.l2.is_some()),
            ("--lr-decay", f.lr_decay.is_some()),
            ("--warmup", f.warmup.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect();
        if !set.is_empty() {
            return Err(usage(format!(
                "{}: lda samples topics (collapsed Gibbs), it has no learning rate, optimizer or L2; its \
                 settings are --k (topics), --alpha and --eta",
                set.join(", ")
            )));
        }
        if f.k.is_some_and(|k| k < 2) {
            return Err(usage(format!("--k: lda needs at least 2 topics, got {}", f.k.unwrap_or(0))));
        }
        for (flag, v) in [("--alpha", f.alpha), ("--eta", f.eta)] {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return Err(usage(format!("{flag} must be a positive number, got {v}")));
            }
        }
    } else if f.alpha.is_some() || f.eta.is_some() {
        return Err(usage(format!("--alpha and --eta are for --model lda, not {}", model.name())));
    }
    if model == ModelKind::Mf && !matches!(optimizer, Optimizer::Sgd | Optimizer::AdaGrad { .. }) {
        return Err(usage(format!(
            "--optimizer {optimizer}: mf runs SGD over each rating (its update is not a gradient), at \
             one rate (sgd) or at per-row adaptive rates (adagrad, libmf's schedule)"
        )));
    }
    let (lr, decay) = model.tuned(optimizer, sparse);
    let lr_decay = f.lr_decay.unwrap_or(decay);
    let warmup = f.warmup.unwrap_or(0);
    if optimizer.derived() && (warmup > 0 || lr_decay != Decay::Inverse(0.0)) {
        return Err(usage(format!(
            "--optimizer {optimizer} takes a constant learning rate (its per-parameter rates decay by \
             themselves): drop --warmup and --lr-decay"
        )));
    }
    let r = Resolved {
        model,
        data,
        eval: f.eval,
        scheme,
        lr: f.lr.unwrap_or(lr),
        lr_decay,
        warmup,
        optimizer,
        l1,
        batch: f.batch.unwrap_or(d.batch),
        chunk: f.chunk.unwrap_or(d.chunk),
        grain: f.grain.unwrap_or(1),
        iterations: iterations.unwrap_or(0),
        at_least: if epochs.is_none() && iterations.is_none() { d.at_least } else { 0 },
        target_loss: f.target_loss,
        early_stop: f.early_stop,
        eval_every: f.eval_every.unwrap_or(0),
        checkpoint_every: f.checkpoint_every.unwrap_or(u64::MAX),
        checkpoint_seconds: f.checkpoint_seconds.unwrap_or(0.0),
        watchdog: f.watchdog.unwrap_or(DEFAULT_WATCHDOG),
        threads: f.threads.unwrap_or(0),
        steal: f.steal.unwrap_or(true),
        steal_fraction: f.steal_fraction.unwrap_or(0.5),
        seed: f.seed.unwrap_or(1),
        stop_on_stall: f.stop_on_stall.unwrap_or(false),
        intercept: f.intercept.unwrap_or(true),
        k: f.k.unwrap_or(if model == ModelKind::Lda { 20 } else { 40 }),
        hash_bits: f.hash_bits,
        alpha: f.alpha.unwrap_or(0.1),
        eta: f.eta.unwrap_or(0.01),
        l2: f.l2.unwrap_or(match (model, optimizer) {
            (ModelKind::Mf, Optimizer::AdaGrad { .. }) => 0.1,
            (ModelKind::Mf, _) => 0.05,
            _ => 0.0,
        }),
        l2_per_row: f.l2.is_none() && !matches!(model, ModelKind::Mf | ModelKind::Lda),
        hidden: f.hidden.unwrap_or_else(|| vec![128]),
        chunk_cost: match f.chunk_cost.as_deref() {
            Some(s) => parse_cost(s).map_err(usage)?.as_secs_f64(),
            None => 0.002,
        },
        params: f.params.unwrap_or(101_770),
        split: f.split.unwrap_or_default(),
        straggler: f.straggler.unwrap_or_else(|| "ideal".into()),
        npy: false,
        // Hashed features' ids are not columns to measure (up to 2^32 of them).
        standardize: (model.has_features() && f.hash_bits.is_none())
            .then(|| f.standardize.unwrap_or_default()),
        node_combine: f.node_combine.unwrap_or_default(),
        scaling: None,
        off_scale: None,
    };
    if f.standardize.is_some() && !model.has_features() {
        return Err(usage(format!(
            "--standardize is for the models that read features (lr, softmax, mlp), not {}",
            model.name()
        )));
    }
    if f.standardize == Some(crate::scaling::Standardize::On) && f.hash_bits.is_some() {
        return Err(usage(
            "--standardize is not for hashed features (--hash-bits: their ids, up to 2^32, are not \
             columns to measure); standardize the file with `peregrine data standardize` first, or \
             drop --hash-bits"
                .to_owned(),
        ));
    }
    if let Some(b) = r.hash_bits {
        if model != ModelKind::Lr {
            return Err(usage(format!(
                "--hash-bits is for --model lr (hashed features), not {}",
                model.name()
            )));
        }
        let max = peregrine_core::model::lr::MAX_HASH_BITS;
        if !(1..=max).contains(&b) {
            return Err(usage(format!(
                "--hash-bits must be from 1 to {max} (2^{max} weights, 1 GiB of f32 a window), got {b}"
            )));
        }
    }
    if model != ModelKind::Synthetic && (f.chunk_cost.is_some() || f.params.is_some()) {
        return Err(usage(format!(
            "--chunk-cost and --params are for --model synthetic, not {}",
            model.name()
        )));
    }
    if model == ModelKind::Synthetic
        && !(1..=peregrine_core::model::synthetic::MAX_PARAMS).contains(&r.params)
    {
        return Err(usage(format!(
            "--params must be between 1 and {} (1 GiB of f32 a rank), got {}",
            peregrine_core::model::synthetic::MAX_PARAMS,
            r.params
        )));
    }
    if r.split == Split::Units && (r.model != ModelKind::Mlp || r.hidden.len() != 1) {
        return Err(usage(if r.model == ModelKind::Mlp {
            format!(
                "--split units splits the hidden units of an MLP with one hidden layer, not {} ({})",
                r.hidden.len(),
                r.hidden.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
            )
        } else {
            format!("--split units is for --model mlp (its hidden units), not {}", model.name())
        }));
    }
    if !(r.lr.is_finite() && r.lr > 0.0) {
        return Err(usage(format!("the learning rate must be positive, got {}", r.lr)));
    }
    if !(r.l2.is_finite() && r.l2 >= 0.0) {
        return Err(usage(format!("--l2 must be 0 or more, got {}", r.l2)));
    }
    for (flag, v) in [("--checkpoint-seconds", r.checkpoint_seconds), ("--watchdog", r.watchdog)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(usage(format!("{flag} must be 0 or more seconds, got {v}")));
        }
    }
    r.straggler.parse::<Pattern>().map_err(usage)?;
    Ok((r, epochs.or(if iterations.is_none() { Some(5.0) } else { None })))
}
