//! The training engine on local ranks (threads): every chunk computed exactly once under every
//! scheme, and BSP giving the same model for 1, 2 and 4 ranks.

use std::path::{Path, PathBuf};

use peregrine_core::engine::Config;
use peregrine_core::inject::Injection;
use peregrine_core::model::{lr::LogReg, mf::Mf, mlp::Mlp, softmax::Softmax, Delta, Export, Model};
use peregrine_core::optim::Optimizer;
use peregrine_core::plan::Plan;
use peregrine_core::Scheme;
use peregrine_kernels::data::gen::{self, DenseSpec, SparseSpec};
use peregrine_tests::training::{
    bsp_params_one_thread, counted, counted_with, distance, exactly_once, exactly_once_elastic,
    exactly_once_in, final_params, final_params_by, final_params_with, foreseen, injected, scheme,
    BSP_TOLERANCE,
};
use peregrine_transport::run_local;

fn check_exactly_once(scheme: Scheme) {
    for world in 1..=4 {
        for threads in [1, 2] {
            let reports = run_local(world, |t| exactly_once(&t, scheme.clone(), threads, 3)).expect("world");
            let reports: Vec<_> = reports.into_iter().map(|r| r.unwrap_or_else(|e| panic!("{e}"))).collect();
            let taken: u64 = reports[0].per_rank.iter().map(|r| r.taken).sum();
            let cloned: u64 = reports[0].per_rank.iter().map(|r| r.cloned).sum();
            let own: u64 = reports[0].per_rank.iter().map(|r| r.own).sum();
            let plan = Plan::new(997, 200, world, 7, 11).expect("plan");
            let chunks: u64 = (0..3 * plan.iters_per_epoch())
                .flat_map(|t| (0..world).map(move |r| (t, r)))
                .map(|(t, r)| u64::from(plan.chunks(t, r)))
                .sum();
            // Each chunk's result applied once: by its owner, a thief, or a copy that won.
            assert_eq!(own + taken + cloned, chunks, "{scheme}, {world} ranks x {threads}: chunks counted");
            if world > 1 {
                // Rank 0 runs at a twentieth of its speed: the others must have taken chunks over
                // (or, speculating, copied and won some).
                assert!(taken > 0, "{scheme}, {world} ranks x {threads}: nothing taken over");
            } else {
                assert_eq!(cloned + reports[0].per_rank[0].discarded, 0, "one rank copied chunks");
            }
        }
    }
}

#[test]
fn every_chunk_once_under_bsp() {
    check_exactly_once(scheme("bsp"));
}

#[test]
fn every_chunk_once_under_ssp() {
    check_exactly_once(scheme("ssp:2"));
}

#[test]
fn every_chunk_once_under_asp() {
    check_exactly_once(scheme("asp"));
}

/// A rank whose chunks one thread computes in order is told which rows come next before each
/// compute (chunk by chunk, in runs of joined chunks, across iterations and epochs): every
/// compute but its first computes the rows of the hint before it. Threads taking chunks in turns
/// get no hint.
#[test]
fn one_thread_a_rank_is_told_the_rows_it_computes_next() {
    for world in [1, 2, 3] {
        for grain in [1, 3] {
            for (rank, got) in
                run_local(world, |t| foreseen(&t, 1, grain)).expect("world").into_iter().enumerate()
            {
                let (computes, hinted) = got.unwrap_or_else(|e| panic!("{e}"));
                // 10 iterations of 29 chunks.
                assert!(computes >= 30, "{world} ranks, grain {grain}, rank {rank}: {computes} computes");
                assert_eq!(hinted, computes - 1, "{world} ranks, grain {grain}, rank {rank}: hints right");
            }
        }
    }
    for got in run_local(2, |t| foreseen(&t, 2, 1)).expect("world") {
        let (computes, hinted) = got.unwrap_or_else(|e| panic!("{e}"));
        assert!(computes > 0 && hinted == 0, "2 threads a rank: {hinted} of {computes} hinted");
    }
}

fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-training-{name}-")).tempdir().expect("scratch dir")
}

/// Trains the model `make` builds with 1, 2 and 4 ranks; the models must agree.
fn same_model_for_every_world<M: Model>(make: impl Fn() -> M + Sync, iterations: u64) {
    let one =
        run_local(1, |t| final_params(&t, &make(), iterations)).expect("world").remove(0).expect("1 rank");
    for world in [2, 4] {
        for (r, p) in run_local(world, |t| final_params(&t, &make(), iterations))
            .expect("world")
            .into_iter()
            .enumerate()
        {
            let p = p.unwrap_or_else(|e| panic!("{world} ranks, rank {r}: {e}"));
            let d = distance(&p, &one);
            assert!(d <= BSP_TOLERANCE, "{world} ranks vs 1: parameters differ by {d:e} (relative)");
            assert!(p.iter().any(|&w| w != 0.0), "the model did not move");
        }
    }
}

fn sparse_data(dir: &Path) -> PathBuf {
    let p = dir.join("sparse.pgd");
    gen::sparse(&SparseSpec { rows: 3000, cols: 400, nnz_per_row: 12, zipf: 1.1, seed: 2 }, &p).expect("gen");
    p
}

#[test]
fn bsp_lr_is_the_same_for_1_2_4_ranks() {
    let tmp = scratch("lr");
    let data = sparse_data(tmp.path());
    same_model_for_every_world(|| LogReg::new(&data, None, 0.5, true).expect("model"), 30);
}

/// Pulls by key whose keys come out scattered read the whole model, and after the first such
/// pull read it straight away without gathering keys (re-checking every 16th): LR over 2000
/// features whose 128-row shares touch hundreds of runs of them trains the same model as pulls
/// of the whole model: under BSP with 2 ranks (rank 0 slowed, chunks taken over) with SGD, and on
/// one rank with FTRL, whose weights a pull derives from the window's values and state. (With
/// more ranks, a keyed push reads the optimizer state as the other ranks' pushes left it, so a
/// stateful optimizer's model depends on their order.)
#[test]
fn scattered_keyed_pulls_train_the_model_of_whole_pulls() {
    use peregrine_core::optim::Optimizer;
    use peregrine_tests::training::{final_params_of, params_config};
    let tmp = scratch("scattered");
    let data = tmp.path().join("wide.pgd");
    gen::sparse(&SparseSpec { rows: 4000, cols: 2000, nnz_per_row: 12, zipf: 1.1, seed: 2 }, &data)
        .expect("gen");
    let model = LogReg::new(&data, None, 0.5, true).expect("model");
    // params_config: BSP, batches of 256, 2 threads; with SGD on 2 ranks, rank 0 slowed and chunks
    // taken over.
    let run = |world: usize, optimizer: Optimizer, dense_pull_below: usize| {
        run_local(world, |t| {
            let cfg = Config { dense_pull_below, ..params_config(&t, 60, scheme("bsp"), optimizer) };
            final_params_of(&t, &model, &cfg)
        })
        .expect("world")
        .remove(0)
        .unwrap_or_else(|e| panic!("{optimizer}: {e}"))
    };
    for (world, optimizer) in [(2, Optimizer::Sgd), (1, Optimizer::Ftrl { beta: 1.0, l1: 0.01 })] {
        let (keyed, whole) = (run(world, optimizer, 0), run(world, optimizer, usize::MAX));
        let d = distance(&keyed, &whole);
        assert!(d <= BSP_TOLERANCE, "{optimizer}: keyed and whole pulls' models differ by {d:e}");
        assert!(keyed.iter().filter(|&&w| w != 0.0).count() > 1000, "{optimizer}: the model learnt little");
    }
}

/// Labels unrelated to the features, one row in five positive: the best model is the base rate
/// alone, `b = logit(0.2) = -1.386`, which only the intercept can express (the noise features'
/// weights, about as often positive as negative, cannot).
#[test]
fn lr_intercept_learns_the_base_rate() {
    let tmp = scratch("intercept");
    let text = tmp.path().join("noise.svm");
    let mut body = String::new();
    for i in 0..4000u64 {
        let y = u8::from(i % 5 == 0);
        let (a, b) = (peregrine_core::plan::mix(i) % 50, peregrine_core::plan::mix(i ^ 0xABCD) % 50 + 50);
        let v = if peregrine_core::plan::mix(i * 3).is_multiple_of(2) { 1.0 } else { -1.0 };
        body.push_str(&format!("{y} {}:{v} {}:{}\n", a + 1, b + 1, -v));
    }
    std::fs::write(&text, body).expect("write");
    let data = tmp.path().join("noise.pgd");
    peregrine_kernels::data::libsvm::convert(&text, &data, None).expect("convert");
    let p = run_local(1, |t| final_params(&t, &LogReg::new(&data, None, 0.5, true).expect("model"), 600))
        .expect("world")
        .remove(0)
        .expect("train");
    assert_eq!(p.len(), 101, "100 feature weights and the intercept");
    let b = f64::from(p[100]);
    assert!((b - (0.2f64 / 0.8).ln()).abs() < 0.15, "intercept {b}, base rate logit -1.386");
    let none = run_local(1, |t| final_params(&t, &LogReg::new(&data, None, 0.5, false).expect("model"), 10))
        .expect("world")
        .remove(0)
        .expect("train");
    assert_eq!(none.len(), 100, "no intercept, no extra parameter");
}

#[test]
fn bsp_mf_is_the_same_for_1_2_4_ranks() {
    let tmp = scratch("mf");
    let p = peregrine_tests::training::mf_ratings(tmp.path());
    same_model_for_every_world(|| Mf::new(&p, None, 8, 0.01, 0.05).expect("model"), 20);
    // Adaptive rates: each row's G is summed like its factors.
    same_model_for_every_world(|| Mf::new(&p, None, 8, 0.1, 0.1).expect("model").with_adaptive(true), 20);
}

/// MF in strata under BSP: the iterations whose chunks touch pairwise disjoint rows (rounds of
/// block pieces) put the rows' new values instead of accumulating their changes, and the model is
/// the one accumulating gives (up to rounding: `w + (new - w)` against `new`): on 2 ranks of 2
/// threads, rank 0 slowed and its chunks taken over, and on 4 ranks against 1. The ranks' traces
/// say which pushes put values: most iterations, not all (the loose ratings' batches share rows).
#[test]
fn bsp_mf_in_strata_puts_new_values_and_trains_the_model_of_accumulates() {
    use peregrine_tests::training::{final_params_of, mf_ratings, mf_strata, mf_strata_config, traced_puts};
    let tmp = scratch("mf-puts");
    let p = mf_ratings(tmp.path());
    let model = mf_strata(&p).expect("model");
    let iterations = 60;
    let run = |world: usize, put_disjoint: bool, name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).expect("trace dir");
        let p = run_local(world, |t| {
            final_params_of(&t, &model, &mf_strata_config(&t, iterations, put_disjoint, Some(dir.clone())))
        })
        .expect("world")
        .remove(0)
        .unwrap_or_else(|e| panic!("{world} ranks, put_disjoint {put_disjoint}: {e}"));
        let (pushes, puts) = traced_puts(&dir).expect("trace");
        assert_eq!(pushes, iterations, "{name}: one push an iteration");
        (p, puts)
    };
    let ((put, n), (added, none)) = (run(2, true, "put-2"), run(2, false, "add-2"));
    let d = distance(&put, &added);
    assert!(d <= BSP_TOLERANCE, "puts and accumulates: models differ by {d:e}");
    assert!(n >= iterations / 2 && n < iterations, "{n} of {iterations} pushes put values");
    assert_eq!(none, 0, "put_disjoint false still put values");
    let (one, n1) = run(1, true, "put-1");
    assert_eq!(n1, n, "1 rank put values in other iterations than 2");
    let (four, _) = run(4, true, "put-4");
    let d = distance(&four, &one);
    assert!(d <= BSP_TOLERANCE, "4 ranks vs 1: models differ by {d:e}");
    let mut init = vec![0.0; model.layout().params];
    model.init(5, 0..init.len(), &mut init);
    assert!(distance(&one, &init) > 0.1, "the model did not move");
}

/// The gradient `m` drains for `rows` at `params` (one work buffer, scale 1), as a dense vector.
fn drained<M: Model>(m: &M, rows: std::ops::Range<usize>, params: &[f32]) -> (f64, Vec<f32>) {
    let mut work = m.work(rows.len());
    let loss = m.compute(rows, params, &mut work);
    let mut delta = Delta::new(m.layout());
    m.drain(&mut work, 1.0, &mut delta);
    let (mut ranges, mut data) = (Vec::new(), Vec::new());
    delta.ranges(&mut ranges, &mut data);
    let mut g = vec![0.0; params.len()];
    let mut at = 0;
    for r in ranges {
        g[r.clone()].copy_from_slice(&data[at..at + r.len()]);
        at += r.len();
    }
    (loss, g)
}

/// A dense update discarded between drains keeps its old vector (no pass of zeros), traded for
/// the MLP's gradient buffer, which its next chunk overwrites: drain after drain, with and without
/// a chunk in between and with a second thread's work adding to it, the update holds what a fresh
/// work's chunk gives (to the last bit: chunks write where they added to zeros), and the vector
/// of an update not drained into since it was discarded is never read as its values.
#[test]
fn an_update_discarded_between_drains_is_the_chunks_gradient_and_never_its_old_values() {
    let tmp = scratch("stale");
    let dense = tmp.path().join("dense.pgd");
    gen::dense(&DenseSpec { rows: 200, cols: 12, classes: 3, noise: 0.3, seed: 4 }, &dense).expect("gen");
    let m = Mlp::new(&dense, None, &[7, 5], 0.1).expect("model").with_l2(0.01);
    let p = nonzero_params(m.layout().params);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let (mut delta, mut work, mut other) = (Delta::new(m.layout()), m.work(40), m.work(40));
    let zeros = vec![0.0f32; p.len()];
    // (rows of this thread's chunk, rows of a second thread's chunk), drain after drain.
    let rounds = [
        (Some(0..40), None),
        (Some(40..80), None),
        (Some(80..120), Some(120..160)),
        (None, None),
        (Some(0..40), None),
    ];
    for (i, (mine, theirs)) in rounds.into_iter().enumerate() {
        delta.discard();
        let mut want = zeros.clone();
        for (rows, w) in [(mine, &mut work), (theirs, &mut other)] {
            if let Some(rows) = rows {
                m.compute(rows.clone(), &p, w);
                let (_, g) = drained(&m, rows, &p);
                want.iter_mut().zip(&g).for_each(|(a, b)| *a += b);
            }
        }
        m.drain(&mut work, 1.0, &mut delta);
        m.drain(&mut other, 1.0, &mut delta);
        assert_eq!(bits(delta.values()), bits(&want), "drain {i}");
    }
    // Discarded, with nothing drained since: its vector is not its values.
    delta.discard();
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| delta.values().len()));
    assert!(read.is_err(), "a discarded update's old vector was read as its values");
    // Anything added to it lands on zeros.
    delta.add_all(1.0, &zeros);
    assert!(delta.values().iter().all(|&x| x == 0.0));
}

/// Parameters that are all nonzero (so a regularizer's gradient shows everywhere it applies).
fn nonzero_params(n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.05 + (peregrine_core::plan::mix(i as u64) % 1000) as f32 * 1e-4).collect()
}

/// L2 adds exactly `rows * l2 * W` to the gradient of every weight matrix and nothing to the
/// biases (softmax, MLP), and `l2 * w_j` per row touching feature `j` to LR's weights, nothing to
/// its intercept; the reported loss is the data loss alone.
#[test]
fn l2_adds_its_gradient_to_weights_only() {
    let tmp = scratch("l2");
    let dense = tmp.path().join("dense.pgd");
    gen::dense(&DenseSpec { rows: 200, cols: 12, classes: 3, noise: 0.3, seed: 4 }, &dense).expect("gen");
    let l2 = 0.3f32;
    let rows = 10..60;
    let n = rows.len() as f32;
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * (1.0 + b.abs());
    // Softmax: W (3 x 12) then b (3).
    let plain = Softmax::new(&dense, None, 0.1).expect("model");
    let p = nonzero_params(plain.layout().params);
    let (l0, g0) = drained(&plain, rows.clone(), &p);
    let (l1, g1) = drained(&Softmax::new(&dense, None, 0.1).expect("model").with_l2(l2), rows.clone(), &p);
    assert_eq!(l0, l1, "the loss is the data loss");
    for i in 0..p.len() {
        let want = if i < 36 { n * l2 * p[i] } else { 0.0 };
        assert!(close(g1[i] - g0[i], want), "softmax param {i}: {} vs {want}", g1[i] - g0[i]);
    }
    // MLP 12 -> 5 -> 3: every weight gets n l2 w, the 5 + 3 biases nothing.
    let plain = Mlp::new(&dense, None, &[5], 0.1).expect("model");
    let p = nonzero_params(plain.layout().params);
    let (l0, g0) = drained(&plain, rows.clone(), &p);
    let (l1, g1) = drained(&Mlp::new(&dense, None, &[5], 0.1).expect("model").with_l2(l2), rows.clone(), &p);
    assert_eq!(l0, l1, "the loss is the data loss");
    let (mut weights, mut biases) = (0, 0);
    for i in 0..p.len() {
        let d = g1[i] - g0[i];
        if d == 0.0 {
            biases += 1;
        } else {
            assert!(close(d, n * l2 * p[i]), "mlp param {i}: {d} vs {}", n * l2 * p[i]);
            weights += 1;
        }
    }
    assert_eq!((weights, biases), (12 * 5 + 5 * 3, 5 + 3));
    // LR with its intercept: l2 w_j for each row touching j.
    let sparse = sparse_data(tmp.path());
    let plain = LogReg::new(&sparse, None, 0.5, true).expect("model");
    let p = nonzero_params(plain.layout().params);
    let (l0, g0) = drained(&plain, rows.clone(), &p);
    let (l1, g1) =
        drained(&LogReg::new(&sparse, None, 0.5, true).expect("model").with_l2(l2), rows.clone(), &p);
    assert_eq!(l0, l1, "the loss is the data loss");
    let data = peregrine_kernels::data::Dataset::open(&sparse).expect("open");
    let mut touched = vec![0u32; p.len()];
    for &j in data.sparse().expect("sparse").rows(rows).indices {
        touched[j as usize] += 1;
    }
    for i in 0..p.len() {
        let want = touched[i] as f32 * l2 * p[i];
        assert!(close(g1[i] - g0[i], want), "lr param {i}: {} vs {want}", g1[i] - g0[i]);
    }
    assert_eq!(g1[p.len() - 1], g0[p.len() - 1], "the intercept is not regularized");
    assert!(touched.iter().filter(|&&t| t > 0).count() > 10, "the rows touch features");
}

/// The MLP computes with each layer's weights a row per input, and its blocks are PyTorch's
/// `nn.Linear` layers all the same: a forward written from the blocks' values (`W` as
/// `out x in`, `y = W x + b`) gives the model's own predictions; each initial weight is drawn
/// by its place in `W`, and writing the blocks into a vector gives back the model's.
#[test]
fn the_mlp_blocks_are_pytorch_layers_whatever_order_it_computes_in() {
    let tmp = scratch("mlp-blocks");
    let dense = tmp.path().join("dense.pgd");
    gen::dense(&DenseSpec { rows: 40, cols: 12, classes: 3, noise: 0.3, seed: 4 }, &dense).expect("gen");
    let model = Mlp::new(&dense, None, &[7, 5], 0.1).expect("model");
    let n = model.layout().params;
    let mut p = vec![0.0; n];
    model.init(9, 0..n, &mut p);
    // Biases away from zero, so that a bias read as a weight (or the reverse) shows.
    let blocks = model.blocks();
    for b in blocks.iter().filter(|b| b.name.ends_with("bias")) {
        p[b.range.clone()].iter_mut().enumerate().for_each(|(i, v)| *v = 0.1 * (i as f32 - 2.0));
    }
    let names: Vec<_> = blocks.iter().map(|b| (b.name.as_str(), b.shape.clone())).collect();
    let shapes = [(12, 7), (7, 5), (5, 3)];
    for (l, &(i, o)) in shapes.iter().enumerate() {
        assert_eq!(names[2 * l], (format!("layers.{l}.weight").as_str(), vec![o, i]));
        assert_eq!(names[2 * l + 1], (format!("layers.{l}.bias").as_str(), vec![o]));
    }
    let mut offset = 0;
    let mut layers = Vec::new();
    for (l, &(i, o)) in shapes.iter().enumerate() {
        let w = blocks[2 * l].values(&p).into_owned();
        let a = (6.0 / i as f32).sqrt();
        for (at, &v) in w.iter().enumerate() {
            assert_eq!(
                v,
                peregrine_core::model::uniform(9, offset + at, a),
                "layer {l}: W[{}][{}]",
                at / i,
                at % i
            );
        }
        offset += o * (i + 1);
        layers.push((w, blocks[2 * l + 1].values(&p).into_owned()));
    }
    let mut back = vec![f32::NAN; n];
    for (b, values) in blocks.iter().zip(layers.iter().flat_map(|(w, b)| [w, b])) {
        b.place(values, &mut back);
    }
    assert_eq!(back, p, "the blocks written back");
    let mut predicted = Vec::new();
    model.predict(&p, 0..40, &mut predicted);
    let x = peregrine_kernels::data::Dataset::open(&dense).expect("open");
    let rows = x.dense().expect("dense").rows(0..40);
    for (r, got) in predicted.chunks_exact(3).enumerate() {
        let mut y: Vec<f32> = rows.features[r * 12..(r + 1) * 12].to_vec();
        for (l, (w, b)) in layers.iter().enumerate() {
            let (i, o) = shapes[l];
            y = (0..o).map(|j| b[j] + (0..i).map(|k| w[j * i + k] * y[k]).sum::<f32>()).collect();
            if l + 1 < layers.len() {
                y.iter_mut().for_each(|v| *v = v.max(0.0));
            }
        }
        let top = y.iter().copied().fold(f32::MIN, f32::max);
        let sum: f32 = y.iter().map(|v| (v - top).exp()).sum();
        for (c, (g, z)) in got.iter().zip(&y).enumerate() {
            let want = (z - top).exp() / sum;
            assert!((g - want).abs() <= 1e-5, "row {r}, class {c}: {g} vs {want}");
        }
    }
}

#[test]
fn bsp_mlp_is_the_same_for_1_2_4_ranks() {
    let tmp = scratch("mlp");
    let p = tmp.path().join("dense.pgd");
    gen::dense(&DenseSpec { rows: 3000, cols: 20, classes: 4, noise: 0.3, seed: 4 }, &p).expect("gen");
    same_model_for_every_world(|| Mlp::new(&p, None, &[16], 0.1).expect("model"), 20);
}

#[test]
fn an_mlp_split_by_units_over_each_ranks_threads_is_the_same_for_1_2_4_ranks() {
    // A team of 2 threads a rank computing every chunk (45 hidden units: 32 for one, 13 for the
    // other),
    // chunks taken over from the slowed rank 0, the owners' steps split by the same units: the
    // model of 1, 2 and 4 ranks, and that of threads computing chunks of their own.
    let tmp = scratch("mlp-units");
    let p = tmp.path().join("dense.pgd");
    gen::dense(&DenseSpec { rows: 3000, cols: 20, classes: 4, noise: 0.3, seed: 4 }, &p).expect("gen");
    let split = || Mlp::new(&p, None, &[45], 0.1).expect("model").split_units().expect("split");
    same_model_for_every_world(split, 20);
    let momentum: Optimizer = "momentum".parse().expect("optimizer");
    let exported = |m: &Mlp, world: usize| {
        let p = run_local(world, |t| final_params_by(&t, m, 20, scheme("bsp"), momentum))
            .expect("world")
            .remove(0)
            .expect("rank 0");
        m.blocks().iter().flat_map(|b| b.values(&p).into_owned()).collect::<Vec<f32>>()
    };
    let rows = exported(&Mlp::new(&p, None, &[45], 0.1).expect("model"), 1);
    for world in [1, 2] {
        let d = distance(&exported(&split(), world), &rows);
        assert!(d <= 1e-3, "{world} ranks split by units vs by rows: {d:e}");
    }
}

#[test]
fn runs_of_chunks_computed_in_one_call_give_the_same_mlp() {
    // A rank taking 4 chunks of 8 rows at a time computes them in one call, its MLP buffers
    // (sized for 8 rows) grown to 32. One thread a rank, nothing taken over, momentum (the
    // owners add the ranks' gradients in a fixed order): both runs are deterministic, and differ
    // only in how the products group their sums. (Where threads or taking over change the
    // grouping from run to run, a ReLU unit's gate now and then flips on that last-bit noise
    // for a row, and two ranks' model moved up to 1.3e-3 from one rank's, one chunk at a time
    // as before: what joining does to the rows is checked exactly with counters, below.)
    let tmp = scratch("mlp-runs");
    let p = tmp.path().join("dense.pgd");
    gen::dense(&DenseSpec { rows: 3000, cols: 20, classes: 4, noise: 0.3, seed: 4 }, &p).expect("gen");
    let model = Mlp::new(&p, None, &[16], 0.1).expect("model");
    let momentum: Optimizer = "momentum".parse().expect("optimizer");
    let run = |grain: u32| {
        bsp_params_one_thread(2, &model, 20, momentum, |cfg| {
            cfg.chunk = 8;
            cfg.grain = grain;
        })
    };
    let (one_by_one, joined) = (run(1), run(4));
    let d = distance(&joined, &one_by_one);
    assert!(d <= BSP_TOLERANCE, "runs of 4 chunks in one call vs one chunk at a time: {d:e}");
}

#[test]
fn every_row_once_when_runs_of_chunks_are_joined() {
    // Threads take 3 chunks of 7 rows of their own at a time, and the model computes each run
    // in one call (and runs taken over, rank 0 being at a twentieth of its speed): every row
    // is still computed once an epoch, and calls over several chunks' rows happened.
    for world in [1, 2, 3] {
        for threads in [1, 2] {
            let out = run_local(world, |t| exactly_once_in(&t, scheme("bsp"), threads, 3, 3)).expect("world");
            for (r, out) in out.into_iter().enumerate() {
                let (report, widest) = out.unwrap_or_else(|e| panic!("{e}"));
                assert!(widest > 7, "{world} ranks x {threads}, rank {r}: no call over more than one chunk");
                if world > 1 && r == 0 {
                    let taken: u64 = report.per_rank.iter().map(|t| t.taken).sum();
                    assert!(taken > 0, "{world} ranks x {threads}: nothing taken over");
                }
            }
        }
    }
}

#[test]
fn active_threads_change_between_iterations() {
    for world in [1, 3] {
        for r in run_local(world, |t| exactly_once_elastic(&t, 2)).expect("world") {
            let (_, lines) = r.unwrap_or_else(|e| panic!("{e}"));
            let threads: Vec<&str> = lines
                .iter()
                .map(|l| l.split("\"threads\":").nth(1).and_then(|x| x.split(',').next()).expect("threads"))
                .collect();
            assert_eq!(&threads[..7], ["1", "1", "1", "2", "2", "2", "1"], "{lines:?}");
        }
    }
}

/// The value of a numeric field of a metrics line.
fn field(line: &str, key: &str) -> String {
    line.split(&format!("\"{key}\":")).nth(1).and_then(|x| x.split([',', '}']).next()).expect(key).to_owned()
}

#[test]
fn injected_delays_and_thread_counts_reach_the_metrics() {
    let inject = Injection { pattern: "slow-worker:p=0.5,max=2".parse().expect("pattern"), seed: 9 };
    for (rank, lines) in
        run_local(2, |t| injected(&t, inject.clone())).expect("world").into_iter().enumerate()
    {
        let lines = lines.unwrap_or_else(|e| panic!("{e}"));
        for (it, l) in lines.iter().enumerate() {
            let got: f64 = field(l, "delay").parse().expect("a number");
            assert_eq!(got, inject.delay(rank, it as u64), "rank {rank} iteration {it}: {l}");
        }
        assert!(lines.iter().any(|l| field(l, "delay") != "0.0"), "no iteration delayed");
    }
    let fewer = Injection { pattern: "persistent:rank=1,threads=1".parse().expect("pattern"), seed: 1 };
    let out = run_local(2, |t| injected(&t, fewer.clone())).expect("world");
    for (rank, lines) in out.into_iter().enumerate() {
        let want = if rank == 1 { "1" } else { "2" };
        assert!(lines.expect("rank").iter().all(|l| field(l, "threads") == want), "rank {rank}");
    }
}

#[test]
fn a_disruptor_shows_in_the_metrics() {
    let inject =
        Injection { pattern: "disrupted:p=1,period=0.05,intensity=100".parse().expect("pattern"), seed: 1 };
    let lines = run_local(1, |t| injected(&t, inject.clone())).expect("world").remove(0).expect("rank");
    // Always on (p = 1) but between two periods for an instant: most iterations see it burning.
    let on = lines.iter().filter(|l| l.contains("\"disrupted\":true")).count();
    assert!(on * 2 > lines.len(), "{on} of {} iterations disrupted", lines.len());
}

#[test]
fn dynsgd_scales_updates_by_their_staleness() {
    // One rank: nobody else pushes, staleness 0, every row counted exactly once per epoch.
    let (p, lines) = run_local(1, |t| counted(&t, scheme("dynsgd"), Injection::default(), 2))
        .expect("world")
        .remove(0)
        .expect("1 rank");
    assert!(p.iter().all(|&c| c == 2.0) && lines.iter().all(|l| field(l, "staleness") == "0"));
    // Two ranks, one slowed: updates are scaled by 1 / (1 + staleness), so counts stay in
    // (0, epochs], and fall below where staleness was seen. Rank 0 at a tenth of its speed: at a
    // third, the fast rank's threads starved by a loaded machine kept pace with it in 4 of 30
    // runs, and no update was stale. Without taking over: with it, on a loaded machine the fast
    // rank took rank 0's chunks as they were queued and left it nothing stale to push (seen
    // once in a CI run); taking over is checked by the exactly-once tests.
    let slow = peregrine_tests::training::slowed(0, 0.1);
    let out = run_local(2, |t| counted_with(&t, scheme("dynsgd"), slow.clone(), 2, false)).expect("world");
    let mut stale = 0;
    for r in out {
        let (p, lines) = r.expect("rank");
        assert!(p.iter().all(|&c| c > 0.0 && c <= 2.0), "{p:?}");
        assert!(p.iter().any(|&c| c < 2.0), "no update was scaled");
        stale += lines.iter().filter(|l| field(l, "staleness") != "0").count();
    }
    assert!(stale > 0, "no stale update recorded");
}

fn check_backup(scheme: Scheme, fixed: bool) {
    // Three ranks, rank 0 at a tenth of its speed: iterations apply the first two updates (scaled
    // by 3/2), rank 0's mostly come too late and it skips ahead.
    let slow = peregrine_tests::training::slowed(0, 0.1);
    let out = run_local(3, |t| counted(&t, scheme.clone(), slow.clone(), 3)).expect("world");
    let out: Vec<_> = out.into_iter().map(|r| r.expect("rank")).collect();
    for (p, _) in &out {
        // Static: every applied update was scaled by 3/2. Dynamic: the first iteration (no compute
        // times yet) applies all three updates unscaled.
        if fixed {
            assert!(
                p.iter().all(|&c| (c / 1.5 - (c / 1.5).round()).abs() < 1e-4),
                "counts not multiples of 1.5"
            );
        }
        assert!(p.iter().any(|&c| c > 0.0));
    }
    let dropped = |r: usize| out[r].1.iter().filter(|l| l.contains("\"dropped\":true")).count();
    let iters = |r: usize| out[r].1.len();
    // Dynamic: b is 0 until every rank has reported a compute time, and a noisy measurement can
    // keep the slow rank in now and then.
    let share = if fixed { 2 } else { 3 };
    assert!(dropped(0) * share > iters(0), "rank 0 dropped {} of {}", dropped(0), iters(0));
    assert!(dropped(1) + dropped(2) < iters(1) / 2, "fast ranks dropped {} and {}", dropped(1), dropped(2));
    assert!(iters(0) < iters(1), "rank 0 did not skip ahead");
    // Static: b = 1 always. Dynamic: chosen from measured compute times on a shared machine, so
    // most iterations, not all, leave the slow rank out.
    let one = out[1].1.iter().skip(1).filter(|l| field(l, "backups") == "1").count();
    let rest = iters(1) - 1;
    assert!(if fixed { one == rest } else { one * 3 > rest * 2 }, "b = 1 in {one} of {rest} iterations");
}

#[test]
fn static_backup_workers_drop_the_late_update() {
    check_backup(scheme("backup:1"), true);
}

#[test]
fn dynamic_backup_workers_leave_out_the_slow_rank() {
    check_backup(scheme("backup-dynamic"), false);
}

#[test]
fn a_rank_0_that_skips_ahead_asks_for_the_evaluations_it_skipped() {
    // Rank 0 at a tenth of its speed under backup workers skips ahead to the others' iteration.
    // It asks for an evaluation at each of its iterations that reached a multiple of 3 or went
    // past one (once for several), not only at those that land on one. Its skips follow the
    // timing: a run whose every skip landed on a multiple (seen: 6, 12, 18, ...) tests nothing
    // and is run again.
    use peregrine_tests::training::{counting_config, slowed, train_counting};
    let every = 3;
    let cfg = Config { eval_every: every, ..counting_config(scheme("backup:1"), slowed(0, 0.1), 10, true) };
    let iterations = cfg.iterations;
    for _ in 0..5 {
        let out = run_local(3, |t| train_counting(&t, cfg.clone(), std::time::Duration::from_micros(20)))
            .expect("world");
        let (report, lines) = out.into_iter().next().expect("rank 0").expect("rank 0 trains");
        let (mut before, mut asked, mut past) = (0u64, 0usize, 0usize);
        for l in &lines {
            let done = field(l, "iter").parse::<u64>().expect("iter") + 1;
            if done / every > before / every && done < iterations {
                asked += 1;
                past += usize::from(done % every != 0);
            }
            before = done;
        }
        // One evaluation for each request, and the final one.
        let at: Vec<u64> = report.evals.iter().map(|e| e.iter).collect();
        assert_eq!(at.len(), asked + 1, "evaluations at {at:?}");
        if past > 0 {
            return;
        }
    }
    panic!("in 5 runs rank 0 never skipped past a multiple of {every}");
}

#[test]
fn every_chunk_once_under_falcon() {
    check_exactly_once(scheme("falcon"));
}

#[test]
fn every_chunk_once_under_falcon_slack() {
    check_exactly_once(scheme("falcon:slack:2"));
}

#[test]
fn every_chunk_once_under_flexrr() {
    check_exactly_once(scheme("flexrr:2"));
}

#[test]
fn every_chunk_once_under_speculative_execution() {
    check_exactly_once(scheme("speculative"));
}

/// Two counting ranks over 2 epochs under `scheme`, rank 0 at a fifth of its speed, taking over
/// if `steal`: after checking every row was applied once per epoch, a function summing a metrics
/// field over one rank's iterations.
fn two_ranks_rank0_slowed(scheme: Scheme, steal: bool) -> impl Fn(usize, &str) -> u64 {
    let slow = peregrine_tests::training::slowed(0, 0.2);
    let out: Vec<_> = run_local(2, |t| counted_with(&t, scheme.clone(), slow.clone(), 2, steal))
        .expect("world")
        .into_iter()
        .map(|r| r.expect("rank"))
        .collect();
    for (params, _) in &out {
        assert!(params.iter().all(|&c| c == 2.0), "{scheme}: a row not applied once per epoch");
    }
    move |r, f| out[r].1.iter().map(|l| field(l, f).parse::<u64>().expect(f)).sum()
}

#[test]
fn flexrr_reassigns_before_running_out_of_work() {
    // The slow rank's helper takes chunks over after its own chunks, not only once idle, and the
    // metrics say so.
    let sum = two_ranks_rank0_slowed(scheme("flexrr:2"), true);
    assert!(sum(1, "reassigned") > 0, "rank 1 reassigned nothing from the slow rank");
    assert!(sum(1, "reassigned") <= sum(1, "taken"));
    assert_eq!(sum(0, "cloned") + sum(1, "cloned"), 0);
}

#[test]
fn speculative_copies_of_a_slow_ranks_chunks_win() {
    // Without taking over: rank 1's idle threads copy the chunks rank 0 is running, win most
    // races (a copy takes a fifth of the time) and rank 0 drops its results.
    let sum = two_ranks_rank0_slowed(scheme("speculative"), false);
    let (won, lost) = (sum(1, "cloned"), sum(0, "discarded"));
    assert!(won > 0 && lost > 0, "copies won {won}, rank 0 dropped {lost}");
    assert_eq!(sum(0, "taken") + sum(1, "taken"), 0, "chunks taken over with stealing off");
    assert_eq!(sum(0, "cloned"), 0, "the slow rank copied the fast one's chunks");
    // Rank 0's own chunks plus the copies that beat it: all of rank 0's chunks.
    let plan = Plan::new(997, 200, 2, 7, 1).expect("plan");
    let mine: u64 = (0..2 * plan.iters_per_epoch()).map(|t| u64::from(plan.chunks(t, 0))).sum();
    assert_eq!(sum(0, "own") + won, mine);
}

/// LR on 3 ranks (rank 0 at half speed) under `scheme` against BSP on 1 rank: the same model.
fn gives_the_bsp_model(scheme: Scheme) {
    let tmp = scratch(&scheme.to_string().replace(':', "-"));
    let data = sparse_data(tmp.path());
    let make = || LogReg::new(&data, None, 0.5, true).expect("model");
    let one = run_local(1, |t| final_params(&t, &make(), 30)).expect("world").remove(0).expect("1 rank");
    for (r, p) in run_local(3, |t| final_params_with(&t, &make(), 30, scheme.clone()))
        .expect("world")
        .into_iter()
        .enumerate()
    {
        let d = distance(&p.unwrap_or_else(|e| panic!("rank {r}: {e}")), &one);
        assert!(d <= BSP_TOLERANCE, "{scheme} on 3 ranks vs BSP on 1: {d:e}");
    }
}

#[test]
fn speculative_execution_gives_the_bsp_model() {
    // Copies of a chunk compute the same result from the same parameters and only one is
    // applied: the model is BSP's, however many copies ran.
    gives_the_bsp_model(scheme("speculative"));
}

#[test]
fn falcon_enforced_gives_the_bsp_model() {
    // Enforced synchronization keeps BSP's semantics: projection and transfer only move chunks.
    gives_the_bsp_model(scheme("falcon"));
}

fn check_lb_bsp(name: &str) {
    // Rank 0 at a quarter of its speed: every row still computed once per epoch, and after a
    // few iterations rank 0 gets the smaller share of each batch (about a fifth).
    let slow = peregrine_tests::training::slowed(0, 0.25);
    let out: Vec<_> = run_local(2, |t| counted(&t, scheme(name), slow.clone(), 6))
        .expect("world")
        .into_iter()
        .map(|r| r.expect("rank"))
        .collect();
    for (params, _) in &out {
        assert!(params.iter().all(|&c| c == 6.0), "{name}: a row not computed once per epoch");
    }
    let rows =
        |r: usize| -> Vec<u64> { out[r].1.iter().map(|l| field(l, "rows").parse().expect("rows")).collect() };
    let (slow_rows, fast_rows) = (rows(0), rows(1));
    let late = slow_rows.len() / 2..slow_rows.len();
    let (s, f): (u64, u64) = (slow_rows[late.clone()].iter().sum(), fast_rows[late].iter().sum());
    assert!((s as f64) < 0.8 * f as f64, "{name}: slow rank computed {s} rows, fast {f}");
    assert!(out[0].1.iter().all(|l| field(l, "predicted").parse::<f64>().expect("predicted") > 0.0));
}

#[test]
fn lb_bsp_sizes_batches_by_predicted_speed() {
    check_lb_bsp("lb-bsp:arx");
    check_lb_bsp("lb-bsp:ma");
    check_lb_bsp("lb-bsp:narx");
}

/// A small corpus in LDA-C: 120 documents of 5 to 34 tokens over 50 words.
fn lda_corpus(dir: &Path) -> PathBuf {
    let mut text = String::new();
    for d in 0..120u64 {
        let mut words: Vec<(u64, u64)> = Vec::new();
        let n = 5 + peregrine_core::plan::mix(d) % 30;
        for t in 0..n {
            let w = peregrine_core::plan::mix(d * 1000 + t) % 50;
            match words.iter_mut().find(|(x, _)| *x == w) {
                Some((_, c)) => *c += 1,
                None => words.push((w, 1)),
            }
        }
        words.sort_unstable();
        let pairs: Vec<String> = words.iter().map(|(w, c)| format!("{w}:{c}")).collect();
        text.push_str(&format!("{} {}\n", words.len(), pairs.join(" ")));
    }
    let (ldac, pgd) = (dir.join("corpus.ldac"), dir.join("corpus.pgd"));
    std::fs::write(&ldac, text).expect("write corpus");
    peregrine_kernels::data::bow::convert(&ldac, &pgd, peregrine_kernels::data::bow::Format::Ldac, None)
        .expect("convert corpus");
    pgd
}

/// LDA's count tables stay exactly the counts of its tokens' topics under every scheme whose pulls
/// follow every earlier update, with rank 0 at half speed and chunks taken over: each chunk's
/// update lands once, or (a speculative copy's) not at all, never in part. The other schemes are
/// refused, naming the ones LDA runs under (a stale read of a document's topics, measured under
/// backup workers, FlexRR and slack Falcon, left counts below zero).
#[test]
fn lda_counts_stay_the_counts_of_the_topics_under_every_scheme() {
    use peregrine_core::engine::{self, Config};
    use peregrine_core::model::lda::Lda;
    use peregrine_core::pool::{Pinning, RankPool};
    use peregrine_core::SchemeSpec;
    let dir = scratch("lda");
    let pgd = lda_corpus(dir.path());
    for name in peregrine_tests::SCHEMES {
        let out = run_local(2, |t| {
            let model = Lda::new(&pgd, None, 5, 0.1, 0.01).map_err(|e| e.to_string())?;
            let cfg = Config {
                scheme: SchemeSpec::new(scheme(name), true),
                batch: 40,
                chunk: 4,
                iterations: 12,
                threads: 2,
                inject: peregrine_tests::training::slowed(0, 0.5),
                keep_params: true,
                ..Config::default()
            };
            let pool = RankPool::new(2, peregrine_tests::training::slot(&t), Pinning::Off)
                .map_err(|e| e.to_string())?;
            let r = match engine::train(&t, &model, &cfg, &pool, None, &mut |_| {}) {
                Err(e) if !cfg.scheme.scheme.pulls_every_update() => {
                    let e = e.to_string();
                    assert!(
                        e.contains("bsp, lb-bsp, lb-bsp:ma, lb-bsp:narx, speculative, falcon")
                            && e.contains(name),
                        "{name}: {e}"
                    );
                    return Ok(0);
                }
                r => r.map_err(|e| format!("{name}: {e}"))?,
            };
            let params = r.params.ok_or("no parameters")?;
            model.check_counts(&params).map_err(|e| format!("{name}: {e}"))?;
            Ok::<_, String>(r.iterations)
        })
        .expect("world");
        for r in out {
            r.unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// DBW without backup workers: every edge exchanges every iteration, each iteration's averaging
/// matrix is doubly stochastic, and so the replicas' average (the model a run reports) moves by
/// exactly the average of the ranks' updates: every row counted once, as under BSP, on a ring and
/// on the complete graph, with rank 0 slowed (everyone then waits for it, directly or through a
/// neighbour).
#[test]
fn dbw_without_backups_counts_every_row_once_in_the_replicas_average() {
    for name in ["dbw:ring:0", "dbw:complete:0"] {
        for world in [1, 2, 3, 4] {
            let out =
                run_local(world, |t| counted(&t, scheme(name), peregrine_tests::training::slowed(0, 0.5), 2))
                    .expect("world");
            for (rank, r) in out.into_iter().enumerate() {
                let (p, lines) = r.unwrap_or_else(|e| panic!("{name}, {world} ranks: {e}"));
                if let Some((row, c)) = p.iter().enumerate().find(|(_, &c)| (c - 2.0).abs() > 1e-3) {
                    panic!("{name}, {world} ranks: row {row} counted {c} times in 2 epochs");
                }
                assert!(lines.iter().all(|l| field(l, "dropped") == "false"), "{name}: rank {rank} dropped");
            }
        }
    }
}

/// Dynamic DBW on a ring of 4 with rank 0 at 0.15 of its speed (at a quarter, its share of
/// dropped updates ranged over 0.23-0.92 on the 2-core machine under the suite, twice under the
/// 0.25 margin; at 0.15, 0.70-1.00): its neighbours (1 and 3)
/// stop waiting for it (one backup worker each) more often than rank 2, opposite, which keeps
/// waiting for both of its fast neighbours; rank 0's updates reach nobody far more often than
/// anyone else's (about every other iteration: it then pulls its neighbours' estimates and skips
/// ahead to their iteration, where it often arrives first and exchanges).
#[test]
fn dynamic_dbw_leaves_the_slow_neighbour_out() {
    let slow = peregrine_tests::training::slowed(0, 0.15);
    let per_row = std::time::Duration::from_micros(200);
    let out = run_local(4, |t| {
        peregrine_tests::training::counted_by(&t, scheme("dbw"), slow.clone(), 4, false, per_row)
    })
    .expect("world");
    let lines: Vec<Vec<String>> = out.into_iter().map(|r| r.expect("rank").1).collect();
    let share = |r: usize, key: &str, value: &str| {
        let n = lines[r].iter().skip(1).filter(|l| field(l, key) == value).count();
        n as f64 / (lines[r].len() - 1).max(1) as f64
    };
    let two = share(2, "backups", "1");
    for r in [1, 3] {
        let b1 = share(r, "backups", "1");
        assert!(
            b1 > 0.5 && b1 > two + 0.2,
            "b = 1 in {b1:.2} of rank {r}'s iterations, {two:.2} of rank 2's"
        );
    }
    let dropped = share(0, "dropped", "true");
    let others = (1..4).map(|r| share(r, "dropped", "true")).fold(0.0, f64::max);
    assert!(dropped > others + 0.25, "rank 0 dropped {dropped:.2}, the others at most {others:.2}");
    assert!(
        lines[0].len() < lines[2].len(),
        "rank 0 ran {} iterations, rank 2 {}",
        lines[0].len(),
        lines[2].len()
    );
}

/// DBW's replicas drift apart between exchanges and are pulled together by them: the consensus
/// distance the evaluations report is positive, and with a decaying learning rate it comes below
/// where it started, on a ring of 4 with rank 1 at half speed; the average model learns. Without
/// backups (every edge exchanges every iteration) the later half of the evaluations sits below
/// the start (their median); dynamic DBW's exchanges follow the timing, and a replica left out of
/// the last ones drifts (its distance ended at 0.08 against a start of 0.03 once under the
/// suite, and one evaluation in the middle at 0.058 against 0.039), so there some evaluation of
/// the later half is below the start. Rank 1 is the slow one, not rank 0: rank 0 asks for the
/// evaluations at its own iterations, and a slow rank 0 under dynamic DBW skips ahead to its
/// neighbours' iteration, asking once for the points it skipped (before it asked for none of
/// them, and twice it asked once only).
#[test]
fn dbw_replicas_come_together() {
    use peregrine_core::engine::{self, Config};
    use peregrine_core::optim::{Decay, Schedule};
    use peregrine_core::pool::{Pinning, RankPool};
    use peregrine_core::SchemeSpec;
    let tmp = scratch("dbw");
    let data = sparse_data(tmp.path());
    for name in ["dbw", "dbw:ring:0"] {
        let out = run_local(4, |t| {
            let model = LogReg::new(&data, None, 0.5, true).map_err(|e| e.to_string())?;
            let cfg = Config {
                scheme: SchemeSpec::new(scheme(name), false),
                batch: 200,
                chunk: 10,
                iterations: 150,
                threads: 1,
                inject: peregrine_tests::training::slowed(1, 0.5),
                eval_every: 5,
                schedule: Schedule { warmup: 0, decay: Decay::Inverse(1.0) },
                ..Config::default()
            };
            let pool = RankPool::new(1, peregrine_tests::training::slot(&t), Pinning::Off)
                .map_err(|e| e.to_string())?;
            let r = engine::train(&t, &model, &cfg, &pool, None, &mut |_| {}).map_err(|e| e.to_string())?;
            Ok::<_, String>(r.evals)
        })
        .expect("world");
        let evals = out.into_iter().next().expect("rank 0").unwrap_or_else(|e| panic!("{name}: {e}"));
        let c: Vec<f64> = evals.iter().map(|e| e.consensus.expect("a replicated run reports it")).collect();
        assert!(c.len() >= 3 && c[0] > 0.0, "{name}: consensus distance {c:?}");
        let mut later = c[c.len() / 2..].to_vec();
        later.sort_by(f64::total_cmp);
        if name == "dbw" {
            // Dynamic DBW leaves a late replica out of some exchanges, and how far the replicas
            // drift first depends on the timing (the first evaluation, at iteration 5, finds them
            // still nearly equal: 0.03; once, under the whole suite, the distance peaked at 0.21
            // and was back to 0.076 at the end). Judged: the later half comes down to at most half
            // its peak.
            let peak = c.iter().copied().fold(0.0, f64::max);
            assert!(later[0] <= 0.5 * peak, "{name}: consensus distance {c:?}");
        } else {
            assert!(later[later.len() / 2] < c[0], "{name}: consensus distance {c:?}");
        }
        let (first, last) = (evals[0].loss, evals[evals.len() - 1].loss);
        assert!(last < first && last < 0.9 * std::f64::consts::LN_2, "{name}: loss {first} -> {last}");
    }
}
