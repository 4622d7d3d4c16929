//! `peregrine train`: one training run from a TOML file and flags (flags win).

use std::io::{BufWriter, IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use peregrine_core::engine::{self, Config, EvalPoint, Progress, Report, Watchdog};
use peregrine_core::inject::{Injection, Pattern};
use peregrine_core::model::{
    lda::Lda, lr::LogReg, mf::Mf, mlp::Mlp, softmax::Softmax, synthetic::Synthetic, Export,
};
use peregrine_core::optim::{Decay, Optimizer, Schedule};
use peregrine_core::plan::Plan;
use peregrine_core::pool::{Pinning, RankPool, Slot};
use peregrine_core::{Scheme, SchemeSpec, TrainError};
use peregrine_transport::{Backend, Transport};
use serde::{Deserialize, Serialize};

mod footprint;

use peregrine_kernels::data::standardize::Scaling;

use crate::agree::Digest;
use crate::error::AppError;
use crate::meta;
use crate::preempt::{write_atomically, EXIT_REQUEUE};
use crate::world::{run_world, RunContext, WorldArgs};

/// Which model to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Binary logistic regression on a sparse dataset (converted LIBSVM).
    Lr,
    /// Softmax regression on a dense multiclass dataset (converted MNIST IDX).
    Softmax,
    /// Matrix factorization on a ratings dataset.
    Mf,
    /// Multilayer perceptron on a dense multiclass dataset.
    Mlp,
    /// Latent Dirichlet allocation (collapsed Gibbs sampling) on a dataset of word counts
    /// (converted UCI docword or LDA-C).
    Lda,
    /// A stand-in workload: each chunk sleeps for --chunk-cost over a dense model of --params
    /// values pulled and pushed whole every iteration (real communication, waits and schemes, no
    /// arithmetic: many ranks on few cores). The dataset gives only the rows.
    Synthetic,
}

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

/// `peregrine train` flags.
#[derive(Debug, Args)]
#[command(
    after_help = "A TOML file may hold any of the flags below (kebab-case keys, e.g. `target-loss = 0.35`, \
    `hidden = [128]`, `straggler = \"persistent:rank=0,speed=0.5\"`; paths relative to the file); flags override it.\n\n\
    Examples:\n  \
    peregrine data convert libsvm tests/data/adult.libsvm.gz adult.pgd\n  \
    peregrine train --model lr --data adult.pgd --epochs 20 --ranks 2\n  \
    mpirun -n 4 peregrine train --config configs/adult-lr.toml --scheme ssp:2 --straggler persistent:rank=0,speed=0.5\n\n\
    The run directory (--run-dir, default runs/<model>-<scheme>-<time>) receives config.toml (the resolved \
    configuration), meta.json (ranks, hosts, CPU binding), metrics/rank-<r>.jsonl (one line per iteration: \
    compute, comm and wait seconds, chunks own/taken, active threads, loss), summary.json and model.safetensors \
    (the trained parameters; apply them with `peregrine predict`).\n\n\
    Before anything of the model's size is allocated, the memory the run will hold on each node (parameters, \
    their copies per rank and per thread, the optimizer's state) is estimated from the flags and the datasets' \
    headers; a run that needs more than the node has available (MemAvailable, or its control group's or \
    ulimit's limit) is refused (exit 2), naming the flag or header field that sizes it. A signal (SIGTERM, \
    SIGUSR1) during the check of the data before training ends the run at once with exit 75, nothing saved."
)]
pub struct TrainArgs {
    #[command(flatten)]
    world: WorldArgs,
    /// TOML configuration file.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// Model.
    #[arg(long, value_enum)]
    model: Option<ModelKind>,
    /// Training set (a dataset file from `peregrine data convert` or `data gen`).
    #[arg(long, value_name = "FILE")]
    data: Option<PathBuf>,
    /// Evaluation set (default: the training set). With one, model.safetensors holds the best
    /// evaluated model (the lowest evaluation loss; its iteration in the metadata as
    /// `best_iteration`, its loss as `eval_loss`), with or without --early-stop.
    #[arg(long, value_name = "FILE")]
    eval: Option<PathBuf>,
    /// Synchronization: bsp, asp, ssp[:<staleness>] (staleness 3 if not given),
    /// dynsgd[:<staleness>] (SSP, or ASP without a bound, with updates scaled by 1 / (1 +
    /// staleness)), backup:<b> (each iteration applies the first N - b updates), backup-dynamic
    /// (b chosen per iteration from compute times), lb-bsp[:arx|:ma|:narx] (batch shares by
    /// predicted speed: ARX, moving average or NARX network), speculative (BSP with copies of slow ranks' running chunks, the first result
    /// applied), flexrr[:<staleness>] (SSP, staleness 3 if not given, with rapid reassignment in
    /// helper groups), falcon (EPSP, enforced: BSP with straggler projection, task transfer and
    /// elastic threads), falcon:slack[:<staleness>] (EPSP over SSP, staleness 2 if not given)
    /// [default: bsp]. The run's summary and config.toml name the scheme in full (`ssp:3`).
    #[arg(long, value_name = "SCHEME")]
    scheme: Option<Scheme>,
    /// Learning rate [default by model and --optimizer, chosen by a sweep (docs/defaults.md): lr
    /// sgd 1, softmax adam 0.03, mlp momentum 0.1, mf adagrad 0.1 (sgd 0.01); see the README for the others].
    #[arg(long, value_name = "F")]
    lr: Option<f32>,
    /// Global mini-batch rows per iteration, split over the ranks [default: lr 4096, softmax 256,
    /// mf 8192, mlp 128].
    #[arg(long, value_name = "N")]
    batch: Option<usize>,
    /// Rows per chunk, the unit threads and ranks take work in [default: lr 512, softmax 64, mf 1024,
    /// mlp 64].
    #[arg(long, value_name = "N")]
    chunk: Option<usize>,
    /// Chunks a thread takes from its own queue at once (the MLP computes them in one call)
    /// [default: 1].
    #[arg(long, value_name = "N")]
    grain: Option<u32>,
    /// Passes over the training set [default: 5 unless --iterations is given, and at least 1000
    /// iterations (lr), 3000 (softmax) or 10000 (mlp)].
    #[arg(long, value_name = "F", conflicts_with = "iterations")]
    epochs: Option<f64>,
    /// Iterations (global mini-batches).
    #[arg(long, value_name = "N")]
    iterations: Option<u64>,
    /// Stop as soon as the evaluation loss is at or below this (needs --eval-every to be checked
    /// before the end).
    #[arg(long, value_name = "F")]
    target_loss: Option<f64>,
    /// Early stopping: stop once the evaluation loss has not improved (fallen below its lowest so
    /// far) for N evaluations in a row (every --eval-every iterations, by default every epoch
    /// under early stopping). Needs --eval: held-out data, on which a model that overfits gets
    /// worse (the training set's loss keeps falling). model.safetensors holds the best evaluated
    /// model, not the last.
    #[arg(long, value_name = "N")]
    early_stop: Option<u64>,
    /// Evaluate every N iterations [default: once per epoch, and at most about 10 times a run
    /// unless --early-stop is given].
    #[arg(long, value_name = "N")]
    eval_every: Option<u64>,
    /// Learning-rate decay: F (epoch e, fractional, updates with lr / (1 + F e)) or `cosine` (half
    /// a cosine from lr after the warm-up to 0 at the last iteration) [default by model and
    /// --optimizer: softmax 1 (0 under adagrad), mlp cosine under momentum and adam, else 0].
    #[arg(long, value_name = "F|cosine")]
    lr_decay: Option<Decay>,
    /// Linear learning-rate warm-up from 0 over the first N iterations [default: 0].
    #[arg(long, value_name = "N")]
    warmup: Option<u64>,
    /// Update rule of lr, softmax and mlp: sgd, momentum[:MU] (heavy ball, MU 0.9 if not given),
    /// nesterov[:MU], adagrad, adam[:B1,B2] (0.9,0.999 if not given), ftrl (FTRL-Proximal; lr only).
    /// State (velocity, squared-gradient sums, moments) is sharded beside the weights and updated
    /// one-sidedly; mf runs SGD per rating at one rate (sgd) or at per-row adaptive rates (adagrad,
    /// libmf's schedule) [default: lr sgd, softmax adam, mlp momentum, mf adagrad]. The
    /// default --lr and --lr-decay depend on it (see the README).
    #[arg(long, value_name = "NAME")]
    optimizer: Option<Optimizer>,
    /// LR: L1 regularization `F |w|` (not of the intercept), applied by FTRL-Proximal so weights
    /// inside the L1 ball are exact zeros; selects --optimizer ftrl unless another is given (which
    /// is an error) [default: 0].
    #[arg(long, value_name = "F")]
    l1: Option<f32>,
    /// Compute threads per rank [default: this rank's CPUs].
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Do not let ranks take over each other's chunks.
    #[arg(long)]
    no_steal: bool,
    /// Fraction of a slower rank's remaining chunks a rank takes over at once [default: 0.5].
    #[arg(long, value_name = "F")]
    steal_fraction: Option<f64>,
    /// Seed of the initial model and of the batch order [default: 1].
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Take a checkpoint every N iterations, into the run directory (0: none) [default: every
    /// epoch, at most about ten per run, and spaced further when needed to cost at most 1 % of
    /// the training time]. Rerunning the command with the same --run-dir resumes from the last
    /// one, with any number of ranks.
    #[arg(long, value_name = "N")]
    checkpoint_every: Option<u64>,
    /// Also take a checkpoint once S seconds of training have passed since the previous one
    /// (rank 0's clock decides; the ranks agree on the iteration, as for a stop) [default: none].
    #[arg(long, value_name = "S")]
    checkpoint_seconds: Option<f64>,
    /// End the job, naming the rank, when a rank makes no progress for S seconds (a rank stopped,
    /// hung or unreachable; exit code 124); 0: never [default: 600, as PyTorch's collective
    /// time-out]. Progress is any chunk, pull, push, evaluation or checkpoint finished. Once asked
    /// to stop (SIGTERM, SIGUSR1), a rank has 15 s (or S if shorter) without progress to reach the
    /// stop's checkpoint, also with 0; past that the job ends with exit code 75 (requeue: the last
    /// checkpoint stands).
    #[arg(long, value_name = "S")]
    watchdog: Option<f64>,
    /// Record a timeline of every rank (Chrome Trace Event JSON, for https://ui.perfetto.dev or
    /// chrome://tracing): `trace.json` in the run directory, one process per rank, one track per
    /// thread: chunks, pulls, pushes, waits (for whom), evaluations, checkpoints, injected
    /// delays, thread counts and the scheme's decisions.
    #[arg(long)]
    trace: bool,
    /// Where ranks share nodes (several nodes, some holding several ranks: the launcher's
    /// placement, or `--ranks-per-node` locally), a synchronous scheme (bsp, lb-bsp, with or
    /// without taking over) on a dense model gives each node one copy of the weights that its
    /// ranks read in place, and adds the node's updates up before they cross the network: a rank
    /// moves 1/K of the model to and from other nodes per iteration (K ranks a node) in one
    /// operation per node, instead of all of it in one per rank. The same model up to rounding;
    /// `off` keeps every rank's own pulls and pushes [default: auto]
    #[arg(long, value_enum, value_name = "WHEN")]
    node_combine: Option<crate::world::NodeCombine>,
    /// Also write the model as NumPy files, `model/<tensor>.npy` (f32, one per tensor of
    /// model.safetensors) with `model/meta.json`, in the run directory, at the end and at each
    /// checkpoint.
    #[arg(long)]
    npy: bool,
    /// Start again in a run directory that holds a finished run or another run's checkpoint
    /// (its checkpoints, metrics and summary are replaced).
    #[arg(long)]
    force: bool,
    /// Stop with an error (exit 1) when the evaluations show the model not learning: no better
    /// than a constant prediction, or the loss rising, at 3 evaluations in a row (otherwise a
    /// warning). A diverged loss (not a number, or 10 times a blind model's) always stops.
    #[arg(long)]
    stop_on_stall: bool,
    /// LR: no intercept (`p = sigmoid(w . x)`; by default `sigmoid(w . x + b)`); MF: no user and
    /// item biases and global mean (`r = u . v`; by default `mean + b_u + b_i + u . v`). Softmax
    /// and MLP always have their biases.
    #[arg(long)]
    no_intercept: bool,
    /// MF: factor rank [default: 40]; LDA: topics [default: 20].
    #[arg(long, value_name = "K")]
    k: Option<usize>,
    /// LR: hashed features: a model of 2^B weights (B from 1 to 28), feature id j read and
    /// updated at bucket hash(j) whatever ids the data holds (LIBSVM ids, raw ids up to
    /// 2^32 - 1): the model's size is chosen, not dictated by the largest id. Features sharing a
    /// bucket share its weight. Pulls and pushes move only the buckets of the iteration's rows.
    /// `predict` hashes alike (model.safetensors records B) [default: off, one weight a column]
    #[arg(long, value_name = "B")]
    hash_bits: Option<u32>,
    /// LDA: the symmetric document-topic prior [default: 0.1, as the `lda` package].
    #[arg(long, value_name = "A")]
    alpha: Option<f64>,
    /// LDA: the symmetric topic-word prior [default: 0.01, as the `lda` package].
    #[arg(long, value_name = "E")]
    eta: Option<f64>,
    /// L2 regularization of the weights (never of an intercept or bias): `0.5 F |w|^2` added to
    /// the mean loss; LR applies it where rows touch features (sparse-SGD form) [default: mf 0.1
    /// under adagrad, 0.05 under sgd; others 1 / training rows, as scikit-learn's C = 1].
    #[arg(long, value_name = "F")]
    l2: Option<f32>,
    /// MLP: hidden layer widths, comma-separated [default: 128].
    #[arg(long, value_name = "N,N,...", value_delimiter = ',')]
    hidden: Option<Vec<usize>>,
    /// Synthetic: what one chunk of --chunk rows costs, slept: `2ms`, `500us`, `0.002` (seconds)
    /// [default: 2ms].
    #[arg(long, value_name = "DURATION")]
    chunk_cost: Option<String>,
    /// Synthetic: parameters (f32) of the dense model every rank pulls and pushes whole each
    /// iteration [default: 101770, an MLP 784-128-10's].
    #[arg(long, value_name = "N")]
    params: Option<usize>,
    /// How a rank's threads share its chunks: rows (each thread computes chunks of its own) or
    /// units (MLP with one hidden layer: every thread computes every chunk for its share of the
    /// hidden units and steps their weights, which then stay in its core's cache; one rank a node
    /// with a thread a core, e.g. `mpirun -n 1` on a workstation) [default: rows].
    #[arg(long, value_enum, value_name = "HOW")]
    split: Option<Split>,
    /// Injected stragglers, seeded by --seed: ideal, slow-worker:p=P[,max=2],
    /// disrupted:p=P[,period=SECONDS,intensity=PERCENT], power-law:alpha=A,
    /// persistent:rank=R[/R...],speed=S[,threads=T], heterogeneous:speed=S/S/...[,threads=T/T/...],
    /// trace:name=noise|periodic|trend|load|mix,rank=R[/R...] [default: ideal].
    #[arg(long, value_name = "PATTERN")]
    straggler: Option<String>,
    /// Leave compute threads unpinned.
    #[arg(long)]
    no_pin: bool,
    /// LR, softmax, MLP: standardize the features on the fly, with the training set's per-feature
    /// mean and standard deviation (measured over every rank's rows, the same on all ranks), as
    /// `peregrine data standardize` would (sparse data keeps its zeros: only features every row
    /// stores are centred; a feature with no spread keeps its scale). The user's files are left as
    /// they are: the training and evaluation sets are read from standardized copies in memory (the
    /// sets' size again, per rank), and model.safetensors records the scaling, so that `predict`
    /// applies it to raw data. auto: when the features are far from unit scale, at least one
    /// column in ten with a nonzero value having a root mean square above 10 or below 0.1, or any
    /// column one above 100 (raw 0-255 pixels, amounts in thousands); on: always; off: never.
    /// A file made by `peregrine data standardize` is left as it is [default: auto]
    #[arg(long, value_enum, value_name = "WHEN")]
    standardize: Option<crate::scaling::Standardize>,
    /// Copy the training set into memory backed by 2 MiB transparent huge pages rather than read
    /// it through its file mapping: rows read from huge pages miss the TLB far less (the MLP on
    /// Fashion-MNIST at batch 128, 2 ranks: 7 % faster), at the cost of the set's size in memory
    /// per rank and one read of it at the start. auto: when the kernel's transparent huge pages
    /// are `always` or `madvise` and the set is at least 8 MiB and at most a quarter of the
    /// memory available per rank on this node (MemAvailable; ranks per node from
    /// OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS, else all ranks); on: any set of 8 MiB or
    /// more; off: never.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = HugePages::Auto)]
    huge_pages: HugePages,
    /// No progress bar and no summary table.
    #[arg(long, short = 'q')]
    quiet: bool,
}

/// How a rank's threads share the work of a chunk (`--split`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Each thread computes chunks of its own (all of the model for its rows).
    #[default]
    Rows,
    /// MLP with one hidden layer: every thread computes every chunk, for its share of the hidden
    /// units, and steps their weights, which stay in its core's cache.
    Units,
}

/// When `peregrine train` copies its training set into memory with huge pages (`--huge-pages`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum HugePages {
    /// When transparent huge pages are available and the set fits a quarter of the memory
    /// available per rank on the node.
    #[default]
    Auto,
    /// Always (sets of 8 MiB or more).
    On,
    /// Never: the set is read through its file mapping.
    Off,
}

impl HugePages {
    /// The largest training set to copy, for `ranks_here` ranks on this node.
    fn budget(self, ranks_here: usize) -> u64 {
        match self {
            Self::Off => 0,
            Self::On => u64::MAX,
            Self::Auto if !peregrine_kernels::data::huge_pages_enabled() => 0,
            Self::Auto => crate::limits::mem_available().map_or(0, |m| m / 4 / ranks_here.max(1) as u64),
        }
    }
}

/// Ranks on this node: every rank of a local world; under MPI as the launcher says
/// (`OMPI_COMM_WORLD_LOCAL_SIZE`, MPICH's `MPI_LOCALNRANKS`), else all of them.
fn ranks_on_node(t: &Transport) -> usize {
    if t.backend() == Backend::Local {
        return t.world_size();
    }
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or_else(|| t.world_size())
}

/// The configuration file: every key optional, unknown keys are errors.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct TrainFile {
    model: Option<ModelKind>,
    data: Option<PathBuf>,
    eval: Option<PathBuf>,
    pub(crate) scheme: Option<Scheme>,
    lr: Option<f32>,
    lr_decay: Option<Decay>,
    warmup: Option<u64>,
    optimizer: Option<Optimizer>,
    l1: Option<f32>,
    batch: Option<usize>,
    chunk: Option<usize>,
    grain: Option<u32>,
    epochs: Option<f64>,
    iterations: Option<u64>,
    pub(crate) target_loss: Option<f64>,
    early_stop: Option<u64>,
    eval_every: Option<u64>,
    checkpoint_every: Option<u64>,
    checkpoint_seconds: Option<f64>,
    watchdog: Option<f64>,
    threads: Option<usize>,
    steal: Option<bool>,
    steal_fraction: Option<f64>,
    pub(crate) seed: Option<u64>,
    stop_on_stall: Option<bool>,
    intercept: Option<bool>,
    k: Option<usize>,
    hash_bits: Option<u32>,
    alpha: Option<f64>,
    eta: Option<f64>,
    l2: Option<f32>,
    hidden: Option<Vec<usize>>,
    /// `"2ms"` or a number of seconds (what `config.toml` records).
    #[serde(default, deserialize_with = "cost_or_seconds")]
    chunk_cost: Option<String>,
    params: Option<usize>,
    split: Option<Split>,
    pub(crate) straggler: Option<String>,
    standardize: Option<crate::scaling::Standardize>,
    node_combine: Option<crate::world::NodeCombine>,
}

impl TrainFile {
    /// `self` with every key `top` sets replaced (epochs and iterations replace each other).
    pub(crate) fn overlay(self, top: TrainFile) -> TrainFile {
        let (epochs, iterations) = if top.epochs.is_some() || top.iterations.is_some() {
            (top.epochs, top.iterations)
        } else {
            (self.epochs, self.iterations)
        };
        TrainFile {
            model: top.model.or(self.model),
            data: top.data.or(self.data),
            eval: top.eval.or(self.eval),
            scheme: top.scheme.or(self.scheme),
            lr: top.lr.or(self.lr),
            lr_decay: top.lr_decay.or(self.lr_decay),
            warmup: top.warmup.or(self.warmup),
            optimizer: top.optimizer.or(self.optimizer),
            l1: top.l1.or(self.l1),
            batch: top.batch.or(self.batch),
            chunk: top.chunk.or(self.chunk),
            grain: top.grain.or(self.grain),
            epochs,
            iterations,
            target_loss: top.target_loss.or(self.target_loss),
            early_stop: top.early_stop.or(self.early_stop),
            eval_every: top.eval_every.or(self.eval_every),
            checkpoint_every: top.checkpoint_every.or(self.checkpoint_every),
            checkpoint_seconds: top.checkpoint_seconds.or(self.checkpoint_seconds),
            watchdog: top.watchdog.or(self.watchdog),
            threads: top.threads.or(self.threads),
            steal: top.steal.or(self.steal),
            steal_fraction: top.steal_fraction.or(self.steal_fraction),
            seed: top.seed.or(self.seed),
            stop_on_stall: top.stop_on_stall.or(self.stop_on_stall),
            intercept: top.intercept.or(self.intercept),
            k: top.k.or(self.k),
            hash_bits: top.hash_bits.or(self.hash_bits),
            alpha: top.alpha.or(self.alpha),
            eta: top.eta.or(self.eta),
            l2: top.l2.or(self.l2),
            hidden: top.hidden.or(self.hidden),
            chunk_cost: top.chunk_cost.or(self.chunk_cost),
            params: top.params.or(self.params),
            split: top.split.or(self.split),
            straggler: top.straggler.or(self.straggler),
            standardize: top.standardize.or(self.standardize),
            node_combine: top.node_combine.or(self.node_combine),
        }
    }

    /// A file that sets only these keys (an experiment's run of a workload).
    /// Experiment runs take no checkpoints (their times are what the experiment compares).
    pub(crate) fn only(scheme: &SchemeSpec, straggler: &str, seed: u64) -> TrainFile {
        TrainFile {
            scheme: Some(scheme.scheme.clone()),
            steal: Some(scheme.steal),
            straggler: Some(straggler.into()),
            seed: Some(seed),
            checkpoint_every: Some(0),
            ..TrainFile::default()
        }
    }
}

impl TrainArgs {
    /// The flags given, as a configuration file.
    fn as_file(&self) -> TrainFile {
        TrainFile {
            model: self.model,
            data: self.data.clone(),
            eval: self.eval.clone(),
            scheme: self.scheme.clone(),
            lr: self.lr,
            lr_decay: self.lr_decay,
            warmup: self.warmup,
            optimizer: self.optimizer,
            l1: self.l1,
            batch: self.batch,
            chunk: self.chunk,
            grain: self.grain,
            epochs: self.epochs,
            iterations: self.iterations,
            target_loss: self.target_loss,
            early_stop: self.early_stop,
            eval_every: self.eval_every,
            checkpoint_every: self.checkpoint_every,
            checkpoint_seconds: self.checkpoint_seconds,
            watchdog: self.watchdog,
            threads: self.threads,
            steal: self.no_steal.then_some(false),
            steal_fraction: self.steal_fraction,
            seed: self.seed,
            stop_on_stall: self.stop_on_stall.then_some(true),
            intercept: self.no_intercept.then_some(false),
            k: self.k,
            hash_bits: self.hash_bits,
            alpha: self.alpha,
            eta: self.eta,
            l2: self.l2,
            hidden: self.hidden.clone(),
            chunk_cost: self.chunk_cost.clone(),
            params: self.params,
            split: self.split,
            straggler: self.straggler.clone(),
            standardize: self.standardize,
            node_combine: self.node_combine,
        }
    }
}

/// How a run reports and where it writes.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunOpts {
    /// No progress bar, no summary table.
    pub(crate) quiet: bool,
    /// Leave threads unpinned.
    pub(crate) no_pin: bool,
    /// The run directory (else `--run-dir`/`PEREGRINE_RUN_DIR`, else `runs/<model>-<scheme>-<time>`).
    pub(crate) dir: Option<PathBuf>,
    /// Start again where a finished run or another run's checkpoint is.
    pub(crate) force: bool,
    /// Record a timeline (`trace.json`).
    pub(crate) trace: bool,
    /// When the training set is copied into memory with huge pages.
    pub(crate) huge_pages: HugePages,
}

/// The resolved configuration, as written to `config.toml`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct Resolved {
    model: ModelKind,
    data: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    eval: Option<PathBuf>,
    scheme: Scheme,
    #[serde(serialize_with = "short_f32")]
    lr: f32,
    lr_decay: Decay,
    warmup: u64,
    optimizer: Optimizer,
    #[serde(serialize_with = "short_f32")]
    l1: f32,
    batch: usize,
    chunk: usize,
    grain: u32,
    iterations: u64,
    /// Iterations at least when the length is derived from the default epochs.
    #[serde(skip)]
    at_least: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    target_loss: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    early_stop: Option<u64>,
    eval_every: u64,
    checkpoint_every: u64,
    /// 0: none.
    checkpoint_seconds: f64,
    /// 0: no watchdog.
    watchdog: f64,
    threads: usize,
    steal: bool,
    steal_fraction: f64,
    seed: u64,
    stop_on_stall: bool,
    intercept: bool,
    k: usize,
    /// LR: hashed features' bits (none: a weight a column).
    hash_bits: Option<u32>,
    alpha: f64,
    eta: f64,
    #[serde(serialize_with = "short_f32")]
    l2: f32,
    /// `l2` is still to be set to 1 / training rows (the default; scikit-learn's C = 1).
    #[serde(skip)]
    l2_per_row: bool,
    hidden: Vec<usize>,
    /// Synthetic: seconds a chunk costs, and the model's parameters.
    chunk_cost: f64,
    params: usize,
    split: Split,
    straggler: String,
    /// Also write the model as `.npy` files (how the run is written out, not what it computes).
    #[serde(skip)]
    npy: bool,
    /// None for the models without features.
    #[serde(skip_serializing_if = "Option::is_none")]
    standardize: Option<crate::scaling::Standardize>,
    node_combine: crate::world::NodeCombine,
    /// The scaling the sets are read through, once measured (`--standardize`; a function of the
    /// training data, measured again on a resume).
    #[serde(skip)]
    scaling: Option<peregrine_kernels::data::standardize::Scaling>,
    /// Why the features are far from unit scale, when they are and were left so.
    #[serde(skip)]
    off_scale: Option<String>,
}

/// An `f32` written as its shortest decimal (`0.1`, not the `0.10000000149011612` of its `f64`
/// value).
fn short_f32<S: serde::Serializer>(x: &f32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(x.to_string().parse().unwrap_or(f64::from(*x)))
}

impl Resolved {
    /// The configuration as TOML, without the keys of other models (an LR run lists no `hidden`).
    fn to_toml(&self) -> Result<String, toml::ser::Error> {
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
}

fn usage(s: impl std::fmt::Display) -> AppError {
    AppError::Usage(s.to_string())
}

/// Reads a TOML file of type `T`; errors name the file, line and column.
pub(crate) fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, AppError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| AppError::Io { what: format!("reading {}", path.display()), source })?;
    toml::from_str(&text).map_err(|e| {
        let at = e
            .span()
            .map(|s| {
                let line = text[..s.start].matches('\n').count() + 1;
                let col = s.start - text[..s.start].rfind('\n').map_or(0, |i| i + 1) + 1;
                format!(":{line}:{col}")
            })
            .unwrap_or_default();
        AppError::Data { what: format!("{}{at}", path.display()), detail: e.message().to_string() }
    })
}

impl TrainFile {
    /// Makes relative data paths relative to `base` (the directory of the file they came from).
    pub(crate) fn rebase(mut self, base: &Path) -> TrainFile {
        for p in [&mut self.data, &mut self.eval].into_iter().flatten() {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        self
    }
}

fn read_file(path: &Path) -> Result<TrainFile, AppError> {
    let f: TrainFile = read_toml(path)?;
    Ok(f.rebase(path.parent().unwrap_or(Path::new("."))))
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

fn resolve(a: &TrainArgs) -> Result<(Resolved, Option<f64>), AppError> {
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

/// The share of the training time default checkpoints may take.
const CHECKPOINT_BUDGET: f64 = 0.01;

/// Seconds without progress before the watchdog ends a job (PyTorch's default collective
/// time-out): generous, since an iteration, an evaluation or a checkpoint of a large model on a
/// slow file system may take minutes.
const DEFAULT_WATCHDOG: f64 = 600.0;

/// Seconds a rank may go without progress once asked to stop (SIGTERM, SIGUSR1) before the
/// watchdog ends the job: a peer that died cannot reach the stop's checkpoint, and Slurm sends
/// SIGKILL 30 s (`KillWait`) after SIGTERM, which leaves this much for the wait and the rest for
/// writing the checkpoint. Not less: with UCX over TCP between nodes on an oversubscribed
/// machine, one accumulate has been seen to take over 5 s while both ranks were healthy.
const STOP_GRACE: f64 = 15.0;

/// Most compute threads a rank may ask for.
const MAX_THREADS: usize = 1024;

/// `peregrine train`.
pub fn run(a: TrainArgs) -> Result<(), AppError> {
    let (resolved, epochs) = resolve(&a)?;
    let default_ranks = 2;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let opts = RunOpts {
        quiet: a.quiet,
        no_pin: a.no_pin,
        dir: None,
        force: a.force,
        trace: a.trace,
        huge_pages: a.huge_pages,
    };
    run_world(&a.world, default_ranks, |t, ctx| {
        rank(t, ctx, &opts, resolved.clone(), epochs, stamp).map(drop)
    })
}

/// One training run on this rank (collective): its report.
pub(crate) fn rank(
    t: &Transport,
    ctx: &RunContext,
    a: &RunOpts,
    r: Resolved,
    epochs: Option<f64>,
    stamp: u64,
) -> Result<Report, AppError> {
    // First of all, before any collective whose sequence the job decides.
    crate::agree::agree(t, digest(&r, epochs, a, ctx))?;
    // Every rank must agree on the run directory's name: rank 0's clock decides.
    let mut when = [stamp];
    t.broadcast(&mut when, 0)?;
    let parent_existed;
    let (dir, made) = match a.dir.clone().or_else(|| ctx.run_dir.clone()) {
        Some(d) => {
            let existed = d.exists();
            parent_existed = d.parent().is_none_or(|p| p.as_os_str().is_empty() || p.exists());
            (d, !existed)
        }
        None => {
            let base = PathBuf::from("runs").join(format!(
                "{}-{}-{}",
                r.model_name(),
                r.scheme.to_string().replace(':', ""),
                when[0]
            ));
            parent_existed = base.parent().is_none_or(Path::exists);
            // Runs started within the same second (a seed sweep's) each get their own.
            (agree_fresh_dir(t, &base)?, true)
        }
    };
    // Rank 0 holds the directory's lock for the run's life; the others learn whether it got it.
    let lock = if t.rank() == 0 { Some(crate::run_dir::Lock::take(&dir)) } else { None };
    let mut locked = [u64::from(lock.as_ref().is_none_or(Result::is_ok))];
    t.broadcast(&mut locked, 0)?;
    let result = match lock {
        Some(Err(e)) => Err(AppError::Agreed(Box::new(e))),
        _ if locked[0] == 0 => Err(AppError::Agreed(Box::new(AppError::Usage(format!(
            "{} is in use by another run (rank 0 names it)",
            dir.display()
        ))))),
        lock => {
            let result = rank_in(t, ctx, a, r, epochs, &dir);
            drop(lock);
            result
        }
    };
    if made && result.is_err() && t.rank() == 0 {
        // A run refused or failed before writing anything leaves no directory (only an empty
        // one is removed, once its lock file is).
        let _ = std::fs::remove_file(dir.join(crate::run_dir::LOCK_FILE));
        let _ = std::fs::remove_dir(&dir);
        if !parent_existed {
            let _ = dir.parent().map(std::fs::remove_dir);
        }
    }
    result
}

/// What this rank would run, key by key, for [`crate::agree::agree`]: the resolved configuration
/// (but the compute threads, which a rank may set for its own node), the datasets' identities
/// (not their paths), the run directory and its checkpoints, and how the run is written out.
fn digest(r: &Resolved, epochs: Option<f64>, a: &RunOpts, ctx: &RunContext) -> Result<Digest, AppError> {
    let mut d: Digest = vec![("peregrine version".into(), env!("CARGO_PKG_VERSION").into())];
    let config = serde_json::to_value(r).map_err(|e| AppError::Train(format!("configuration: {e}")))?;
    if let serde_json::Value::Object(keys) = config {
        d.extend(
            keys.into_iter()
                .filter(|(k, _)| !matches!(k.as_str(), "threads" | "data" | "eval"))
                .map(|(k, v)| (k, v.to_string())),
        );
    }
    d.push(("epochs".into(), format!("{epochs:?}")));
    d.push(("data".into(), data_identity(&r.data)?));
    d.push(("eval".into(), r.eval.as_deref().map_or(Ok("none".into()), data_identity)?));
    let dir = a.dir.clone().or_else(|| ctx.run_dir.clone());
    let absolute = dir.as_deref().map(|d| std::path::absolute(d).unwrap_or_else(|_| d.to_owned()));
    d.push((
        "run directory".into(),
        absolute.as_deref().map_or("a new one under runs/".into(), |d| d.display().to_string()),
    ));
    let store = dir.as_deref().map(crate::checkpoint::Store::new);
    for (name, path) in
        store.iter().flat_map(|s| [("checkpoint", s.newest()), ("previous checkpoint", s.previous())])
    {
        d.push((name.into(), file_identity(&path)));
    }
    d.push(("--force".into(), a.force.to_string()));
    d.push(("--trace".into(), a.trace.to_string()));
    d.push(("--npy".into(), r.npy.to_string()));
    Ok(d)
}

/// A dataset's identity in O(1): its size, rows and header checksum (which covers the counts,
/// the section table and the data's checksum).
fn data_identity(path: &Path) -> Result<String, AppError> {
    let ds = peregrine_kernels::data::Dataset::open(path)?;
    Ok(format!("{} bytes, {} rows, header crc {:08x}", ds.bytes(), ds.rows(), ds.header().header_crc))
}

/// A file's identity for [`digest`]: its size and the CRC-32 of its first and last 64 KiB
/// (`none` if it does not exist).
fn file_identity(path: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    const EDGE: u64 = 64 << 10;
    let Ok(mut f) = std::fs::File::open(path) else { return "none".into() };
    let len = f.metadata().map_or(0, |m| m.len());
    let mut crc = crc32fast::Hasher::new();
    let mut buf = Vec::new();
    let head = Read::by_ref(&mut f).take(EDGE).read_to_end(&mut buf);
    if len > EDGE && f.seek(SeekFrom::Start(len.saturating_sub(EDGE).max(EDGE))).is_ok() {
        let _ = f.take(EDGE).read_to_end(&mut buf);
    }
    crc.update(&buf);
    match head {
        Ok(_) => format!("{len} bytes, crc {:08x}", crc.finalize()),
        Err(e) => format!("unreadable ({e})"),
    }
}

fn rank_in(
    t: &Transport,
    ctx: &RunContext,
    a: &RunOpts,
    mut r: Resolved,
    epochs: Option<f64>,
    dir: &Path,
) -> Result<Report, AppError> {
    let scheme = SchemeSpec::new(r.scheme.clone(), r.steal);
    let local = t.backend() == Backend::Local;
    let slot = if local { Slot { index: t.rank(), of: t.world_size() } } else { Slot::WHOLE };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_rank = if local { (cpus / t.world_size()).max(1) } else { cpus };
    if r.threads == 0 {
        r.threads = per_rank;
    }
    let pinning = if a.no_pin { Pinning::Off } else { Pinning::Auto };
    let pool = RankPool::new(r.threads, slot, pinning).map_err(|e| AppError::Train(e.to_string()))?;
    // More ranks on the node than cores (8-32 ranks on a workstation): waits sleep soon instead
    // of yielding, and idle workers park at once. Ranks that fit (each rank's loop alternating
    // with its compute threads) keep the short spin and yield, which their dispatch needs.
    if ranks_on_node(t) > cpus {
        peregrine_core::clocks::set_oversubscribed(true);
        pool.set_spin(Duration::ZERO);
    }
    if local && pool.placement().pinned {
        // Local ranks share the machine's cores: each rank's loop stays on its own first core,
        // so that it competes with its own compute threads, not with another rank's.
        if let Some(&cpu) = pool.placement().cpus.first() {
            peregrine_core::pool::pin_current_thread(cpu);
        }
    }
    let inject = Injection { pattern: r.straggler.parse().map_err(usage)?, seed: r.seed };
    footprint::check(t, &r, ranks_on_node(t))?;
    // Before the models open the training set.
    peregrine_core::model::copy_training_sets_up_to(a.huge_pages.budget(ranks_on_node(t)));
    // Before anything reads them: the rows every rank will read, and the checksum.
    let datasets: Vec<&Path> = std::iter::once(r.data.as_path()).chain(r.eval.as_deref()).collect();
    let checked = crate::faults::check_datasets(t, &datasets, &ctx.preemption.flag())?;
    if let Some(when) = r.standardize {
        let budget = crate::limits::available()
            .map(|(bytes, _)| (bytes as f64 * crate::scaling::COPY_SHARE / ranks_on_node(t) as f64) as u64);
        let measured = crate::scaling::measure(t, &r.data, r.eval.as_deref(), when, budget)?;
        r.off_scale = measured.off_scale.filter(|_| measured.applied.is_none());
        r.scaling = measured.applied;
        if let (Some(s), 0) = (&r.scaling, t.rank()) {
            eprintln!(
                "standardizing the features on the fly ({} centred, {} scaled; --standardize {})",
                s.shift.iter().filter(|&&x| x != 0.0).count(),
                s.mult.iter().filter(|&&x| x != 1.0).count(),
                when.name()
            );
        }
    }
    if r.l2_per_row {
        let rows = peregrine_kernels::data::Dataset::open(&r.data)?.rows();
        r.l2 = 1.0 / rows.max(1) as f32;
        r.l2_per_row = false;
    }
    match r.model {
        ModelKind::Lr => {
            let m = match r.hash_bits {
                Some(b) => LogReg::with_hashing(&r.data, r.eval.as_deref(), r.lr, r.intercept, b),
                None => LogReg::new(&r.data, r.eval.as_deref(), r.lr, r.intercept),
            }
            .and_then(|m| scaled(m.with_l2(r.l2), &r.scaling, LogReg::standardized))
            .map_err(data_err)?;
            train_model(t, ctx, a, &mut r, epochs, scheme, inject, &pool, dir, &m, checked)
        }
        ModelKind::Softmax => {
            let m = Softmax::new(&r.data, r.eval.as_deref(), r.lr)
                .and_then(|m| scaled(m.with_l2(r.l2), &r.scaling, Softmax::standardized))
                .map_err(data_err)?;
            train_model(t, ctx, a, &mut r, epochs, scheme, inject, &pool, dir, &m, checked)
        }
        ModelKind::Mf => {
            let m = Mf::new(&r.data, r.eval.as_deref(), r.k, r.lr, r.l2)
                .map_err(data_err)?
                .with_biases(r.intercept)
                .with_adaptive(matches!(r.optimizer, Optimizer::AdaGrad { .. }))
                .with_strata(r.batch, r.chunk);
            train_model(t, ctx, a, &mut r, epochs, scheme, inject, &pool, dir, &m, checked)
        }
        ModelKind::Mlp => {
            let m = Mlp::new(&r.data, r.eval.as_deref(), &r.hidden, r.lr)
                .and_then(|m| scaled(m.with_l2(r.l2), &r.scaling, Mlp::standardized))
                .map_err(data_err)?;
            let m = if r.split == Split::Units { m.split_units().map_err(data_err)? } else { m };
            train_model(t, ctx, a, &mut r, epochs, scheme, inject, &pool, dir, &m, checked)
        }
        ModelKind::Lda => {
            let m = Lda::new(&r.data, r.eval.as_deref(), r.k, r.alpha, r.eta).map_err(data_err)?;
            train_model(t, ctx, a, &mut r, epochs, scheme, inject, &pool, dir, &m, checked)
        }
        ModelKind::Synthetic => {
            let cost = Duration::from_secs_f64(r.chunk_cost);
            let m = Synthetic::new(&r.data, r.params, cost, r.chunk).map_err(data_err)?;
            train_model(t, ctx, a, &mut r, epochs, scheme, inject, &pool, dir, &m, checked)
        }
    }
}

/// `m` reading its sets through `scaling` (`standardized`, the model's), if there is one.
fn scaled<M>(
    m: M,
    scaling: &Option<Scaling>,
    standardized: impl FnOnce(M, &Scaling) -> peregrine_core::model::Built<M>,
) -> peregrine_core::model::Built<M> {
    match scaling {
        Some(s) => standardized(m, s),
        None => Ok(m),
    }
}

/// `chunk-cost` in a configuration file: a duration as on the command line (`"2ms"`) or a number
/// of seconds (as `config.toml` records it), checked by [`parse_cost`] either way.
fn cost_or_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Cost {
        Text(String),
        Seconds(f64),
    }
    Ok(Some(
        match Cost::deserialize(d).map_err(|_| {
            serde::de::Error::custom("chunk-cost: a duration such as \"2ms\" or a number of seconds")
        })? {
            Cost::Text(s) => s,
            Cost::Seconds(x) => x.to_string(),
        },
    ))
}

/// A chunk's cost as given: a number of seconds, or one followed by `s`, `ms`, `us` or `ns`
/// (`2ms`); more than 0 and at most a minute.
pub(crate) fn parse_cost(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let scale = match unit.trim() {
        "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        _ => return Err(format!("--chunk-cost `{s}`: the unit must be s, ms, us or ns (as in 2ms)")),
    };
    let max = peregrine_core::model::synthetic::MAX_CHUNK_COST;
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * scale <= max.as_secs_f64() => {
            Ok(Duration::from_secs_f64(v * scale))
        }
        _ => Err(format!(
            "--chunk-cost `{s}`: a duration more than 0 and at most {} s, as in 2ms or 0.002",
            max.as_secs()
        )),
    }
}

/// Collective: rank 0 creates `base`, or `base-2`, `base-3`, ... if taken (by an earlier run,
/// or one started at the same time), and every rank gets its name.
pub(crate) fn agree_fresh_dir(t: &Transport, base: &Path) -> Result<PathBuf, AppError> {
    let mut n = [0u64];
    let made = if t.rank() == 0 { fresh_dir(base).map(|k| n[0] = k) } else { Ok(()) };
    let mut ok = [u64::from(made.is_ok())];
    t.broadcast(&mut ok, 0)?;
    made?;
    if ok[0] == 0 {
        return Err(AppError::Elsewhere {
            rank: 0,
            what: format!("creating a directory {}", base.display()),
        });
    }
    t.broadcast(&mut n, 0)?;
    Ok(numbered(base, n[0]))
}

/// Creates `base`, or `base-2`, `base-3`, ... if taken: the number used (1 for `base`).
fn fresh_dir(base: &Path) -> Result<u64, AppError> {
    if let Some(parent) = base.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    for n in 1.. {
        let dir = numbered(base, n);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(AppError::Io { what: format!("creating {}", dir.display()), source: e }),
        }
    }
    unreachable!("a free name is found before the counter wraps")
}

/// `base` for 1, `base-n` after.
fn numbered(base: &Path, n: u64) -> PathBuf {
    if n <= 1 {
        return base.to_owned();
    }
    let mut name = base.as_os_str().to_owned();
    name.push(format!("-{n}"));
    PathBuf::from(name)
}

impl Resolved {
    fn model_name(&self) -> &'static str {
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

impl ModelKind {
    /// Whether the model reads feature values (which `--standardize` scales).
    fn has_features(self) -> bool {
        matches!(self, ModelKind::Lr | ModelKind::Softmax | ModelKind::Mlp)
    }

    /// The name on the command line.
    fn name(self) -> &'static str {
        match self {
            ModelKind::Lr => "lr",
            ModelKind::Softmax => "softmax",
            ModelKind::Mf => "mf",
            ModelKind::Mlp => "mlp",
            ModelKind::Lda => "lda",
            ModelKind::Synthetic => "synthetic",
        }
    }
}

fn data_err(e: peregrine_core::model::ModelError) -> AppError {
    AppError::Data { what: "train".into(), detail: e.to_string() }
}

fn train_err(e: TrainError) -> AppError {
    match e {
        TrainError::Transport(t) => AppError::Transport(t),
        e if e.is_usage() => AppError::Usage(e.to_string()),
        TrainError::Metrics { path, source } => AppError::Io { what: format!("writing {path}"), source },
        e => AppError::Train(e.to_string()),
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> AppError {
    move |source| AppError::Io { what, source }
}

#[allow(clippy::too_many_arguments)]
fn train_model<M: Export>(
    t: &Transport,
    ctx: &RunContext,
    a: &RunOpts,
    r: &mut Resolved,
    epochs: Option<f64>,
    scheme: SchemeSpec,
    inject: Injection,
    pool: &RankPool,
    dir: &Path,
    model: &M,
    data_check_seconds: f64,
) -> Result<Report, AppError> {
    let plan = Plan::new(model.rows(), r.batch, t.world_size(), r.chunk, r.seed).map_err(usage)?;
    if plan.batch() < r.batch {
        // What runs is what config.toml records.
        if t.rank() == 0 {
            eprintln!(
                "warning: --batch {} is more than the {} training rows: every iteration is the whole set",
                r.batch,
                plan.batch()
            );
        }
        r.batch = plan.batch();
    }
    if plan.idle_ranks() > 0 && t.rank() == 0 {
        let (n, chunks) = (t.world_size(), t.world_size() - plan.idle_ranks());
        let fix = if plan.batch() >= n {
            format!("--chunk {} or less gives every rank one", plan.batch() / n)
        } else {
            format!("a --batch of {n} rows or more is needed for every rank to have one")
        };
        eprintln!(
            "warning: --batch {} in chunks of {} rows is {chunks} chunk(s) an iteration for {n} ranks: ranks \
             {chunks} to {} get none of their own and compute only what they take over (under schemes \
             that take chunks over); {fix}",
            plan.batch(),
            plan.chunk(),
            n - 1,
        );
    }
    if let Some(w) = model.warning().filter(|_| t.rank() == 0) {
        eprintln!("warning: {w}");
    }
    if let Some(e) = epochs {
        r.iterations = ((e * plan.iters_per_epoch() as f64).ceil() as u64).max(r.at_least).max(1);
    }
    if r.eval_every == 0 {
        // Every epoch, and at most about ten times when a small set runs many epochs; under early
        // stopping every epoch, which its stop and the best model are as fine as.
        r.eval_every = match r.early_stop {
            Some(_) => plan.iters_per_epoch(),
            None => plan.iters_per_epoch().max(r.iterations.div_ceil(10)),
        };
    }
    // By default every epoch, at most about ten per run, and spaced to cost at most 1 % of the
    // training time.
    let budget = (r.checkpoint_every == u64::MAX).then_some(CHECKPOINT_BUDGET);
    if r.checkpoint_every == u64::MAX {
        r.checkpoint_every = plan.iters_per_epoch().max(r.iterations.div_ceil(10));
    }
    let mut cfg = Config {
        scheme,
        batch: r.batch,
        chunk: r.chunk,
        grain: r.grain,
        iterations: r.iterations,
        target_loss: r.target_loss,
        early_stop: r.early_stop,
        // The best evaluated model is the one to keep when the evaluations are on held-out data.
        keep_best: r.eval.is_some(),
        eval_every: r.eval_every,
        steal_fraction: r.steal_fraction,
        seed: r.seed,
        threads: r.threads,
        inject,
        keep_params: true,
        // MF's adaptive rates live in its rows (the model steps them); the engine applies its
        // updates as they come.
        optimizer: if r.model == ModelKind::Mf { Optimizer::Sgd } else { r.optimizer },
        schedule: Schedule { warmup: r.warmup, decay: r.lr_decay },
        stop_on_stall: r.stop_on_stall,
        checkpoint_every: r.checkpoint_every,
        checkpoint_budget: budget,
        checkpoint_seconds: (r.checkpoint_seconds > 0.0).then_some(r.checkpoint_seconds),
        stop: Some(ctx.preemption.flag()),
        trace: a.trace.then(|| dir.join(TRACE_PARTS)),
        node_combine: r.node_combine == crate::world::NodeCombine::Auto,
        // Off (--watchdog 0), a rank asked to stop still has STOP_GRACE without progress to reach
        // the stop's checkpoint: the signal is never swallowed by a rank that cannot get there.
        watchdog: Some(Watchdog {
            after: if r.watchdog > 0.0 { Duration::from_secs_f64(r.watchdog) } else { Duration::MAX },
            after_stop: Duration::from_secs_f64(if r.watchdog > 0.0 {
                r.watchdog.min(STOP_GRACE)
            } else {
                STOP_GRACE
            }),
            on_hang: std::sync::Arc::new(end_hung_job),
        }),
        ..Config::default()
    };
    // Refused configurations leave no run directory behind.
    peregrine_core::engine::check(&cfg, t.world_size(), model.rows()).map_err(train_err)?;
    peregrine_core::engine::check_model(&cfg, model).map_err(train_err)?;
    let text = r.to_toml().map_err(|e| AppError::Train(format!("config.toml: {e}")))?;
    // Checkpoints record the configuration and what data it ran on (not where it was): a resume
    // elsewhere is refused with the keys that differ.
    let mut identity = toml::Table::new();
    identity.insert("data".into(), data_identity(&r.data)?.into());
    identity.insert("eval".into(), r.eval.as_deref().map_or(Ok("none".into()), data_identity)?.into());
    let mut recorded = toml::Table::new();
    recorded.insert(IDENTITY.into(), identity.into());
    let recorded = format!(
        "{text}\n{}",
        toml::to_string(&recorded).map_err(|e| AppError::Train(format!("checkpoint configuration: {e}")))?
    );
    let store = crate::checkpoint::Store::new(dir);
    cfg.resume = resume_point(t, a, dir, &store, &recorded, model.param_order())?;
    let metrics_dir = dir.join("metrics");
    std::fs::create_dir_all(&metrics_dir).map_err(io(format!("creating {}", metrics_dir.display())))?;
    if t.rank() == 0 {
        write_atomically(&dir.join("config.toml"), text.as_bytes())?;
    }
    meta::write(t, dir, ctx.slurm.as_ref())?;
    let path = metrics_dir.join(format!("rank-{}.jsonl", t.rank()));
    // A resumed run adds to the metrics of the run it resumes; a link there is not followed.
    let file = std::fs::OpenOptions::new()
        .custom_flags(libc::O_NOFOLLOW)
        .create(true)
        .write(true)
        .append(cfg.resume.is_some())
        .truncate(cfg.resume.is_none())
        .open(&path)
        .map_err(io(format!("creating {}", path.display())))?;
    let mut out = BufWriter::new(file);
    let show = t.rank() == 0 && !a.quiet && std::io::stderr().is_terminal();
    let mut bar = Bar { last: None, shown: false };
    let name = path.display().to_string();
    let report = engine::train_checkpointed(
        t,
        model,
        &cfg,
        pool,
        Some((&mut out, &name)),
        &mut |p| {
            if show {
                bar.draw(p, cfg.target_loss);
            }
        },
        &mut |s| {
            store.save(s, &recorded, model.param_order())?;
            // The model as of the checkpoint (the best so far, when kept), for use before the run
            // ends.
            let best = peregrine_core::engine::best_point(&s.evals).filter(|_| !s.best.is_empty());
            let params = if best.is_some() { &s.best } else { &s.weights };
            save_model_params(dir, model, params, r, s.iteration, "checkpoint", None, best)
                .map_err(|e| e.to_string())
        },
    )
    .map_err(|e| match e {
        // Stopped at a checkpoint on a signal: the batch script requeues, the rerun resumes.
        TrainError::Stopped(at) => AppError::Preempted {
            checkpoint: format!(
                "{} (iteration {at}; rerun the same command to resume)",
                store.newest().display()
            ),
        },
        TrainError::Stalled(w) => train_err(TrainError::Stalled(with_scale(&w, r))),
        e @ TrainError::Diverged { .. } => match &r.off_scale {
            Some(why) => AppError::Train(format!("{e}; {}", scale_cause(why))),
            None => train_err(e),
        },
        e => train_err(e),
    })?;
    out.flush().map_err(io(format!("writing {name}")))?;
    if bar.shown {
        eprintln!();
    }
    if a.trace && t.rank() == 0 {
        // Every rank's part is whole: training ended with a barrier after the last was written.
        join_trace(&dir.join(TRACE_PARTS), &dir.join("trace.json"), t.world_size())?;
    }
    if t.rank() == 0 {
        let mut summary = serde_json::to_value(&report).map_err(|e| AppError::Train(e.to_string()))?;
        summary["samples_per_second"] = report.samples_per_second().into();
        summary["placement"] = serde_json::to_value(pool.placement()).unwrap_or_default();
        summary["memory"] = memory();
        let text = serde_json::to_string_pretty(&summary).map_err(|e| AppError::Train(e.to_string()))?;
        write_atomically(&dir.join("summary.json"), text.as_bytes())?;
        save_model(dir, model, &report, r)?;
        if !a.quiet {
            print_summary(&report, dir, data_check_seconds);
            print!("{}", report.stragglers);
        }
        for w in &report.warnings {
            eprintln!("warning: {}", with_scale(w, r));
        }
    }
    Ok(report)
}

/// Warning `w` of a model that does not learn, with the features' scale named as the likely
/// cause when they are far from unit scale and were left so (`--standardize off`).
fn with_scale(w: &str, r: &Resolved) -> String {
    match &r.off_scale {
        Some(why) => format!("{w}; but first, the likely cause: {}", scale_cause(why)),
        None => w.to_owned(),
    }
}

/// The features' scale as a cause, `why` saying how far it is from unit scale.
fn scale_cause(why: &str) -> String {
    format!(
        "the features are far from unit scale ({why}), and --standardize off left them so: \
         drop --standardize off (auto standardizes such data) or run `peregrine data standardize`"
    )
}

/// Where the ranks write their parts of the trace (joined into `trace.json` at the end).
const TRACE_PARTS: &str = "trace-parts";

/// Joins the ranks' trace parts (one event per line) into one Chrome Trace Event file, then
/// removes them. Streams: memory holds one line at a time.
fn join_trace(parts: &Path, out: &Path, world: usize) -> Result<(), AppError> {
    use std::io::BufRead;
    let file = crate::output::AtomicFile::create(out)?;
    let tmp = file.temp_path().to_owned();
    let mut w = BufWriter::new(file);
    let werr = |e| AppError::Io { what: format!("writing {}", tmp.display()), source: e };
    w.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n").map_err(werr)?;
    let mut first = true;
    for r in 0..world {
        let part = parts.join(format!("rank-{r}.jsonl"));
        let f = std::fs::File::open(&part).map_err(io(format!("reading {}", part.display())))?;
        for line in std::io::BufReader::new(f).lines() {
            let line = line.map_err(io(format!("reading {}", part.display())))?;
            if !first {
                w.write_all(b",\n").map_err(werr)?;
            }
            w.write_all(line.as_bytes()).map_err(werr)?;
            first = false;
        }
    }
    w.write_all(b"\n]}\n").map_err(werr)?;
    w.into_inner().map_err(|e| werr(e.into_error()))?.commit()?;
    std::fs::remove_dir_all(parts).map_err(io(format!("removing {}", parts.display())))
}

/// The watchdog's end of a job whose rank stopped progressing: the message, then the process
/// ends at once with [`EXIT_HUNG`], or [`EXIT_REQUEUE`] when it had been asked to stop (by Slurm
/// before a time limit or a preemption: a batch script requeues the job, which resumes from the
/// last checkpoint). Threads stuck in a call cannot be unwound; the launcher ends the other
/// ranks. The checkpoints on disk are whole: they are written aside and renamed.
fn end_hung_job(message: &str, stopping: bool) {
    // Local ranks share the process: their watchdogs fire together. The first waits a moment
    // for the others and speaks for them all, preferring a rank that found itself stuck (a
    // waiting rank's guess is as good as its last look at the others' words).
    static HEARD: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let first = {
        let mut heard = HEARD.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        heard.push(message.to_owned());
        heard.len() == 1
    };
    if !first {
        return;
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let heard = HEARD.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let message = heard.iter().find(|m| m.contains("itself looks stuck")).unwrap_or(&heard[0]);
    let code = if stopping {
        crate::say(format_args!(
            "error: {message}: the stop's checkpoint cannot be reached; the last checkpoint \
             stands (exit {EXIT_REQUEUE}: rerun, or let the batch script requeue, to resume from it)"
        ));
        EXIT_REQUEUE
    } else {
        crate::say(format_args!(
            "error: {message}; rerun the same command to resume from the last checkpoint"
        ));
        EXIT_HUNG
    };
    // SAFETY: `_exit` ends the process without running exit handlers, which could block on
    // the locks of threads stuck in MPI calls; nothing is half-written by skipping them (the
    // files that matter are renamed into place whole).
    unsafe { libc::_exit(code) }
}

/// The exit code of a job the watchdog ended (as `timeout(1)`'s).
pub const EXIT_HUNG: i32 = 124;

/// Writes the trained model into the run directory (rank 0): the best evaluated one, when kept.
fn save_model<M: Export>(dir: &Path, model: &M, report: &Report, r: &Resolved) -> Result<(), AppError> {
    let best = report.best.zip(report.best_params.as_deref());
    let Some(params) = best.map(|b| b.1).or(report.params.as_deref()) else { return Ok(()) };
    save_model_params(dir, model, params, r, report.iterations, "end", Some(report), best.map(|b| b.0))
}

/// Writes `params` of `model` as the run directory's model.safetensors (rank 0), written at
/// iteration `iteration` (`when`: at the `end` or at a `checkpoint`); `best`: the evaluation of
/// the best model, when `params` are its (its iteration and figures go in the metadata).
#[allow(clippy::too_many_arguments)]
fn save_model_params<M: Export>(
    dir: &Path,
    model: &M,
    params: &[f32],
    r: &Resolved,
    iteration: u64,
    when: &str,
    report: Option<&Report>,
    best: Option<EvalPoint>,
) -> Result<(), AppError> {
    let train = peregrine_kernels::data::Dataset::open(&r.data)?;
    let mut meta = std::collections::HashMap::new();
    meta.insert("model".to_owned(), r.model.name().to_owned());
    meta.insert("scheme".into(), r.scheme.to_string());
    meta.insert("optimizer".into(), r.optimizer.to_string());
    meta.insert("iterations".into(), iteration.to_string());
    meta.insert("written_at".into(), when.to_owned());
    let data = std::fs::canonicalize(&r.data).unwrap_or_else(|_| r.data.clone());
    meta.insert("train_data".into(), data.display().to_string());
    if r.model == ModelKind::Mlp {
        meta.insert("hidden".into(), r.hidden.iter().map(ToString::to_string).collect::<Vec<_>>().join(","));
    }
    if let Some(b) = r.hash_bits {
        meta.insert("hash_bits".into(), b.to_string());
    }
    if r.model == ModelKind::Lda {
        meta.insert("alpha".into(), r.alpha.to_string());
        meta.insert("eta".into(), r.eta.to_string());
    }
    if let Some(report) = report {
        meta.insert("ranks".into(), report.ranks.to_string());
        if let Some(e) = best.or(report.last_eval()) {
            meta.insert("eval_loss".into(), e.loss.to_string());
            meta.insert(format!("eval_{}", report.metric), e.metric.to_string());
        }
        if let Some(i) = report.stopped_early {
            meta.insert("stopped_early_at".into(), i.to_string());
        }
    }
    if let Some(b) = best {
        meta.insert("best_iteration".into(), b.iter.to_string());
        meta.entry("eval_loss".into()).or_insert_with(|| b.loss.to_string());
    }
    // A scaling applied on the fly is recorded as the file's would be; `predict` applies it to
    // raw data (`standardized = on-the-fly`).
    let on_the_fly = r.scaling.as_ref().map(|s| (s.shift.as_slice(), s.mult.as_slice()));
    if on_the_fly.is_some() {
        meta.insert(crate::model_file::STANDARDIZED.into(), crate::model_file::ON_THE_FLY.into());
    }
    let scaling = on_the_fly.or(train.scaling());
    if r.npy {
        crate::model_file::save_npy(&dir.join("model"), model, params, &meta, scaling)?;
    }
    crate::model_file::save(&dir.join(crate::model_file::FILE_NAME), model, params, meta, scaling)
}

/// Where this run starts (collective): `None` for the initial model, or the run directory's
/// checkpoint. Rank 0 decides (a finished run, or a checkpoint of another configuration or
/// whose parameters are in another `order` than the model's, is refused unless `--force`,
/// which clears them) and tells the others, which then read the same checkpoint.
fn resume_point(
    t: &Transport,
    a: &RunOpts,
    dir: &Path,
    store: &crate::checkpoint::Store,
    config: &str,
    order: &str,
) -> Result<Option<std::sync::Arc<peregrine_core::engine::Snapshot>>, AppError> {
    // 0: from the start; 1: resume; 2: refused (rank 0 says why).
    let mut decision = [0u64];
    let mut refusal = None;
    // Rank 0's reading of the checkpoint, kept for its resume (the others read it themselves).
    let mut mine = None;
    if t.rank() == 0 {
        let summary = dir.join("summary.json");
        let loaded = store.load();
        let refuse = |why: String| {
            AppError::Usage(format!("{why}; give another --run-dir, or --force to start again there"))
        };
        let differences = |l: &crate::checkpoint::Loaded| config_differences(&l.config, config);
        refusal = match (&loaded, summary.exists()) {
            _ if a.force => None,
            (_, true) => {
                Some(refuse(format!("{} holds a finished run ({})", dir.display(), summary.display())))
            }
            (Ok(Some(l)), _) if !differences(l).is_empty() => Some(refuse(format!(
                "{} holds a checkpoint of another configuration: {}",
                dir.display(),
                differences(l).join("; ")
            ))),
            (Ok(Some(l)), _) if l.order != order => {
                let named =
                    |o: &str| if o.is_empty() { "each block as named".to_owned() } else { format!("`{o}`") };
                Some(refuse(format!(
                    "{}: its parameters are ordered {}, this version of Peregrine orders the model's {} \
                     (a checkpoint of another version: resume it with that version)",
                    l.path.display(),
                    named(&l.order),
                    named(order)
                )))
            }
            (Err(e), _) => Some(refuse(format!("no usable checkpoint: {e}"))),
            _ => None,
        };
        let fresh = a.force || matches!(loaded, Ok(None));
        if fresh && refusal.is_none() {
            // What an earlier run wrote goes (with --force, or where it stopped before its first
            // checkpoint: its metrics, of more ranks perhaps, would stay beside this run's). A
            // failure here is decided like a refusal, so that no rank waits for rank 0.
            if let Err(e) = crate::run_dir::clear(dir) {
                refusal = Some(e);
            }
        }
        decision[0] = match (&refusal, loaded) {
            (Some(_), _) => 2,
            (None, Ok(Some(l))) if !a.force => {
                mine = Some(l);
                1
            }
            _ => 0,
        };
        if let Some(l) = &mine {
            // Decided here, like a refusal, so that no rank waits for rank 0.
            if let Err(e) = trim_metrics(&dir.join("metrics"), l.snapshot.iteration) {
                (refusal, decision[0]) = (Some(e), 2);
            }
        }
    }
    t.broadcast(&mut decision, 0)?;
    match decision[0] {
        2 => Err(refusal
            .unwrap_or_else(|| AppError::Usage("rank 0 refused to start in this run directory".into()))),
        1 => {
            let l = match mine {
                Some(l) => l,
                None => store
                    .load()
                    .map_err(|e| AppError::Data { what: dir.display().to_string(), detail: e })?
                    .ok_or_else(|| AppError::Data {
                        what: dir.display().to_string(),
                        detail: "the checkpoint vanished".into(),
                    })?,
            };
            if t.rank() == 0 {
                if let Some(f) = &l.fallback {
                    eprintln!("warning: {f}; using the previous checkpoint");
                }
                eprintln!(
                    "resuming from iteration {} ({}, {} evaluations so far)",
                    l.snapshot.iteration,
                    l.path.display(),
                    l.snapshot.evals.len()
                );
            }
            Ok(Some(std::sync::Arc::new(l.snapshot)))
        }
        _ => Ok(None),
    }
}

/// The table under which a checkpoint's configuration records the datasets' identities.
const IDENTITY: &str = "identity";

/// Keys a run may change between its parts: how it is carried out, not what it computes.
const OPERATIONAL: [&str; 5] =
    ["threads", "checkpoint-every", "checkpoint-seconds", "watchdog", "node-combine"];

/// How the configuration a checkpoint was taken under (`then`, with its datasets' identities)
/// differs from this run's (`now`) in what it computes, key by key, in words. The datasets are
/// compared by identity, not path (a checkpoint without identities, of an earlier version, by
/// path).
fn config_differences(then: &str, now: &str) -> Vec<String> {
    let (Ok(mut then), Ok(mut now)) = (then.parse::<toml::Table>(), now.parse::<toml::Table>()) else {
        return vec!["its configuration cannot be read".into()];
    };
    let mut out = Vec::new();
    let ids = (then.remove(IDENTITY), now.remove(IDENTITY));
    if let (Some(toml::Value::Table(a)), Some(toml::Value::Table(b))) = &ids {
        for key in ["data", "eval"] {
            then.remove(key);
            now.remove(key);
            if a.get(key) != b.get(key) {
                let id =
                    |t: &toml::Table| t.get(key).and_then(toml::Value::as_str).unwrap_or("none").to_owned();
                out.push(format!("`{key}` is another dataset (then {}; now {})", id(a), id(b)));
            }
        }
    }
    let keys: std::collections::BTreeSet<&String> = then.keys().chain(now.keys()).collect();
    for k in keys.into_iter().filter(|k| !OPERATIONAL.contains(&k.as_str())) {
        if then.get(k) != now.get(k) {
            let show = |v: Option<&toml::Value>| v.map_or("unset".to_owned(), ToString::to_string);
            out.push(format!("`{k}` was {}, is {} now", show(then.get(k)), show(now.get(k))));
        }
    }
    out
}

/// Drops from every rank's metrics the iterations at or after `iteration` (run again by the
/// resumed run, which appends its own) and a last line cut short by a killed process. Each file
/// is rewritten aside and renamed.
fn trim_metrics(dir: &Path, iteration: u64) -> Result<(), AppError> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
        let keep: String = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .and_then(|v| v.get("iter").and_then(serde_json::Value::as_u64))
                    .is_some_and(|i| i < iteration)
            })
            .collect();
        if keep.len() != text.len() {
            write_atomically(&path, keep.as_bytes())?;
        }
    }
    Ok(())
}

/// Rank 0's process memory (Linux): resident anonymous memory (heap: model, buffers), resident
/// file-backed memory (mapped dataset pages touched), and the peak resident size, in KiB. Under
/// the local backend the process holds every rank.
fn memory() -> serde_json::Value {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    serde_json::json!({
        "rss_anon_kib": field("RssAnon:"),
        "rss_file_kib": field("RssFile:"),
        "peak_rss_kib": field("VmHWM:"),
    })
}

/// A one-line progress display on standard error.
struct Bar {
    last: Option<Instant>,
    shown: bool,
}

impl Bar {
    fn draw(&mut self, p: &Progress, target: Option<f64>) {
        let now = Instant::now();
        if p.iter != p.iterations
            && self.last.is_some_and(|l| now - l < std::time::Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(now);
        self.shown = true;
        let frac = p.iter as f64 / p.iterations.max(1) as f64;
        let filled = (frac * 20.0).round() as usize;
        let rate = p.samples as f64 / p.seconds.max(1e-9);
        let eta = p.seconds / frac.max(1e-9) - p.seconds;
        let eval = p.eval.map(|e| format!("  eval {:.4}", e.loss)).unwrap_or_default();
        let goal = target.map(|g| format!(" (target {g})")).unwrap_or_default();
        eprint!(
            "\r[{}{}] {}/{}  loss {:.4}{eval}{goal}  {}  ETA {:.0}s   ",
            "#".repeat(filled),
            ".".repeat(20 - filled),
            p.iter,
            p.iterations,
            p.batch_loss,
            rate_text(rate),
            eta.max(0.0)
        );
        let _ = std::io::stderr().flush();
    }
}

fn rate_text(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2}M samples/s", r / 1e6)
    } else {
        format!("{:.0}k samples/s", r / 1e3)
    }
}

fn print_summary(r: &Report, dir: &Path, data_check_seconds: f64) {
    println!(
        "{} | {} | {} rank{} | {} iterations | {} samples in {:.3} s ({}; evaluation {:.3} s, data check \
         {:.3} s, not counted)",
        r.model,
        r.scheme,
        r.ranks,
        if r.ranks == 1 { "" } else { "s" },
        r.iterations,
        r.samples,
        r.train_seconds,
        rate_text(r.samples_per_second()),
        r.eval_seconds,
        data_check_seconds
    );
    if let Some(e) = r.last_eval() {
        let train = e.train_loss.map(|l| format!("; training loss {l:.4} since the previous evaluation"));
        println!(
            "final evaluation: loss {:.4}, {} {:.4}{}",
            e.loss,
            r.metric,
            e.metric,
            train.unwrap_or_default()
        );
    }
    match (r.target_loss, r.time_to_target) {
        (Some(g), Some(s)) => println!("reached loss <= {g} after {s:.3} s"),
        (Some(g), None) => println!("did not reach loss <= {g}"),
        _ => {}
    }
    if let Some(nodes) = &r.node_combined {
        println!(
            "node-combined pulls and pushes: {} nodes, ranks per node {} (one copy of the weights and one update per node)",
            nodes.len(),
            peregrine_slurm::format_tasks_per_node(&nodes.iter().map(|&n| n as u32).collect::<Vec<_>>())
        );
    }
    if let (Some(n), Some(at)) = (r.early_stop, r.stopped_early) {
        println!("early stopping: no improvement in {n} evaluations, stopped after the evaluation at iteration {at}");
    }
    if let (Some(b), Some(_)) = (r.best, &r.best_params) {
        println!(
            "model.safetensors: the best evaluated model, iteration {} (loss {:.4}, {} {:.4})",
            b.iter, b.loss, r.metric, b.metric
        );
    }
    println!(
        "{:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>12}",
        "rank", "compute s", "comm s", "wait s", "own", "taken", "rows"
    );
    for (i, t) in r.per_rank.iter().enumerate() {
        println!(
            "{i:>5} {:>10.3} {:>10.3} {:>10.3} {:>8} {:>8} {:>12}",
            t.compute, t.comm, t.wait, t.own, t.taken, t.rows
        );
    }
    println!("run directory: {}", dir.display());
}
