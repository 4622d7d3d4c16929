//! Node-combined communication as a user sees it (the ranks of a node share one copy of the
//! parameters and combine their updates before anything crosses the network): `peregrine train
//! --node-combine` on local ranks in nodes (`--ranks-per-node`), and `peregrine simulate
//! --node-combine`: what they print and write, and bad values.

use std::path::Path;
use std::process::{Command, Output};

fn peregrine(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peregrine")).args(args).output().expect("run peregrine")
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// 64 ranks of 2 threads over 25 GbE, BSP and SSP, `extra` flags; the header line and each
/// report's `(name, node_combine, s/iteration)` from the JSON file written in `dir`.
fn simulate(dir: &Path, extra: &[&str]) -> (String, Vec<(String, bool, f64)>) {
    let json = dir.join("reports.json");
    let json = json.to_string_lossy();
    let base = [
        "simulate",
        "--ranks",
        "64",
        "--threads",
        "2",
        "--iterations",
        "10",
        "--inter",
        "ethernet",
        "--scheme",
        "bsp",
        "--scheme",
        "ssp:3",
        "--json",
        &json,
    ];
    let out = peregrine(&[&base[..], extra].concat());
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{extra:?}: {stdout}\n{stderr}");
    let reports: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&*json).expect("the JSON report")).expect("JSON");
    let rows = reports
        .as_array()
        .expect("a list of reports")
        .iter()
        .map(|r| {
            let report = &r["report"];
            (
                r["name"].as_str().expect("name").to_owned(),
                report["node_combine"].as_bool().expect("node_combine"),
                report["per_iteration"].as_f64().expect("per_iteration"),
            )
        })
        .collect();
    (stdout.lines().next().unwrap_or_default().to_owned(), rows)
}

#[test]
fn synchronous_schemes_combine_on_the_node_unless_told_not_to() {
    let tmp = tempfile::Builder::new().prefix("peregrine-cli-hier-").tempdir().expect("scratch dir");
    let (header, auto) = simulate(tmp.path(), &["--ranks-per-node", "16"]);
    assert!(
        header.contains("16 per node, intra shm, inter ethernet, node combine on for synchronous schemes"),
        "{header}"
    );
    let names: Vec<_> = auto.iter().map(|(n, c, _)| (n.as_str(), *c)).collect();
    assert_eq!(names, [("ideal", true), ("bsp", true), ("ssp:3", false)]);

    let (header, off) = simulate(tmp.path(), &["--ranks-per-node", "16", "--node-combine", "off"]);
    assert!(header.contains("16 per node, intra shm, inter ethernet, node combine off (--node-combine off)"));
    assert!(off.iter().all(|(_, c, _)| !c), "{off:?}");
    // Over 25 GbE, 4 nodes: a stripe between nodes instead of 48 ranks' shards, each way.
    assert!(auto[0].2 < 0.9 * off[0].2, "ideal: combined {} s, flat {} s", auto[0].2, off[0].2);
    // SSP never combines: the same run either way.
    assert_eq!(auto[2].2, off[2].2);

    let (header, one) = simulate(tmp.path(), &[]);
    assert!(header.contains("1 per node, intra shm, inter ethernet, node combine off (1 rank a node)"));
    assert!(one.iter().all(|(_, c, _)| !c), "{one:?}");
}

#[test]
fn a_node_combine_that_is_not_auto_or_off_is_a_usage_error() {
    for bad in ["on", "", "Auto"] {
        let out = peregrine(&["simulate", "--ranks", "8", "--node-combine", bad]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {stdout}\n{stderr}");
        assert!(stderr.contains("--node-combine") && stderr.contains("expected auto or off"), "{stderr}");
        assert!(stdout.is_empty(), "refused before anything is printed: {stdout}");
    }
}

/// A scratch directory with a small dense multiclass training set, `d.pgd`.
fn dense_set() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("peregrine-node-combine-").tempdir().expect("scratch dir");
    let data = dir.path().join("d.pgd");
    let out = peregrine(&[
        "data",
        "gen",
        "dense",
        "--rows",
        "2000",
        "--features",
        "20",
        "--classes",
        "4",
        &data.to_string_lossy(),
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
    dir
}

/// `train` of softmax on 4 local ranks in nodes of 2 with `extra` flags: stdout, summary.json,
/// config.toml.
fn train_in_nodes(dir: &Path, run: &str, extra: &[&str]) -> (String, serde_json::Value, String) {
    let (data, run) = (dir.join("d.pgd"), dir.join(run));
    let (data, run_s) = (data.to_string_lossy(), run.to_string_lossy());
    let base = ["train", "--model", "softmax", "--data", &data, "--ranks", "4", "--ranks-per-node", "2"];
    let more = ["--iterations", "30", "--batch", "256", "--chunk", "32", "--run-dir", &run_s];
    let out = peregrine(&[&base[..], &more[..], extra].concat());
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{extra:?}: {stdout}\n{stderr}");
    let summary = std::fs::read_to_string(run.join("summary.json")).expect("summary.json");
    let config = std::fs::read_to_string(run.join("config.toml")).expect("config.toml");
    (stdout, serde_json::from_str(&summary).expect("summary.json parses"), config)
}

#[test]
fn train_combines_on_local_nodes_and_says_so() {
    let dir = dense_set();
    let (stdout, summary, config) = train_in_nodes(dir.path(), "auto", &[]);
    assert!(stdout.contains("node-combined pulls and pushes: 2 nodes, ranks per node 2(x2)"), "{stdout}");
    assert_eq!(summary["node_combined"], serde_json::json!([2, 2]), "{summary}");
    assert!(config.contains("node-combine = \"auto\""), "{config}");
    let (stdout, summary_off, config) = train_in_nodes(dir.path(), "off", &["--node-combine", "off"]);
    assert!(!stdout.contains("node-combined"), "{stdout}");
    assert!(summary_off.get("node_combined").is_none(), "{summary_off}");
    assert!(config.contains("node-combine = \"off\""), "{config}");
    // The same model up to the order of the sums: the final evaluations agree.
    let loss =
        |s: &serde_json::Value| s["evals"].as_array().and_then(|e| e.last()).map(|e| e["loss"].as_f64());
    let (a, b) = (loss(&summary).flatten().expect("a loss"), loss(&summary_off).flatten().expect("a loss"));
    assert!((a - b).abs() <= 1e-5 * b.abs(), "{a} against {b}");
    // An asynchronous scheme does not combine.
    let (stdout, summary, _) = train_in_nodes(dir.path(), "ssp", &["--scheme", "ssp:2"]);
    assert!(!stdout.contains("node-combined") && summary.get("node_combined").is_none(), "{stdout}");
}

#[test]
fn bad_node_flags_are_usage_errors() {
    let dir = dense_set();
    let data = dir.path().join("d.pgd");
    let data = data.to_string_lossy();
    let cases: [(&[&str], &str); 3] = [
        (&["--ranks", "2", "--ranks-per-node", "0"], "--ranks-per-node"),
        (&["--ranks", "2", "--node-combine", "sometimes"], "--node-combine"),
        (&["--backend", "mpi", "--ranks-per-node", "2"], "--ranks-per-node groups local (thread) ranks"),
    ];
    for (flags, says) in cases {
        let run = dir.path().join("never");
        let run_s = run.to_string_lossy();
        let base = ["train", "--model", "softmax", "--data", &data, "--iterations", "5", "--run-dir", &run_s];
        let out = peregrine(&[&base[..], flags].concat());
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stdout}\n{stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
        assert!(!run.exists(), "{flags:?}: a run directory was made");
    }
}
