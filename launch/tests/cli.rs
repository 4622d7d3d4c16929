//! The `peregrine` binary as a user runs it: help, bad input, and the commands end to end (local
//! threads always; `mpirun` when built with `--features mpi`).

use std::process::{Command, Output};

fn peregrine(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peregrine")).args(args).output().expect("run peregrine")
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn help_lists_the_commands() {
    let out = peregrine(&["--help"]);
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    for word in ["conformance", "bench", "mpirun -n 4 peregrine conformance"] {
        assert!(stdout.contains(word), "--help lacks `{word}`:\n{stdout}");
    }
}

#[test]
fn conformance_passes_on_local_ranks() {
    let out = peregrine(&["conformance", "--ranks", "3", "--tickets", "2000"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("conformance: all cases passed on 3 ranks (local)"), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok ")).count(), 9, "{stdout}");
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        &["conformance", "--ranks", "0"][..],
        &["conformance", "--backend", "tcp"],
        &["bench", "rma", "--min-size", "12"],
        &["bench", "rma", "--max-size", "4G"],
        &["bench", "rma", "--trials", "0"],
    ] {
        let out = peregrine(args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("error:"), "{args:?}: {stderr}");
    }
    let out = peregrine(&["bench", "rma", "--backend", "local", "--min-size", "64", "--max-size", "8"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("--min-size 64 is larger than --max-size 8"));
}

#[cfg(not(feature = "mpi"))]
#[test]
fn asking_for_mpi_without_the_feature_names_the_feature() {
    let out = peregrine(&["conformance", "--backend", "mpi"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("rebuild with `--features mpi`"), "{stderr}");
    // Started by an MPI launcher, `--backend auto` asks for MPI too.
    let out = Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(["conformance"])
        .env("PMIX_RANK", "0")
        .output()
        .expect("run peregrine");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).1.contains("rebuild with `--features mpi`"), "{:?}", text(&out));
}

#[test]
fn rma_bench_prints_every_operation_on_local_ranks() {
    let out = peregrine(&[
        "bench",
        "rma",
        "--backend",
        "local",
        "--max-size",
        "64",
        "--iters",
        "200",
        "--trials",
        "1",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for op in ["get", "put", "accumulate", "fetch_add"] {
        assert!(stdout.lines().any(|l| l.starts_with(op)), "no `{op}` line:\n{stdout}");
    }
    // 4 latency lines + 3 operations x sizes 8..64 (4 sizes).
    let rows = stdout.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(rows, 4 + 3 * 4, "{stdout}");
}

#[cfg(feature = "mpi")]
mod mpi {
    use peregrine_tests::{assert_success, mpirun_n};
    use std::path::Path;

    fn exe() -> &'static Path {
        Path::new(env!("CARGO_BIN_EXE_peregrine"))
    }

    #[test]
    fn conformance_under_mpirun() {
        let out = mpirun_n(2, exe(), &["conformance", "--tickets", "5000"]);
        assert_success("mpirun -n 2 peregrine conformance", &out);
        assert!(String::from_utf8_lossy(&out.stdout).contains("all cases passed on 2 ranks (mpi)"));
    }

    #[test]
    fn rma_bench_under_mpirun_reports_raw_mpi() {
        let out =
            mpirun_n(2, exe(), &["bench", "rma", "--max-size", "1K", "--iters", "1000", "--trials", "1"]);
        assert_success("mpirun -n 2 peregrine bench rma", &out);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let get = stdout.lines().find(|l| l.starts_with("get ")).expect("a get line");
        assert!(!get.contains(" - "), "no raw-MPI figure in `{get}`");
    }

    #[test]
    fn an_error_on_every_rank_exits_non_zero_without_hanging() {
        let out = mpirun_n(2, exe(), &["conformance", "--ranks", "2"]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("under MPI the launcher sets it"));
    }
}

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("peregrine-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

#[test]
fn data_convert_info_and_gen() {
    let d = scratch("data");
    let input = d.join("in.svm");
    std::fs::write(&input, "+1 1:0.5 4:1\n-1 2:2\n").expect("write");
    let out = d.join("in.prg");
    let s = |p: &std::path::Path| p.to_str().expect("utf8 path").to_owned();
    let o = peregrine(&["data", "convert", "libsvm", &s(&input), &s(&out)]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(text(&o).0.contains("2 rows, 4 columns, 3 values"), "{:?}", text(&o));
    let o = peregrine(&["data", "info", "--verify", &s(&out)]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(text(&o).0.contains("rows 2  features 4  nonzeros 3"), "{:?}", text(&o));

    let gen = d.join("gen.prg");
    let o = peregrine(&[
        "data",
        "gen",
        "ratings",
        &s(&gen),
        "--ratings",
        "1000",
        "--users",
        "20",
        "--items",
        "30",
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = peregrine(&["data", "info", "--verify", &s(&gen)]);
    assert!(text(&o).0.contains("ratings 1000  users 20  items 30"), "{:?}", text(&o));
}

#[test]
fn bad_data_is_a_clear_error_and_leaves_nothing_behind() {
    let d = scratch("bad-data");
    let input = d.join("bad.svm");
    std::fs::write(&input, "+1 1:1\n-1 3:1 2:1\n").expect("write");
    let out = d.join("bad.prg");
    let s = |p: &std::path::Path| p.to_str().expect("utf8 path").to_owned();
    let o = peregrine(&["data", "convert", "libsvm", &s(&input), &s(&out)]);
    assert_eq!(o.status.code(), Some(1));
    let (_, stderr) = text(&o);
    assert!(stderr.contains(&format!("{}:2:8: expected an index above 3", input.display())), "{stderr}");
    assert_eq!(std::fs::read_dir(&d).expect("list").count(), 1, "only the input is left");

    let o = peregrine(&["data", "info", &s(&input)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("not a Peregrine dataset"), "{:?}", text(&o));
    let o = peregrine(&["data", "info", &s(&d.join("missing.prg"))]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("missing.prg: opening"), "{:?}", text(&o));
}
