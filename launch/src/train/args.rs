//! `peregrine train`'s flags and configuration file: the clap [`TrainArgs`], the TOML
//! [`TrainFile`] (every key optional; files overlaid, flags on top), the values of the flags
//! (models, `--split`, `--huge-pages`, `--chunk-cost`), and how a run reports and where it
//! writes ([`RunOpts`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use peregrine_core::optim::{Decay, Optimizer};
use peregrine_core::{Scheme, SchemeSpec};
use serde::{Deserialize, Serialize};

use crate::error::AppError;
use crate::world::WorldArgs;

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

impl ModelKind {
    /// Whether the model reads feature values (which `--standardize` scales).
    pub(super) fn has_features(self) -> bool {
        matches!(self, ModelKind::Lr | ModelKind::Softmax | ModelKind::Mlp)
    }

    /// The name on the command line.
    pub(super) fn name(self) -> &'static str {
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
    pub(super) world: WorldArgs,
    /// TOML configuration file.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub(super) config: Option<PathBuf>,
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
    /// libmf's schedule) [default: lr adagrad on sparse data whose features are mostly absent
    /// (one-hot, bags of ids, hashed), else sgd; softmax adam, mlp momentum, mf adagrad]. The
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
    pub(super) trace: bool,
    /// Where ranks share nodes (several nodes, some holding several ranks: the launcher's
    /// placement, or `--ranks-per-node` locally), a synchronous scheme (bsp, lb-bsp, with or
    /// without taking over) on a dense model gives each node one copy of the weights that its
    /// ranks read in place, and adds the node's updates up before they cross the network: a rank
    /// moves 1/K of the model to and from other nodes per iteration (K ranks a node) in one
    /// operation per node, instead of all of it in one per rank. The same model up to rounding;
    /// `off` keeps every rank's own pulls and pushes [default: auto]
    #[arg(long, value_name = "auto|off")]
    node_combine: Option<peregrine_core::engine::NodeCombine>,
    /// Also write the model as NumPy files, `model/<tensor>.npy` (f32, one per tensor of
    /// model.safetensors) with `model/meta.json`, in the run directory, at the end and at each
    /// checkpoint.
    #[arg(long)]
    pub(super) npy: bool,
    /// Start again in a run directory that holds a finished run or another run's checkpoint
    /// (its checkpoints, metrics and summary are replaced).
    #[arg(long)]
    pub(super) force: bool,
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
    pub(super) no_pin: bool,
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
    pub(super) huge_pages: HugePages,
    /// No progress bar and no summary table.
    #[arg(long, short = 'q')]
    pub(super) quiet: bool,
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
    pub(super) fn budget(self, ranks_here: usize) -> u64 {
        match self {
            Self::Off => 0,
            Self::On => u64::MAX,
            Self::Auto if !peregrine_kernels::data::huge_pages_enabled() => 0,
            Self::Auto => crate::limits::mem_available().map_or(0, |m| m / 4 / ranks_here.max(1) as u64),
        }
    }
}

/// The configuration file: every key optional, unknown keys are errors.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct TrainFile {
    pub(super) model: Option<ModelKind>,
    pub(super) data: Option<PathBuf>,
    pub(super) eval: Option<PathBuf>,
    pub(crate) scheme: Option<Scheme>,
    pub(super) lr: Option<f32>,
    pub(super) lr_decay: Option<Decay>,
    pub(super) warmup: Option<u64>,
    pub(super) optimizer: Option<Optimizer>,
    pub(super) l1: Option<f32>,
    pub(super) batch: Option<usize>,
    pub(super) chunk: Option<usize>,
    pub(super) grain: Option<u32>,
    pub(super) epochs: Option<f64>,
    pub(super) iterations: Option<u64>,
    pub(crate) target_loss: Option<f64>,
    pub(super) early_stop: Option<u64>,
    pub(super) eval_every: Option<u64>,
    pub(super) checkpoint_every: Option<u64>,
    pub(super) checkpoint_seconds: Option<f64>,
    pub(super) watchdog: Option<f64>,
    pub(super) threads: Option<usize>,
    pub(super) steal: Option<bool>,
    pub(super) steal_fraction: Option<f64>,
    pub(crate) seed: Option<u64>,
    pub(super) stop_on_stall: Option<bool>,
    pub(super) intercept: Option<bool>,
    pub(super) k: Option<usize>,
    pub(super) hash_bits: Option<u32>,
    pub(super) alpha: Option<f64>,
    pub(super) eta: Option<f64>,
    pub(super) l2: Option<f32>,
    pub(super) hidden: Option<Vec<usize>>,
    /// `"2ms"` or a number of seconds (what `config.toml` records).
    #[serde(default, deserialize_with = "cost_or_seconds")]
    pub(super) chunk_cost: Option<String>,
    pub(super) params: Option<usize>,
    pub(super) split: Option<Split>,
    pub(crate) straggler: Option<String>,
    pub(super) standardize: Option<crate::scaling::Standardize>,
    pub(super) node_combine: Option<peregrine_core::engine::NodeCombine>,
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

impl TrainArgs {
    /// The flags given, as a configuration file.
    pub(super) fn as_file(&self) -> TrainFile {
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

pub(super) fn read_file(path: &Path) -> Result<TrainFile, AppError> {
    let f: TrainFile = read_toml(path)?;
    Ok(f.rebase(path.parent().unwrap_or(Path::new("."))))
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
