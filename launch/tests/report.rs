//! Timelines and straggler reports end to end. A binary of its own: the report measures
//! ranks' compute rates, which the other tests running beside it on a small machine would
//! disturb (cargo runs test binaries one after another).

use std::process::{Command, Output};

#[path = "support/trace_check.rs"]
mod trace_check;
use trace_check::{check_trace, stragglers};

fn peregrine(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peregrine")).args(args).output().expect("run peregrine")
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn ok(args: &[&str]) -> (String, String) {
    let out = peregrine(args);
    let t = text(&out);
    assert!(out.status.success(), "peregrine {args:?}:\n{}\n{}", t.0, t.1);
    t
}

/// Held by each test here: one measured run at a time.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-report-{name}-")).tempdir().expect("scratch dir")
}

#[test]
fn a_traced_run_shows_the_straggler_and_the_report_names_it() {
    let _alone = alone();
    let t = scratch("trace");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    // An MLP: chunks long enough (tenths of a millisecond) for rates that noise does not swamp.
    ok(&["data", "gen", "dense", &s("d.pgd"), "--rows", "20000", "--features", "64"]);
    let train_for = |iterations: &str, run: &str, ranks: &str, straggler: &str, extra: &[&str]| {
        let base =
            ["train", "--model", "mlp", "--hidden", "64", "--data", &s("d.pgd"), "--iterations", iterations];
        let more = [
            "--batch",
            "1024",
            "--chunk",
            "32",
            "--ranks",
            ranks,
            "--straggler",
            straggler,
            "--run-dir",
            &s(run),
        ];
        ok(&[&base[..], &more[..], extra].concat())
    };
    let train = |run: &str, ranks: &str, straggler: &str, extra: &[&str]| {
        train_for("200", run, ranks, straggler, extra)
    };
    // Rank 0 at 0.35 of the speed: flagged under 0.7 of the best rank's rate. At 0.5 its
    // measured share is 0.33-0.61 (25 runs), and once a rank 1 slowed by the machine (its rate
    // at 386k rows/s where 560-720k is usual) left it at 0.74, unflagged.
    let (stdout, _) = train("slow", "2", "persistent:rank=0,speed=0.35", &["--trace"]);
    assert!(stdout.contains("stragglers: rank 0 (pattern: persistent"), "{stdout}");
    let events = check_trace(&d.join("slow/trace.json"));
    assert!(!d.join("slow/trace-parts").exists());
    // One process per rank, named; rank 1's threads computed chunks of rank 0.
    for r in 0..2 {
        assert!(events.iter().any(|e| e["name"] == "process_name"
            && e["pid"] == r
            && e["args"]["name"] == format!("rank {r}")));
    }
    let taken = events
        .iter()
        .filter(|e| {
            e["name"] == "taken chunk"
                && e["pid"] == 1
                && e["args"]["owner"] == 0
                && e["tid"].as_i64() >= Some(1)
        })
        .count();
    assert!(taken > 0, "no chunk of rank 0 taken over by rank 1");
    assert!(events.iter().any(|e| e["name"] == "take over" && e["pid"] == 1 && e["args"]["victim"] == 0));
    for name in
        ["pull", "push", "compute", "iteration", "evaluate", "delayed", "chunks", "threads", "own chunk"]
    {
        assert!(events.iter().any(|e| e["name"] == name), "no `{name}` event");
    }
    // Rank 0's injected delays are inside its chunks (compute threads' runs of chunks), none
    // in rank 1's own.
    let delay = |pid: i64| {
        events
            .iter()
            .filter(|e| e["name"] == "own chunk" && e["pid"] == pid)
            .map(|e| e["args"]["delay_us"].as_f64().expect("delay_us"))
            .sum::<f64>()
    };
    assert!(delay(0) > 0.0 && delay(1) == 0.0, "{} {}", delay(0), delay(1));
    let waits: Vec<_> = events.iter().filter(|e| e["cat"] == "wait" && e["pid"] == 1).collect();
    assert!(waits.iter().all(|e| e["args"]["for"].is_string()), "{waits:?}");
    // The report: rank 0 flagged, its score well above rank 1's.
    let (flagged, pattern, scores) = stragglers(&d.join("slow"));
    assert_eq!((flagged, pattern.as_str()), (vec![0], "persistent"), "{scores:?}");
    assert!(scores[0] >= 0.3 && scores[0] > scores[1] + 0.25, "{scores:?}");
    // Nobody in an ideal run. The machine can run one core faster than the other for seconds
    // (its hyperthread sibling idle, as it looks: 1.1-1.4M rows/s against a steady 0.97M), and
    // the loops are pinned, so a run of 0.15 s has measured the other rank at 0.65-0.70 of it,
    // flagged: a real straggler to the report, not its error. A run of 2000 iterations (about
    // 1.5 s) kept both at 0.86 or more on one host (12 runs); on another, 7 of 20 such runs, of
    // this version and of the one before alike, measured one rank or the other at 0.61-0.69. A
    // flagged run is run again, up to 4 in all: a report that flags an ideal run by its own error
    // flags every one, where the machine's slow core passes within a few.
    let ideal = |run: &str| {
        train_for("2000", run, "2", "ideal", &[]);
        stragglers(&d.join(run))
    };
    let (mut flagged, mut pattern, mut scores) = ideal("ideal");
    let mut seen = Vec::new();
    for again in 1..4 {
        if flagged.is_empty() {
            break;
        }
        eprintln!("ideal run flagged {flagged:?} ({scores:?}); once more");
        seen.push(flagged.clone());
        (flagged, pattern, scores) = ideal(&format!("ideal-{again}"));
    }
    assert!(flagged.is_empty(), "ideal run flagged {flagged:?} after {seen:?}: {scores:?}");
    // (A short run on a busy machine may show its noise as transient, never as a straggler.)
    assert_ne!(pattern, "persistent", "{scores:?}");
    // Three speeds: scored in their order. Three ranks share the 2 cores: ranks 0 and 2 share
    // one, rank 1 has the other to itself. Sharing a core slows both sharers alike (on one CI
    // machine by about 0.6 against the lone rank, in every run) while keeping their ratio, so the
    // fastest speed goes to the lone rank: 0.5, 1 and 0.25 stay in order however much the sharers
    // lose to each other. (With the lone rank at half speed and the sharers at 1 and 0.75, that
    // machine scored the half-speed rank 0.11-0.17 and the other 0.30: out of order, twice.)
    // Here, in 16 runs quiet or beside a busy loop on either core or both, ranks 0 and 2 scored
    // 0.34-0.69 and 0.67-0.85. A run out of order is run once more: a report that misorders the
    // speeds does so in both.
    let het = |run: &str| {
        train(run, "3", "heterogeneous:speed=0.5/1/0.25", &[]);
        stragglers(&d.join(run)).2
    };
    let ordered = |s: &[f64]| s[2] > s[0] && s[0] > s[1];
    let mut scores = het("het");
    if !ordered(&scores) {
        eprintln!("heterogeneous speeds scored out of order ({scores:?}); once more");
        scores = het("het-again");
    }
    assert!(ordered(&scores), "{scores:?}");
    // `peregrine report`: the same report, and its plots.
    let (stdout, _) = ok(&["report", &s("slow")]);
    assert!(stdout.contains("stragglers: rank 0 (pattern: persistent"), "{stdout}");
    for plot in ["loss", "ranks", "transfers"] {
        for ext in ["png", "svg"] {
            let p = d.join(format!("slow/report/{plot}.{ext}"));
            assert!(std::fs::metadata(&p).is_ok_and(|m| m.len() > 1000), "{}", p.display());
        }
    }
    let out = peregrine(&["report", &s("nothing-here")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).1.contains("summary.json"), "{:?}", text(&out));
}

#[cfg(feature = "mpi")]
mod mpi {
    use peregrine_tests::{assert_success, mpirun_n};
    use std::path::Path;

    fn exe() -> &'static Path {
        Path::new(env!("CARGO_BIN_EXE_peregrine"))
    }

    #[test]
    fn a_traced_mpi_run_shows_rank_0s_chunks_taken_over_by_rank_1() {
        let _alone = super::alone();
        let d_tmp = super::scratch("mpi-trace");
        let d = d_tmp.path();
        let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
        super::ok(&["data", "gen", "dense", &s("d.pgd"), "--rows", "20000", "--features", "64"]);
        let out = mpirun_n(
            2,
            exe(),
            &[
                "train",
                "--model",
                "mlp",
                "--hidden",
                "64",
                "--data",
                &s("d.pgd"),
                "--iterations",
                "200",
                "--batch",
                "1024",
                "--chunk",
                "32",
                // At 0.35 of the speed, as the local traced test (above) for the same reason:
                // at 0.5 the report once measured rank 0 at 0.78 of the best rank's rate (a
                // straggler score of 0.22) and flagged nobody.
                "--straggler",
                "persistent:rank=0,speed=0.35",
                "--trace",
                "--run-dir",
                &s("run"),
            ],
        );
        assert_success("mpirun -n 2 peregrine train --trace", &out);
        let events = super::check_trace(&d.join("run/trace.json"));
        let taken = events
            .iter()
            .filter(|e| e["name"] == "taken chunk" && e["pid"] == 1 && e["args"]["owner"] == 0)
            .count();
        assert!(taken > 0, "no chunk of rank 0 taken over by rank 1");
        let align = events.iter().find(|e| e["name"] == "clock_alignment").expect("alignment");
        assert!(align["args"]["barrier_exit_spread_us"].as_f64().is_some_and(|v| v >= 0.0), "{align}");
        let (flagged, _, scores) = super::stragglers(&d.join("run"));
        assert_eq!(flagged, [0], "{scores:?}");
    }
}
