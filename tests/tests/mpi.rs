//! Multi-rank checks over the `mpi` backend: the SPMD programs (conformance, stealing, training) under
//! `mpirun -n 2` and `-n 4` (`$PEREGRINE_MPIRUN` picks the launcher: OpenMPI's `mpirun` by default,
//! `mpirun.mpich` for the MPICH leg, built with `MPICC=mpicc.mpich`).

use peregrine_tests::{assert_conformance_passed, assert_success, mpirun_n};
use std::path::Path;

fn conformance(ranks: usize) {
    let exe = Path::new(env!("CARGO_BIN_EXE_conformance"));
    // One node, OpenMPI's osc/sm or MPICH: shared windows are read whole in place.
    let mut args = vec!["--backend", "mpi", "--whole-in-place", "yes"];
    // MPICH (ch4:ucx) busy-polls: oversubscribed, each barrier costs tens of milliseconds and
    // contended atomics run ~100x slower, so its 4-rank leg runs 10x fewer loop iterations (10,000
    // tickets per rank, 20 rounds) to stay within CI time. OpenMPI runs the full suite.
    let oversubscribed = ranks > std::thread::available_parallelism().map_or(1, |n| n.get());
    if peregrine_tests::mpirun().contains("mpich") && oversubscribed {
        args.extend(["--tickets", "10000", "--rounds", "20"]);
    }
    let out = mpirun_n(ranks, exe, &args);
    assert_success(&format!("mpirun -n {ranks} conformance"), &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_conformance_passed(&stdout, ranks, &format!("mpirun -n {ranks}"));
}

#[test]
fn conformance_on_2_ranks() {
    conformance(2);
}

#[test]
fn conformance_on_4_ranks() {
    conformance(4);
}

/// Chunk queues under mpirun: threads of every rank take their own chunks and take over other
/// ranks' chunks; each is handed out exactly once.
fn stealing(ranks: usize) {
    let exe = Path::new(env!("CARGO_BIN_EXE_stealing"));
    let out = mpirun_n(ranks, exe, &["--backend", "mpi", "--iterations", "10", "--threads", "2"]);
    assert_success(&format!("mpirun -n {ranks} stealing"), &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("exactly once: {ranks} ranks")), "{stdout}");
}

#[test]
fn stealing_on_2_ranks() {
    stealing(2);
}

#[test]
fn stealing_on_4_ranks() {
    stealing(4);
}

/// The clocks' combining trees under mpirun: "every rank's chunks done" and "every clock at least
/// c" said exactly when every rank's words say so (ranks as processes, 2 threads each counting
/// other ranks' chunks done).
fn clocks(ranks: usize) {
    let exe = Path::new(env!("CARGO_BIN_EXE_clocks"));
    let out = mpirun_n(ranks, exe, &["--backend", "mpi", "--iterations", "20", "--threads", "2"]);
    assert_success(&format!("mpirun -n {ranks} clocks"), &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("every rank's words: {ranks} ranks")), "{stdout}");
}

#[test]
fn clocks_on_2_ranks() {
    clocks(2);
}

#[test]
fn clocks_on_8_ranks() {
    clocks(8);
}

/// The training engine under mpirun: every chunk computed exactly once under BSP, SSP and ASP
/// with rank 0 slowed down (others take its chunks over).
fn training_exactly_once(ranks: usize) {
    let exe = Path::new(env!("CARGO_BIN_EXE_training"));
    // MPICH busy-polls: oversubscribed, one compute thread per rank (else 4 x (2 + 1) busy
    // threads on 2 cores leave too little time for anyone to take chunks over).
    let oversubscribed = ranks > std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = if peregrine_tests::mpirun().contains("mpich") && oversubscribed { "1" } else { "2" };
    let out = mpirun_n(ranks, exe, &["exactly-once", "--backend", "mpi", "--threads", threads]);
    assert_success(&format!("mpirun -n {ranks} training exactly-once"), &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for s in ["bsp", "ssp:2", "asp", "falcon"] {
        assert!(
            stdout.contains(&format!("training {s}: every chunk computed exactly once, {ranks} ranks")),
            "{stdout}"
        );
    }
    assert!(stdout.contains("training elastic: every chunk computed exactly once"), "{stdout}");
}

#[test]
fn training_exactly_once_on_2_ranks() {
    training_exactly_once(2);
}

#[test]
fn training_exactly_once_on_4_ranks() {
    training_exactly_once(4);
}

/// A model's loss on its evaluation rows.
type Loss<'a> = dyn Fn(&[f32]) -> f64 + 'a;

/// Holds the parameters `got` that `mpirun -n ranks` trained under optimizer `name` to the local
/// ranks' `want`: by `loss`, within 5 %, where the order the ranks' pushes land in changes the
/// model (then `want` is as many local ranks'), else parameter by parameter within
/// `BSP_TOLERANCE` (the order of floating-point sums only).
fn assert_same_model(name: &str, ranks: usize, got: &[f32], want: &[f32], loss: Option<&Loss<'_>>) {
    use peregrine_tests::training::{distance, BSP_TOLERANCE};
    if let Some(loss) = loss {
        let (got, want) = (loss(got), loss(want));
        assert!(
            (got - want).abs() <= 0.05 * want,
            "{name}: mpirun -n {ranks} loss {got}, {ranks} local ranks {want}"
        );
    } else {
        let d = distance(got, want);
        assert!(
            d <= BSP_TOLERANCE,
            "{name}: mpirun -n {ranks} vs local: parameters differ by {d:e} (relative)"
        );
    }
}

/// BSP logistic regression under mpirun -n 2 and -n 4 gives the model one local rank gives.
#[test]
fn bsp_model_is_the_same_over_mpi_and_local() {
    use peregrine_core::model::Model;
    use peregrine_core::optim::Optimizer;
    use peregrine_kernels::data::gen::{self, SparseSpec};
    use peregrine_tests::training::{final_params_by, scheme};
    let scratch = tempfile::Builder::new().prefix("peregrine-mpi-params-").tempdir().expect("scratch");
    let dir = scratch.path();
    let data = dir.join("sparse.pgd");
    gen::sparse(&SparseSpec { rows: 3000, cols: 400, nnz_per_row: 12, zipf: 1.1, seed: 2 }, &data)
        .expect("gen");
    let model = peregrine_core::model::lr::LogReg::new(&data, None, 0.5, true).expect("model");
    let local = |ranks: usize, o: Optimizer| {
        peregrine_transport::run_local(ranks, |t| final_params_by(&t, &model, 30, scheme("bsp"), o))
            .expect("world")
            .remove(0)
            .expect("local")
    };
    let exe = Path::new(env!("CARGO_BIN_EXE_training"));
    // SGD: the ranks' steps add up to one; momentum and AdaGrad: the owners step with the
    // iteration's summed gradient (the model is pulled whole under BSP); so any world gives 1
    // rank's model. FTRL (its weights derived from its state: every rank steps with its share)
    // sums the ranks' squared gradients, which tiny differences in timing change (BSP without
    // taking over does not line up: oversubscribed, a rank may pull after a faster one pushed the
    // same iteration), so it is held to the loss of the same number of local ranks, within 5%
    // (runs of either backend differ by up to ~1.5% on a loaded 2-core machine).
    for (name, same_world) in [("sgd", false), ("momentum", false), ("adagrad", false), ("ftrl", true)] {
        let o: Optimizer = name.parse().expect("optimizer");
        for ranks in [2, 4] {
            let want = local(if same_world { ranks } else { 1 }, o);
            let out_file = dir.join(format!("params-{name}-{ranks}.txt"));
            let out = mpirun_n(
                ranks,
                exe,
                &[
                    "params",
                    "--backend",
                    "mpi",
                    "--optimizer",
                    name,
                    "--data",
                    &data.to_string_lossy(),
                    "--out",
                    &out_file.to_string_lossy(),
                ],
            );
            assert_success(&format!("mpirun -n {ranks} training params --optimizer {name}"), &out);
            let text = std::fs::read_to_string(&out_file).expect("params file");
            let p: Vec<f32> = text.lines().map(|l| l.parse().expect("a number")).collect();
            let loss = |p: &[f32]| {
                let s = model.evaluate(p, 0..model.eval_rows());
                s[0] / s[2]
            };
            if same_world {
                assert!(loss(&want) < 0.6, "{name}: {ranks} local ranks reach only {}", loss(&want));
            }
            assert_same_model(name, ranks, &p, &want, same_world.then_some(&loss));
        }
    }
}

/// Sparse LR hashed to 2^17 buckets (pulled and pushed by key) under BSP with taking over,
/// under mpirun -n 2 and -n 4 on one node: the parameter windows are direct (loads and atomic
/// adds in place) and the chunks read the weights in place with no pull, the ranks lining up
/// before anyone pushes. Under SGD the model is the one 1 local rank trains (pulls there copy
/// the keys), and it learned. Under AdaGrad each rank's push reads the touched keys' state as
/// the pushes before it left it (so the model depends on the order the pushes land in), and
/// steps them with it in one pass over the keys (`Window::step_with_state`), where local ranks
/// read, step and add in three: its loss is held to that of as many local ranks, within 5 %.
#[test]
fn keyed_model_read_in_place_is_the_same_over_mpi_and_local() {
    use peregrine_core::model::Model;
    use peregrine_core::optim::Optimizer;
    use peregrine_kernels::data::gen::{self, SparseSpec};
    use peregrine_tests::training::{final_params_by, scheme};
    let scratch = tempfile::Builder::new().prefix("peregrine-mpi-hashed-").tempdir().expect("scratch");
    let dir = scratch.path();
    let data = dir.join("sparse.pgd");
    gen::sparse(&SparseSpec { rows: 3000, cols: 5000, nnz_per_row: 12, zipf: 1.1, seed: 4 }, &data)
        .expect("gen");
    let model = peregrine_core::model::lr::LogReg::with_hashing(&data, None, 0.5, true, 17).expect("model");
    assert!(model.layout().params > 1 << 16, "past dense_pull_below: pulled by key");
    let local = |ranks: usize, o: Optimizer| {
        peregrine_transport::run_local(ranks, |t| final_params_by(&t, &model, 30, scheme("bsp"), o))
            .expect("world")
            .remove(0)
            .expect("local")
    };
    let loss = |p: &[f32]| {
        let s = model.evaluate(p, 0..model.eval_rows());
        s[0] / s[2]
    };
    let exe = Path::new(env!("CARGO_BIN_EXE_training"));
    for (name, same_world) in [("sgd", false), ("adagrad", true)] {
        let o: Optimizer = name.parse().expect("optimizer");
        for ranks in [2, 4] {
            let want = local(if same_world { ranks } else { 1 }, o);
            assert!(loss(&want) < 0.6, "{name}: local ranks reach only {}", loss(&want));
            let out_file = dir.join(format!("hashed-{name}-{ranks}.txt"));
            let (d, o) = (data.to_string_lossy(), out_file.to_string_lossy());
            let out = mpirun_n(
                ranks,
                exe,
                &["hashed-params", "--backend", "mpi", "--optimizer", name, "--data", &d, "--out", &o],
            );
            assert_success(&format!("mpirun -n {ranks} training hashed-params --optimizer {name}"), &out);
            let text = std::fs::read_to_string(&out_file).expect("params file");
            let p: Vec<f32> = text.lines().map(|l| l.parse().expect("a number")).collect();
            assert_same_model(name, ranks, &p, &want, same_world.then_some(&loss));
        }
    }
}

/// BSP matrix factorization in strata under mpirun -n 2 and -n 4, where the pushes of batches
/// whose chunks touch disjoint rows put the rows' new values (`MPI_Put`, not `MPI_Accumulate`):
/// the model one local rank gives, and most pushes put values.
#[test]
fn bsp_mf_putting_new_values_is_the_same_over_mpi_and_local() {
    use peregrine_tests::training::{
        distance, final_params_of, mf_ratings, mf_strata, mf_strata_config, traced_puts, BSP_TOLERANCE,
    };
    let scratch = tempfile::Builder::new().prefix("peregrine-mpi-mf-").tempdir().expect("scratch");
    let dir = scratch.path();
    let data = mf_ratings(dir);
    let model = mf_strata(&data).expect("model");
    let want = peregrine_transport::run_local(1, |t| {
        final_params_of(&t, &model, &mf_strata_config(&t, 60, true, None))
    })
    .expect("world")
    .remove(0)
    .expect("local");
    let exe = Path::new(env!("CARGO_BIN_EXE_training"));
    for ranks in [2, 4] {
        let (out_file, trace) = (dir.join(format!("mf-{ranks}.txt")), dir.join(format!("trace-{ranks}")));
        std::fs::create_dir(&trace).expect("trace dir");
        let (d, o, tr) = (data.to_string_lossy(), out_file.to_string_lossy(), trace.to_string_lossy());
        let out = mpirun_n(
            ranks,
            exe,
            &["mf-params", "--backend", "mpi", "--data", &d, "--out", &o, "--trace", &tr],
        );
        assert_success(&format!("mpirun -n {ranks} training mf-params"), &out);
        let text = std::fs::read_to_string(&out_file).expect("params file");
        let p: Vec<f32> = text.lines().map(|l| l.parse().expect("a number")).collect();
        let d = distance(&p, &want);
        assert!(d <= BSP_TOLERANCE, "mpirun -n {ranks} vs local: parameters differ by {d:e} (relative)");
        let (pushes, puts) = traced_puts(&trace).expect("trace");
        assert!(
            puts >= pushes / 2 && puts < pushes,
            "mpirun -n {ranks}: {puts} of {pushes} pushes put values"
        );
    }
}
