//! What a training run will hold in memory, estimated from its flags and the datasets' headers
//! before anything is allocated, and a refusal that names the sizes driving it when that is
//! more than the machine has.
//!
//! The estimate counts the buffers of the size of the model that the engine keeps: per rank a
//! replica of the parameters, the iteration's update and the evaluation's copy, and its shard of
//! the window with the optimizer's state (the whole model and state on every rank under a
//! replicated scheme); per compute thread the model's buffers (a gradient of the whole vector;
//! matrix factorization and LDA a copy of the parameters and the change they make) and, for the
//! models that pull only the keys their rows read, the buffer of chunks taken over; and on rank
//! 0 at a checkpoint the snapshot, its encoding and the model file, and with an evaluation set
//! the best evaluated model's weights (kept, and in the checkpoint's encoding). Measured against max RSS
//! (logistic regression of 10^7 weights, softmax of 5 * 10^6, 1 to 4 ranks and threads) it is
//! within 15 %, over more often than under.

use std::path::Path;

use peregrine_kernels::data::format::Header;
use peregrine_kernels::data::{Dataset, Kind};
use peregrine_transport::{ReduceOp, Transport};

use super::args::ModelKind;
use super::resolve::Resolved;
use crate::error::AppError;
use crate::limits::{available, size};

/// Bytes of one parameter (f32).
const PARAM: u128 = 4;

/// Most keys a model may have: a key is a 32-bit index.
const MAX_KEYS: u128 = 1 << 32;

/// What the model's parameters are, and what drives their number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Model {
    /// Parameters (f32).
    pub(super) params: u128,
    /// Keys (rows of parameters read and written together: one per weight of a sparse model,
    /// one per user, item, word or document).
    pub(super) keys: u128,
    /// The flags and header fields that set the number, in words.
    pub(super) drivers: String,
    /// What would make it smaller.
    pub(super) fix: String,
    /// Bytes a compute thread holds besides its copies of the parameters: the MLP's activations
    /// and their gradients for a run of chunks (`--chunk` times `--grain` rows).
    pub(super) activations: u128,
}

/// How the run is laid out on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Placement {
    /// Ranks in the world.
    pub(super) world: usize,
    /// Ranks on this node (every rank on the local backend).
    pub(super) here: usize,
    /// Compute threads per rank.
    pub(super) threads: usize,
}

/// A dataset's kind and header.
pub(super) type Set = (Kind, Header);

/// The model that `r` trains on the datasets `train` and `eval`, or `None` when the data is not
/// of the model's kind (the model's constructor reports that).
pub(super) fn model(r: &Resolved, train: &Set, eval: Option<&Set>) -> Option<Model> {
    let kind = match r.model {
        ModelKind::Lr | ModelKind::Lda => Kind::Sparse,
        ModelKind::Softmax | ModelKind::Mlp => Kind::Dense,
        ModelKind::Mf => Kind::Ratings,
        ModelKind::Synthetic => return Some(synthetic(r.params)),
    };
    if train.0 != kind || eval.is_some_and(|e| e.0 != kind) {
        return None;
    }
    let (train, eval) = (&train.1, eval.map(|e| &e.1));
    let (cols, classes) = (u128::from(train.cols), u128::from(train.classes));
    let data = r.data.display();
    Some(match r.model {
        ModelKind::Lr => {
            let intercept = u128::from(r.intercept);
            match r.hash_bits {
                Some(b) => Model {
                    params: (1 << b) + intercept,
                    keys: (1 << b) + intercept,
                    drivers: format!("--hash-bits {b}: a logistic regression of 2^{b} weights"),
                    fix: "fewer --hash-bits".into(),
                    activations: 0,
                },
                None => Model {
                    params: cols + intercept,
                    keys: cols + intercept,
                    drivers: format!(
                        "{data} declares {cols} features (header field `cols`, the largest feature id), a \
                         weight each for logistic regression"
                    ),
                    fix: HASH_FIX.into(),
                    activations: 0,
                },
            }
        }
        ModelKind::Softmax => Model {
            params: classes * (cols + 1),
            keys: 1,
            drivers: format!(
                "{data} declares {cols} features and {classes} classes (header fields `cols`, `classes`), a \
                 weight each pair for softmax regression"
            ),
            fix: "data with fewer features or classes (a label column of few distinct values)".into(),
            activations: 0,
        },
        ModelKind::Mlp => {
            let dims: Vec<u128> =
                std::iter::once(cols).chain(r.hidden.iter().map(|&h| h as u128)).chain([classes]).collect();
            let params = dims.windows(2).fold(0u128, |p, l| p.saturating_add(l[1].saturating_mul(l[0] + 1)));
            let shape: Vec<String> = dims.iter().map(ToString::to_string).collect();
            let hidden: Vec<String> = r.hidden.iter().map(ToString::to_string).collect();
            let units = dims[1..].iter().fold(0u128, |s, &d| s.saturating_add(d));
            let rows = (r.chunk as u128).saturating_mul(u128::from(r.grain.max(1)));
            Model {
                params,
                keys: 1,
                activations: rows.saturating_mul(units).saturating_mul(2 * PARAM),
                drivers: format!(
                    "--hidden {}: an MLP {} (the features and classes of {data})",
                    hidden.join(","),
                    shape.join("-")
                ),
                fix: "fewer or narrower hidden layers (--hidden)".into(),
            }
        }
        ModelKind::Mf => {
            let users = u128::from(eval.map_or(train.users, |e| e.users.max(train.users)));
            let items = u128::from(eval.map_or(train.cols, |e| e.cols.max(train.cols)));
            let adaptive = matches!(r.optimizer, peregrine_core::optim::Optimizer::AdaGrad { .. });
            let width = (r.k as u128)
                + u128::from(r.intercept)
                + (peregrine_core::model::mf::ROW_STATE as u128) * u128::from(adaptive);
            Model {
                params: (users + items).saturating_mul(width),
                keys: users + items,
                drivers: format!(
                    "--k {}: matrix factorization of {users} users and {items} items (header fields `users`, \
                     `cols` of {data}), {width} values a row",
                    r.k
                ),
                fix: "a smaller --k".into(),
                activations: 0,
            }
        }
        ModelKind::Lda => {
            // Keys: a row per word, the topics' totals, a row per document, and each token's
            // topic (at least the stored counts' worth, each count 1 or more).
            let (k, docs) = (r.k as u128, u128::from(train.rows));
            let keys = cols + 1 + docs + u128::from(train.nnz).div_ceil(k.max(1));
            Model {
                params: keys.saturating_mul(k),
                keys,
                drivers: format!(
                    "--k {}: LDA of {} topics over {cols} words and {docs} documents (header fields `cols`, \
                     `rows` of {data})",
                    r.k, r.k
                ),
                fix: "fewer topics (--k)".into(),
                activations: 0,
            }
        }
        ModelKind::Synthetic => synthetic(r.params),
    })
}

fn synthetic(params: usize) -> Model {
    Model {
        params: params as u128,
        keys: 1,
        drivers: format!("--params {params}"),
        fix: "fewer --params".into(),
        activations: 0,
    }
}

/// Bytes the run holds on this node at its peak (see the module's documentation).
pub(super) fn bytes(r: &Resolved, m: &Model, at: Placement) -> u128 {
    let p = m.params.saturating_mul(PARAM);
    let slots = if r.model == ModelKind::Mf { 0 } else { r.optimizer.slots() as u128 };
    let window = if r.scheme.replicated() {
        p.saturating_mul(1 + slots)
    } else {
        p.saturating_mul(1 + slots) / at.world.max(1) as u128
    };
    let sparse = matches!(r.model, ModelKind::Lr | ModelKind::Mf | ModelKind::Lda);
    let copies: u128 = if matches!(r.model, ModelKind::Mf | ModelKind::Lda) { 2 } else { 1 };
    let thread = p.saturating_mul(copies + u128::from(sparse)).saturating_add(m.activations);
    let rank =
        p.saturating_mul(3).saturating_add(window).saturating_add(thread.saturating_mul(at.threads as u128));
    let best = if r.eval.is_some() { 2 } else { 0 };
    let checkpoint = p.saturating_mul(4 + 2 * slots + best);
    rank.saturating_mul(at.here as u128).saturating_add(checkpoint)
}

/// Why `r` cannot run on this node, if it cannot: more keys than a 32-bit index numbers, or
/// more memory than `available` bytes.
pub(super) fn refusal(
    r: &Resolved,
    m: &Model,
    at: Placement,
    available: Option<(u64, &str)>,
) -> Option<String> {
    let params = format!("{} parameters ({} of f32)", m.params, size(m.params.saturating_mul(PARAM)));
    if m.keys > MAX_KEYS {
        return Some(format!(
            "{}: {params} in {} keys, more than the 2^32 a key's 32-bit index numbers; {}",
            m.drivers, m.keys, m.fix
        ));
    }
    let (avail, source) = available?;
    let need = bytes(r, m, at);
    if need <= u128::from(avail) {
        return None;
    }
    let threads = if at.threads == 1 { "1 thread".to_owned() } else { format!("{} threads", at.threads) };
    let ranks = if at.here == 1 { "1 rank".to_owned() } else { format!("{} ranks", at.here) };
    let state = match r.optimizer.slots() {
        0 => String::new(),
        _ if r.model == ModelKind::Mf => String::new(),
        n => format!(" and {}'s state ({n} value(s) a parameter)", r.optimizer.name()),
    };
    let fewer = if at.here * at.threads > 1 { ", or fewer ranks or threads on this node" } else { "" };
    let fix = match (m.fix == HASH_FIX).then(|| hash_bits_that_fit(r, at, avail)).flatten() {
        Some(b) => format!("hashed features, whose number is chosen: --hash-bits {b} (2^{b} weights) fits"),
        None => m.fix.clone(),
    };
    let acts = m.activations.saturating_mul((at.threads * at.here) as u128);
    let (drivers, fix) = if acts >= need / 2 {
        let what = format!(
            "--chunk {} and --grain {}: a compute thread's activations for {} rows of the MLP ({} of them), with {}",
            r.chunk,
            r.grain,
            (r.chunk as u128).saturating_mul(u128::from(r.grain.max(1))),
            size(m.activations),
            m.drivers
        );
        (what, "a smaller --chunk or --grain".to_owned())
    } else {
        (m.drivers.clone(), fix)
    };
    Some(format!(
        "{drivers}: {params}. With {ranks} of {threads} on this node{state}, training needs about {} of memory \
         and this machine has {} available ({source}): use {fix}{fewer}",
        size(need),
        size(u128::from(avail))
    ))
}

/// What refusing a logistic regression of a weight per feature suggests.
const HASH_FIX: &str = "hashed features (--hash-bits), whose number is chosen";

/// The most hash bits, up to 24, whose logistic regression fits `avail` bytes.
fn hash_bits_that_fit(r: &Resolved, at: Placement, avail: u64) -> Option<u32> {
    (1..=24u32).rev().find(|&b| {
        let keys = (1u128 << b) + u128::from(r.intercept);
        let m = Model { params: keys, keys, drivers: String::new(), fix: String::new(), activations: 0 };
        bytes(r, &m, at) <= u128::from(avail)
    })
}

/// Collective: refuses `r` (exit 2, on every rank) unless its model fits the memory of every
/// rank's node, from the datasets' headers (O(1)), before anything of its size is allocated.
/// `here`: ranks on this node; `r.threads` is set.
pub(super) fn check(t: &Transport, r: &Resolved, here: usize) -> Result<(), AppError> {
    let set = |p: &Path| Dataset::open(p).map(|d| (d.kind(), *d.header()));
    let train = set(&r.data)?;
    let eval = r.eval.as_deref().map(set).transpose()?;
    let at = Placement { world: t.world_size(), here, threads: r.threads.max(1) };
    let why = model(r, &train, eval.as_ref()).and_then(|m| refusal(r, &m, at, available()));
    // The nodes may differ: every rank learns of the first refusal.
    let mut first = [why.as_ref().map_or(u64::MAX, |_| t.rank() as u64)];
    t.allreduce(&mut first, ReduceOp::Min)?;
    match (why, first[0]) {
        (_, u64::MAX) => Ok(()),
        (Some(why), _) => Err(AppError::Agreed(Box::new(AppError::Usage(why)))),
        (None, rank) => Err(AppError::Elsewhere {
            rank: rank as usize,
            what: format!("rank {rank}: the model does not fit the memory of its node"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::{finish, TrainFile};

    /// The configuration of `model` with the keys `f` sets.
    fn resolved(model: ModelKind, f: impl FnOnce(&mut TrainFile)) -> Resolved {
        let mut file = TrainFile { model: Some(model), data: Some("d.pgd".into()), ..TrainFile::default() };
        f(&mut file);
        finish(file).expect("a valid configuration").0
    }

    /// A header of `kind` with `rows`, `cols` (features or items), `classes`, `users`, `nnz`.
    fn set(kind: Kind, rows: u64, cols: u64, classes: u32, users: u64, nnz: u64) -> Set {
        let mut h: Header = bytemuck::Zeroable::zeroed();
        (h.rows, h.cols, h.classes, h.users, h.nnz) = (rows, cols, classes, users, nnz);
        (kind, h)
    }

    const ONE: Placement = Placement { world: 1, here: 1, threads: 1 };

    #[test]
    fn each_model_counts_its_parameters_from_the_flags_and_the_header() {
        let dense = set(Kind::Dense, 10, 784, 10, 0, 7840);
        let mlp = resolved(ModelKind::Mlp, |f| f.hidden = Some(vec![128, 64]));
        let m = model(&mlp, &dense, None).expect("dense data");
        assert_eq!(m.params, 128 * 785 + 64 * 129 + 10 * 65);
        assert!(
            m.drivers.contains("--hidden 128,64") && m.drivers.contains("784-128-64-10"),
            "{}",
            m.drivers
        );
        // Activations and their gradients, a thread's, for --chunk (64 by default) rows.
        assert_eq!(m.activations, 64 * (128 + 64 + 10) * 2 * 4);
        let huge = resolved(ModelKind::Mlp, |f| f.hidden = Some(vec![usize::MAX, usize::MAX]));
        assert!(model(&huge, &dense, None).expect("counted").params > u128::from(u64::MAX), "no overflow");
        let m = model(&resolved(ModelKind::Softmax, |_| ()), &dense, None).expect("dense");
        assert_eq!((m.params, m.keys), (10 * 785, 1));
        assert!(m.drivers.contains("header fields `cols`, `classes`"), "{}", m.drivers);

        let sparse = set(Kind::Sparse, 2, 100_000_000, 2, 0, 2);
        let m = model(&resolved(ModelKind::Lr, |_| ()), &sparse, None).expect("sparse");
        assert_eq!((m.params, m.keys), (100_000_001, 100_000_001));
        assert!(m.drivers.contains("header field `cols`"), "{}", m.drivers);
        let m = model(&resolved(ModelKind::Lr, |f| f.hash_bits = Some(20)), &sparse, None).expect("sparse");
        assert_eq!(m.params, (1 << 20) + 1);
        let m =
            model(&resolved(ModelKind::Lr, |f| f.intercept = Some(false)), &sparse, None).expect("sparse");
        assert_eq!(m.params, 100_000_000);
        let m = model(&resolved(ModelKind::Lda, |f| f.k = Some(10)), &sparse, None).expect("sparse");
        assert_eq!(m.keys, 100_000_000 + 1 + 2 + 1);

        // Users and items: the larger of the training and evaluation sets'; rows of k factors,
        // the bias, and adagrad's two values.
        let (train, eval) = (set(Kind::Ratings, 5, 50, 0, 100, 5), set(Kind::Ratings, 5, 70, 0, 90, 5));
        let m = model(&resolved(ModelKind::Mf, |f| f.k = Some(8)), &train, Some(&eval)).expect("ratings");
        assert_eq!((m.params, m.keys), (170 * (8 + 1 + 2), 170));
        let sgd =
            resolved(ModelKind::Mf, |f| (f.k, f.optimizer) = (Some(8), Some("sgd".parse().expect("sgd"))));
        assert_eq!(model(&sgd, &train, None).expect("ratings").params, 150 * 9);

        // Data of another kind: the model's constructor says so.
        assert_eq!(model(&mlp, &sparse, None), None);
        assert_eq!(model(&mlp, &dense, Some(&sparse)), None);
        let synthetic = resolved(ModelKind::Synthetic, |f| f.params = Some(1000));
        assert_eq!(model(&synthetic, &sparse, None).expect("any data").params, 1000);
    }

    #[test]
    fn the_estimate_grows_by_a_rank_and_by_a_thread_as_their_buffers_do() {
        let dense = set(Kind::Dense, 10, 999, 10, 0, 9990);
        let sgd = resolved(ModelKind::Softmax, |f| f.optimizer = Some("sgd".parse().expect("sgd")));
        let m = model(&sgd, &dense, None).expect("dense");
        let p = m.params * PARAM;
        let at = |world, here, threads| bytes(&sgd, &m, Placement { world, here, threads });
        // A rank: replica, update, evaluation copy, its shard of the window, a gradient a
        // thread; rank 0's checkpoint: snapshot, weights, encoding, model file.
        assert_eq!(at(1, 1, 1), p * (3 + 1 + 1) + p * 4);
        assert_eq!(at(1, 1, 3) - at(1, 1, 1), 2 * p, "a thread: its gradient");
        assert_eq!(at(4, 4, 1), 4 * (p * 4 + p / 4) + p * 4, "linear in the ranks on the node");
        assert_eq!(at(4, 1, 1), p * 4 + p / 4 + p * 4, "the other ranks elsewhere");
        // Adam keeps two values a parameter, sharded with the weights and saved at checkpoints.
        let adam = resolved(ModelKind::Softmax, |_| ());
        assert_eq!(bytes(&adam, &m, ONE), p * (3 + 3 + 1) + p * 8);
        // A replicated scheme keeps the whole window on every rank.
        let dbw = resolved(ModelKind::Softmax, |f| {
            (f.optimizer, f.scheme) = (Some("sgd".parse().expect("sgd")), Some("dbw".parse().expect("dbw")));
        });
        let at4 = Placement { world: 4, here: 4, threads: 1 };
        assert_eq!(bytes(&dbw, &m, at4), 4 * (p * 5) + p * 4);
        // Sparse models: a buffer of chunks taken over a thread; MF and LDA two copies.
        let sparse = set(Kind::Sparse, 10, 1000, 2, 0, 10);
        let lr = resolved(ModelKind::Lr, |_| ());
        let m = model(&lr, &sparse, None).expect("sparse");
        assert_eq!(bytes(&lr, &m, ONE), m.params * PARAM * (3 + 1 + 2 + 4));
        // With an evaluation set rank 0 keeps the best evaluated model, and checkpoints encode it.
        let held_out = resolved(ModelKind::Lr, |f| f.eval = Some("te.pgd".into()));
        assert_eq!(bytes(&held_out, &m, ONE) - bytes(&lr, &m, ONE), 2 * m.params * PARAM);
    }

    #[test]
    fn a_model_past_the_memory_is_refused_naming_what_drives_it() {
        let dense = set(Kind::Dense, 2, 4, 2, 0, 8);
        let mlp = resolved(ModelKind::Mlp, |f| f.hidden = Some(vec![100_000, 100_000]));
        let m = model(&mlp, &dense, None).expect("dense");
        let two = Placement { world: 2, here: 2, threads: 1 };
        let why = refusal(&mlp, &m, two, Some((8_000_000_000, "MemAvailable"))).expect("refused");
        for part in ["--hidden 100000,100000", "10000800002 parameters (40.0 GB", "2 ranks of 1 thread"] {
            assert!(why.contains(part), "`{part}` in {why}");
        }
        for part in ["momentum's state", "8.0 GB available (MemAvailable)", "narrower hidden layers"] {
            assert!(why.contains(part), "`{part}` in {why}");
        }
        let need = bytes(&mlp, &m, two);
        assert!(why.contains(&format!("needs about {}", size(need))), "{why}");
        // What fits passes; an unknown figure refuses nothing (but the keys' bound).
        assert_eq!(refusal(&mlp, &m, two, Some((u64::try_from(need).expect("fits u64"), "x"))), None);
        assert_eq!(refusal(&mlp, &m, two, None), None);

        // A chunk of 10^18 rows: the activations, not the parameters, are what does not fit.
        let chunk = resolved(ModelKind::Mlp, |f| f.chunk = Some(1_000_000_000_000_000_000));
        let m = model(&chunk, &dense, None).expect("dense");
        let why = refusal(&chunk, &m, two, Some((8_000_000_000, "MemAvailable"))).expect("refused");
        assert!(why.starts_with("--chunk 1000000000000000000 and --grain 1: a compute thread's"), "{why}");
        assert!(why.contains("a smaller --chunk or --grain"), "{why}");

        // A weight per feature id: the refusal names the header field and the bits that fit.
        let sparse = set(Kind::Sparse, 2, 100_000_000, 2, 0, 2);
        let lr = resolved(ModelKind::Lr, |_| ());
        let m = model(&lr, &sparse, None).expect("sparse");
        let why = refusal(&lr, &m, two, Some((1_000_000_000, "a limit"))).expect("refused");
        let bits = hash_bits_that_fit(&lr, two, 1_000_000_000).expect("some fit");
        assert!(
            why.contains("header field `cols`") && why.contains(&format!("--hash-bits {bits} ")),
            "{why}"
        );
        let hashed = resolved(ModelKind::Lr, |f| f.hash_bits = Some(bits));
        let fits = model(&hashed, &sparse, None).expect("sparse");
        assert_eq!(refusal(&hashed, &fits, two, Some((1_000_000_000, "a limit"))), None);
        // More keys than a 32-bit index numbers, whatever the memory.
        let wide = set(Kind::Sparse, 2, 1 << 32, 2, 0, 2);
        let m = model(&lr, &wide, None).expect("sparse");
        let why = refusal(&lr, &m, ONE, None).expect("refused");
        assert!(why.contains("4294967297 keys") && why.contains("2^32"), "{why}");
        let m = model(&resolved(ModelKind::Lr, |f| f.intercept = Some(false)), &wide, None).expect("sparse");
        assert_eq!(m.keys, 1 << 32, "no intercept: every id has a key");
    }
}
