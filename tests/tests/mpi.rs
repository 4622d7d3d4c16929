//! The conformance suite over the `mpi` backend: the `conformance` SPMD program under
//! `mpirun -n 2` and `-n 4` (`$PEREGRINE_MPIRUN` picks the launcher: OpenMPI's `mpirun` by default,
//! `mpirun.mpich` for the MPICH leg, built with `MPICC=mpicc.mpich`).

use peregrine_tests::{assert_success, mpirun_n};
use std::path::Path;

fn conformance(ranks: usize) {
    let exe = Path::new(env!("CARGO_BIN_EXE_conformance"));
    let mut args = vec!["--backend", "mpi"];
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
    let expected = format!("conformance: all cases passed on {ranks} ranks (mpi)"); // summary_line
    assert!(stdout.contains(&expected), "missing `{expected}` in:\n{stdout}");
    // Every case reported by rank 0, none failed on any rank.
    for case in peregrine_transport::conformance::CASES {
        assert!(
            stdout.lines().any(|l| l.starts_with("ok") && l.contains(case.name)),
            "case {} not reported:\n{stdout}",
            case.name
        );
    }
    assert!(!stdout.contains("FAIL"), "{stdout}");
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
