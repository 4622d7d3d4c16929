//! Checks of trace files and straggler reports, shared by the test binaries.

use std::path::Path;

/// Checks a Chrome Trace Event file as viewers read it: an object with `traceEvents`; every
/// event has a name, a phase, a process and a thread, and (but metadata) a time stamp; spans
/// have a non-negative duration; begin/end pairs balance per thread. Returns the events.
pub fn check_trace(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).expect("trace.json");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("trace.json is JSON");
    let events = doc["traceEvents"].as_array().expect("traceEvents").clone();
    let mut open: std::collections::HashMap<(i64, i64), i64> = std::collections::HashMap::new();
    for e in &events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no ph: {e}"));
        assert!(e["name"].is_string(), "no name: {e}");
        let (pid, tid) = (e["pid"].as_i64(), e["tid"].as_i64());
        let (pid, tid) =
            (pid.unwrap_or_else(|| panic!("no pid: {e}")), tid.unwrap_or_else(|| panic!("no tid: {e}")));
        assert!(["X", "i", "C", "M", "B", "E"].contains(&ph), "phase {ph}: {e}");
        if ph != "M" {
            let ts = e["ts"].as_f64().unwrap_or_else(|| panic!("no ts: {e}"));
            assert!(ts.is_finite() && ts >= 0.0, "{e}");
        }
        if ph == "X" {
            let dur = e["dur"].as_f64().unwrap_or_else(|| panic!("no dur: {e}"));
            assert!(dur >= 0.0, "negative duration: {e}");
        }
        match ph {
            "B" => *open.entry((pid, tid)).or_default() += 1,
            "E" => {
                let n = open.entry((pid, tid)).or_default();
                *n -= 1;
                assert!(*n >= 0, "end without begin: {e}");
            }
            _ => {}
        }
    }
    assert!(open.values().all(|&n| n == 0), "unbalanced begin/end: {open:?}");
    events
}

/// The summary's straggler report: the flagged ranks, the pattern and every rank's score.
#[allow(dead_code)]
pub fn stragglers(run: &Path) -> (Vec<u64>, String, Vec<f64>) {
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).expect("summary"))
            .expect("json");
    let r = &s["stragglers"];
    let flagged =
        r["flagged"].as_array().expect("flagged").iter().map(|v| v.as_u64().expect("rank")).collect();
    let scores =
        r["ranks"].as_array().expect("ranks").iter().map(|v| v["score"].as_f64().expect("score")).collect();
    (flagged, r["pattern"].as_str().expect("pattern").to_owned(), scores)
}
