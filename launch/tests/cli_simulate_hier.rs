//! `peregrine simulate --node-combine`: the node combine (the ranks of a node share one copy of the
//! parameters and combine their updates before anything crosses the network) as a user sees it:
//! the header, the JSON report, and bad values.

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
fn a_hierarchy_that_is_not_auto_or_off_is_a_usage_error() {
    for bad in ["on", "", "Auto"] {
        let out = peregrine(&["simulate", "--ranks", "8", "--node-combine", bad]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {stdout}\n{stderr}");
        assert!(stderr.contains("--node-combine") && stderr.contains("expected auto or off"), "{stderr}");
        assert!(stdout.is_empty(), "refused before anything is printed: {stdout}");
    }
}
