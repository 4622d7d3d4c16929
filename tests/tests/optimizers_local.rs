//! Optimizers through the real engine on local ranks: their update rules against a scalar
//! textbook reference, every optimizer's model under BSP the same on 1, 2 and 4 ranks, FTRL's exact zeros, and
//! every scheme still reaching its target with every optimizer (state in the window beside the
//! weights, stale, damped and dropped updates included).

use std::ops::Range;
use std::path::{Path, PathBuf};

use peregrine_core::engine::{self, Config, Report};
use peregrine_core::model::{lr::LogReg, mlp::Mlp, Baseline, Delta, EvalSums, KeySet, Layout, Metric, Model};
use peregrine_core::optim::{Decay, Optimizer, Schedule};
use peregrine_core::pool::{Pinning, RankPool};
use peregrine_core::SchemeSpec;
use peregrine_kernels::data::gen::{self, DenseSpec, SparseSpec};
use peregrine_tests::training::{bsp_params_one_thread, distance, scheme, slot, slowed, BSP_TOLERANCE};
use peregrine_transport::{run_local, Transport};

/// Loss `0.5 |w - x_i|^2` of row `i`, `x_i` a fixed pseudo-random point: the mean gradient over
/// a batch of every row is `w - mean(x)`, the same whatever order the rows are computed in.
struct Quadratic {
    rows: usize,
    dim: usize,
    lr: f32,
}

impl Quadratic {
    fn x(&self, i: usize, j: usize) -> f32 {
        let h = peregrine_core::plan::mix((i * 131 + j) as u64);
        ((h >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 1.0 + j as f32
    }

    fn mean(&self) -> Vec<f64> {
        (0..self.dim)
            .map(|j| (0..self.rows).map(|i| f64::from(self.x(i, j))).sum::<f64>() / self.rows as f64)
            .collect()
    }
}

impl Model for Quadratic {
    type Work = Vec<f32>;

    fn name(&self) -> &'static str {
        "quadratic"
    }

    fn layout(&self) -> Layout {
        Layout::dense(self.dim)
    }

    fn rows(&self) -> usize {
        self.rows
    }

    fn eval_rows(&self) -> usize {
        0
    }

    fn metric(&self) -> Metric {
        Metric::Rmse
    }

    fn init(&self, _seed: u64, range: Range<usize>, out: &mut [f32]) {
        for (j, w) in range.zip(out) {
            *w = 0.5 - j as f32;
        }
    }

    fn sparse(&self) -> bool {
        false
    }

    fn keys(&self, _rows: Range<usize>, _set: &mut KeySet) {}

    fn work(&self, _chunk: usize) -> Vec<f32> {
        vec![0.0; self.dim]
    }

    fn compute(&self, rows: Range<usize>, params: &[f32], g: &mut Vec<f32>) -> f64 {
        let mut loss = 0.0;
        for i in rows {
            for (j, g) in g.iter_mut().enumerate() {
                let d = params[j] - self.x(i, j);
                *g += d;
                loss += 0.5 * f64::from(d * d);
            }
        }
        loss
    }

    fn drain(&self, g: &mut Vec<f32>, scale: f32, delta: &mut Delta) {
        delta.add_all(scale, g);
        g.fill(0.0);
    }

    fn scale(&self, rows: usize) -> f32 {
        -self.lr / rows.max(1) as f32
    }

    fn lr(&self) -> Option<f32> {
        Some(self.lr)
    }

    fn evaluate(&self, _params: &[f32], rows: Range<usize>) -> EvalSums {
        [0.0, 0.0, rows.len() as f64]
    }

    fn baseline(&self) -> Baseline {
        Baseline { blind_loss: 1.0, constant_metric: 0.0 }
    }
}

/// The textbook rule, in f64, on the full-batch gradient `w - mean`, with the schedule's factor.
fn textbook(o: Optimizer, q: &Quadratic, sched: Schedule, iterations: u64) -> Vec<f64> {
    let mean = q.mean();
    let mut w: Vec<f64> = (0..q.dim).map(|j| 0.5 - j as f64).collect();
    let (mut a, mut b) = (vec![0.0f64; q.dim], vec![0.0f64; q.dim]);
    for it in 0..iterations {
        let lr = f64::from(q.lr) * sched.factor(it, 1, iterations);
        let t = (it + 1) as i32;
        for j in 0..q.dim {
            let g = w[j] - mean[j];
            match o {
                Optimizer::Sgd => w[j] -= lr * g,
                Optimizer::Momentum { mu, nesterov } => {
                    let mu = f64::from(mu);
                    a[j] = mu * a[j] + g;
                    w[j] -= lr * if nesterov { g + mu * a[j] } else { a[j] };
                }
                Optimizer::AdaGrad { eps } => {
                    a[j] += g * g;
                    w[j] -= lr * g / (a[j].sqrt() + f64::from(eps));
                }
                Optimizer::Adam { beta1, beta2, eps } => {
                    let (b1, b2) = (f64::from(beta1), f64::from(beta2));
                    a[j] = b1 * a[j] + (1.0 - b1) * g;
                    b[j] = b2 * b[j] + (1.0 - b2) * g * g;
                    let (m, v) = (a[j] / (1.0 - b1.powi(t)), b[j] / (1.0 - b2.powi(t)));
                    w[j] -= lr * m / (v.sqrt() + f64::from(eps));
                }
                Optimizer::Ftrl { .. } => unreachable!("FTRL is checked on its own"),
            }
        }
    }
    w
}

fn pool(t: &Transport, threads: usize) -> RankPool {
    RankPool::new(threads, slot(t), Pinning::Off).expect("pool")
}

fn train<M: Model>(t: &Transport, model: &M, cfg: &Config) -> Result<Report, String> {
    engine::train(t, model, cfg, &pool(t, cfg.threads), None, &mut |_| {}).map_err(|e| e.to_string())
}

#[test]
fn one_rank_follows_the_textbook_rules() {
    // One rank, two threads, the whole data set as the batch: every iteration steps with the
    // full-batch gradient, so the engine's windows, state and schedule must give the textbook
    // rule's weights.
    let q = Quadratic { rows: 96, dim: 5, lr: 0.05 };
    let cosine = Schedule { warmup: 5, decay: Decay::Cosine };
    let cases = [
        ("sgd", Schedule::default()),
        ("sgd", cosine),
        ("momentum", Schedule::default()),
        ("nesterov:0.5", Schedule { warmup: 3, decay: Decay::Inverse(0.5) }),
        ("adagrad", Schedule::default()),
        ("adam", Schedule::default()),
        ("adam:0.8,0.99", cosine),
    ];
    for (name, sched) in cases {
        let o: Optimizer = name.parse().expect("optimizer");
        let q = Quadratic {
            lr: if matches!(o, Optimizer::Sgd | Optimizer::Momentum { .. }) { 0.05 } else { 0.2 },
            ..q
        };
        let cfg = Config {
            batch: q.rows,
            chunk: 8,
            iterations: 40,
            threads: 2,
            keep_params: true,
            optimizer: o,
            schedule: sched,
            ..Config::default()
        };
        let got = run_local(1, |t| train(&t, &q, &cfg)).expect("world").remove(0).expect("train");
        let got = got.params.expect("params");
        let want = textbook(o, &q, sched, 40);
        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (f64::from(*g) - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "{name} {sched:?}: weight {j} is {g}, the textbook rule gives {w}"
            );
        }
        let start = 0.5 - 4.0;
        assert!((want[4] - start).abs() > 0.1, "{name}: the reference did not move");
    }
}

fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-optim-{name}-")).tempdir().expect("scratch dir")
}

fn dense_data(dir: &Path) -> PathBuf {
    let p = dir.join("dense.pgd");
    gen::dense(&DenseSpec { rows: 2000, cols: 20, classes: 4, noise: 0.5, seed: 3 }, &p).expect("gen");
    p
}

fn sparse_data(dir: &Path) -> PathBuf {
    let p = dir.join("sparse.pgd");
    gen::sparse(&SparseSpec { rows: 4000, cols: 2000, nnz_per_row: 12, zipf: 1.1, seed: 2 }, &p)
        .expect("gen");
    p
}

/// BSP with rank 0 at half speed and chunks taken over, `iterations` iterations of 256 rows:
/// the final parameters.
fn bsp_params<M: Model>(t: &Transport, model: &M, o: Optimizer, iterations: u64) -> Result<Vec<f32>, String> {
    run_under(t, model, o, iterations, SchemeSpec::new(scheme("bsp"), true))?
        .params
        .ok_or_else(|| "no parameters".into())
}

/// As [`bsp_params`], under `spec`: the report, parameters kept.
fn run_under<M: Model>(
    t: &Transport,
    model: &M,
    o: Optimizer,
    iterations: u64,
    spec: SchemeSpec,
) -> Result<Report, String> {
    let cfg = Config {
        scheme: spec,
        batch: 256,
        chunk: 16,
        iterations,
        threads: 2,
        inject: if t.world_size() > 1 { slowed(0, 0.5) } else { Default::default() },
        keep_params: true,
        seed: 5,
        optimizer: o,
        ..Config::default()
    };
    train(t, model, &cfg)
}

#[test]
fn every_optimizer_under_bsp_is_the_same_for_1_2_4_ranks() {
    // Under BSP the owners of the parameters step them with the iteration's summed gradient:
    // the model does not depend on how the batch was split, for the optimizers whose step is not
    // linear in the gradient (AdaGrad, Adam) as for momentum.
    let tmp = scratch("momentum");
    let data = dense_data(tmp.path());
    let make = || Mlp::new(&data, None, &[16], 0.05).expect("model");
    for o in ["momentum", "nesterov", "adagrad", "adam"] {
        let o: Optimizer = o.parse().expect("optimizer");
        let one = run_local(1, |t| bsp_params(&t, &make(), o, 25)).expect("world").remove(0).expect("1 rank");
        for world in [2, 4] {
            for p in run_local(world, |t| bsp_params(&t, &make(), o, 25)).expect("world") {
                let p = p.unwrap_or_else(|e| panic!("{o}, {world} ranks: {e}"));
                let d = distance(&p, &one);
                assert!(d <= BSP_TOLERANCE, "{o}, {world} ranks vs 1: parameters differ by {d:e}");
            }
        }
    }
}

#[test]
fn an_l2_penalty_applied_by_the_owners_is_the_one_the_chunks_applied() {
    // Under BSP with an optimizer that keeps state, the owners apply the model's L2 penalty
    // (`l2 w` added to the batch's gradient, as PyTorch's `weight_decay`) and the chunks leave
    // it out; plain SGD steps at the ranks, whose chunks add it. Momentum 0 is SGD: both must
    // give one model, on 1 and 2 ranks (rank 0 slowed, chunks taken over), and the penalty must
    // move it (applied by neither, or twice, the models would differ).
    let tmp = scratch("decay");
    let data = dense_data(tmp.path());
    let make = |l2: f32| Mlp::new(&data, None, &[16], 0.05).expect("model").with_l2(l2);
    let (sgd, owners): (Optimizer, Optimizer) =
        ("sgd".parse().expect("sgd"), "momentum:0".parse().expect("mu 0"));
    for world in [1, 2] {
        let run = |o: Optimizer, l2: f32| {
            run_local(world, |t| bsp_params(&t, &make(l2), o, 25)).expect("world").remove(0).expect("train")
        };
        let (chunks, stepped, plain) = (run(sgd, 0.05), run(owners, 0.05), run(owners, 0.0));
        let d = distance(&stepped, &chunks);
        assert!(d <= BSP_TOLERANCE, "{world} ranks: owners' penalty vs the chunks': {d:e}");
        let moved = distance(&plain, &chunks);
        assert!(
            moved > 100.0 * BSP_TOLERANCE,
            "{world} ranks: the penalty moved the model by {moved:e} only"
        );
    }
}

#[test]
fn owners_add_the_ranks_gradients_in_rank_order_so_every_run_is_alike() {
    // One thread a rank and nothing taken over: each rank's gradient is the same from run to
    // run, and the owners add the other ranks' slots in rank order whatever order their pushes
    // landed in, so 4 ranks give the same model bit for bit every run. (Added in arrival order,
    // as accumulates into one gradient were, runs differed in the last bits.)
    let tmp = scratch("rank-order");
    let data = dense_data(tmp.path());
    let model = Mlp::new(&data, None, &[16], 0.05).expect("model");
    let adam: Optimizer = "adam".parse().expect("optimizer");
    let run = || bsp_params_one_thread(4, &model, 25, adam, |_| {});
    let bits = |p: &[f32]| p.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let first = bits(&run());
    for i in 1..6 {
        assert!(bits(&run()) == first, "run {i} of 4 ranks differs from the first");
    }
}

#[test]
fn lb_bsp_steps_at_the_owners_and_gives_the_bsp_model() {
    // LB-BSP waits for every rank's push as BSP does, so its uneven batches (rank 0, at half
    // speed, is given fewer rows) step at the owners with the summed gradient too: AdaGrad and
    // Adam, whose steps are not linear in the gradient, give BSP's model on 1 rank, which
    // per-rank shares of the step would only approximate. Without taking over, the split is
    // LB-BSP's alone; the ranks' rows must differ for the check to mean anything.
    let tmp = scratch("lb-bsp");
    let data = dense_data(tmp.path());
    let make = || Mlp::new(&data, None, &[16], 0.05).expect("model");
    for o in ["adagrad", "adam"] {
        let o: Optimizer = o.parse().expect("optimizer");
        let one = run_local(1, |t| bsp_params(&t, &make(), o, 25)).expect("world").remove(0).expect("1 rank");
        let lb = SchemeSpec::new(scheme("lb-bsp:ma"), false);
        for r in run_local(2, |t| run_under(&t, &make(), o, 25, lb.clone())).expect("world") {
            let r = r.unwrap_or_else(|e| panic!("{o}, lb-bsp: {e}"));
            let rows: Vec<u64> = r.per_rank.iter().map(|t| t.rows).collect();
            assert!(rows[0] < rows[1], "{o}: the slow rank was not given fewer rows: {rows:?}");
            let d = distance(&r.params.expect("parameters"), &one);
            assert!(d <= BSP_TOLERANCE, "{o}, lb-bsp on 2 ranks vs BSP on 1: parameters differ by {d:e}");
        }
    }
}

#[test]
fn ftrl_l1_gives_exact_zeros_and_leaves_the_intercept_alone() {
    // Labels of a sparse problem drawn from a few hundred of 2000 features: a strong L1 keeps
    // most weights exactly zero, on 2 ranks pushing concurrently (pulled by key), while the
    // intercept (never penalized) moves; without L1 nearly every touched weight moves.
    let tmp = scratch("ftrl");
    let data = sparse_data(tmp.path());
    let run = |l1: f32, pull_whole: bool| {
        let m = LogReg::new(&data, None, 0.1, true).expect("model");
        let cfg = Config {
            batch: 256,
            chunk: 32,
            iterations: 60,
            threads: 1,
            keep_params: true,
            optimizer: Optimizer::Ftrl { beta: 1.0, l1 },
            dense_pull_below: if pull_whole { usize::MAX } else { 0 },
            ..Config::default()
        };
        run_local(2, |t| train(&t, &m, &cfg))
            .expect("world")
            .remove(0)
            .expect("train")
            .params
            .expect("params")
    };
    for pull_whole in [false, true] {
        let sparse = run(0.02, pull_whole);
        let dense = run(0.0, pull_whole);
        let zeros = |p: &[f32]| p[..2000].iter().filter(|&&w| w == 0.0).count();
        assert!(
            zeros(&sparse) > 1000,
            "pulled whole {pull_whole}: only {} of 2000 weights are 0",
            zeros(&sparse)
        );
        assert!(zeros(&dense) < 400, "pulled whole {pull_whole}: {} zeros without L1", zeros(&dense));
        assert!(zeros(&sparse) > zeros(&dense) + 500);
        assert_ne!(sparse[2000], 0.0, "the intercept is not penalized");
    }
}

/// Every scheme (taking over on, rank 0 at half speed): LR (pulled by key, so the state of the
/// pushed keys is read at push time) with every optimizer, and an MLP (pulled whole) with
/// momentum and Adam, must learn (loss under 0.8 of a blind model's) and end within 35% of the
/// same optimizer's loss under BSP without a straggler: state corrupted by stale, damped, dropped
/// or copied updates would show as a loss far off (backup:1 of 2 ranks applies half the rows,
/// which costs it up to ~25%).
#[test]
fn every_scheme_reaches_the_target_with_every_optimizer() {
    let tmp = scratch("schemes");
    let dense = dense_data(tmp.path());
    // Many features, few of them common: a batch touches a few hundred runs of neighbouring
    // keys, which pulls and pushes move as ranges (not the whole vector).
    let sparse = tmp.path().join("wide.pgd");
    gen::sparse(&SparseSpec { rows: 4000, cols: 400_000, nnz_per_row: 10, zipf: 1.8, seed: 4 }, &sparse)
        .expect("gen");
    let mut failures = Vec::new();
    let mut check = |what: &str, blind: f64, loss: &dyn Fn(&str, bool) -> f64| {
        let ideal = loss("bsp", false);
        for s in peregrine_tests::SCHEMES {
            let l = loss(s, true);
            if !(l < 0.8 * blind && l <= 1.35 * ideal) {
                failures.push(format!("{s} {what}: loss {l:.4}, BSP without a straggler {ideal:.4}"));
            }
        }
    };
    for (o, model_lr) in
        [("momentum", 0.2), ("nesterov", 0.2), ("adagrad", 0.3), ("adam", 0.03), ("ftrl", 1.0)]
    {
        let make = || LogReg::new(&sparse, None, model_lr, true).expect("model");
        check(&format!("{o} (lr)"), std::f64::consts::LN_2, &|s, slow| final_loss(s, o, &make, 0, slow));
    }
    for (o, model_lr) in [("momentum", 0.05), ("adam", 0.02)] {
        let make = || Mlp::new(&dense, None, &[16], model_lr).expect("model");
        check(&format!("{o} (mlp)"), 4f64.ln(), &|s, slow| final_loss(s, o, &make, usize::MAX, slow));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The final evaluation loss of 2 ranks training `make`'s model under scheme `s` with
/// optimizer `o`, rank 0 at half speed if `slow`.
fn final_loss<M: Model>(
    s: &str,
    o: &str,
    make: &(dyn Fn() -> M + Sync),
    dense_pull_below: usize,
    slow: bool,
) -> f64 {
    let cfg = Config {
        scheme: SchemeSpec::new(scheme(s), true),
        batch: 256,
        chunk: 16,
        iterations: 60,
        threads: 1,
        inject: if slow { slowed(0, 0.5) } else { Default::default() },
        optimizer: o.parse().expect("optimizer"),
        dense_pull_below,
        ..Config::default()
    };
    let r = run_local(2, |t| train(&t, &make(), &cfg)).expect("world").remove(0);
    let r = r.unwrap_or_else(|e| panic!("{s} {o}: {e}"));
    r.evals.last().expect("a final evaluation").loss
}

#[test]
fn a_push_by_key_in_blocks_steps_as_a_push_of_whole_vectors() {
    // 100k features, 256 rows of 12 a batch: ~3,000 touched keys an iteration, moved by key and
    // stepped on the direct window in blocks of 512, against the same run pulling and pushing
    // whole vectors (every parameter stepped, untouched ones with a zero gradient, which leaves
    // AdaGrad's and FTRL's state and weights as they are). One rank, one thread: one order of
    // every sum, so the two models are the same to the last bit.
    let tmp = scratch("blocks");
    let p = tmp.path().join("wide.pgd");
    gen::sparse(&SparseSpec { rows: 3000, cols: 100_000, nnz_per_row: 12, zipf: 1.1, seed: 4 }, &p)
        .expect("gen");
    for o in ["adagrad", "ftrl"] {
        let o: Optimizer = o.parse().expect("optimizer");
        let run = |pull_whole: bool| {
            let m = LogReg::new(&p, None, 0.1, true).expect("model");
            let cfg = Config {
                batch: 256,
                chunk: 64,
                iterations: 20,
                threads: 1,
                keep_params: true,
                optimizer: o,
                dense_pull_below: if pull_whole { usize::MAX } else { 0 },
                ..Config::default()
            };
            let report = run_local(1, |t| train(&t, &m, &cfg)).expect("world").remove(0).expect("train");
            report.params.expect("params")
        };
        let (by_key, whole) = (run(false), run(true));
        let moved = by_key.iter().filter(|&&w| w != 0.0).count();
        assert!(moved > 5000, "{o}: {moved} weights moved: too few keys for several blocks");
        assert_eq!(by_key, whole, "{o}: stepped by key in blocks and in whole vectors");
    }
}
