//! What a training run leaves behind and shows: `summary.json`, the trained model
//! (`model.safetensors`, and `.npy` files with `--npy`), the joined trace (`trace.json`), and the
//! summary printed at the end (its table of the ranks' times).

use std::io::{BufWriter, Write};
use std::path::Path;

use peregrine_core::engine::{EvalPoint, Report};
use peregrine_core::model::Export;
use peregrine_core::pool::Placement;

use super::args::ModelKind;
use super::io;
use super::resolve::Resolved;
use crate::error::AppError;
use crate::preempt::write_atomically;

/// Writes the run directory's `summary.json` (rank 0): the report, the samples per second, where
/// the threads ran and the process's memory.
pub(super) fn write_summary(dir: &Path, report: &Report, placement: &Placement) -> Result<(), AppError> {
    let mut summary = serde_json::to_value(report).map_err(|e| AppError::Train(e.to_string()))?;
    summary["samples_per_second"] = report.samples_per_second().into();
    summary["placement"] = serde_json::to_value(placement).unwrap_or_default();
    summary["memory"] = memory();
    let text = serde_json::to_string_pretty(&summary).map_err(|e| AppError::Train(e.to_string()))?;
    write_atomically(&dir.join("summary.json"), text.as_bytes())
}

/// Rank 0's process memory (Linux): resident anonymous memory (heap: model, buffers), resident
/// file-backed memory (mapped dataset pages touched), and the peak resident size, in KiB. Under
/// the local backend the process holds every rank.
fn memory() -> serde_json::Value {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    serde_json::json!({
        "rss_anon_kib": field("RssAnon:"),
        "rss_file_kib": field("RssFile:"),
        "peak_rss_kib": field("VmHWM:"),
    })
}

/// Writes the trained model into the run directory (rank 0): the best evaluated one, when kept.
pub(super) fn save_model<M: Export>(
    dir: &Path,
    model: &M,
    report: &Report,
    r: &Resolved,
) -> Result<(), AppError> {
    let best = report.best.zip(report.best_params.as_deref());
    let Some(params) = best.map(|b| b.1).or(report.params.as_deref()) else { return Ok(()) };
    save_model_params(dir, model, params, r, report.iterations, "end", Some(report), best.map(|b| b.0))
}

/// Writes `params` of `model` as the run directory's model.safetensors (rank 0), written at
/// iteration `iteration` (`when`: at the `end` or at a `checkpoint`); `best`: the evaluation of
/// the best model, when `params` are its (its iteration and figures go in the metadata).
#[allow(clippy::too_many_arguments)]
pub(super) fn save_model_params<M: Export>(
    dir: &Path,
    model: &M,
    params: &[f32],
    r: &Resolved,
    iteration: u64,
    when: &str,
    report: Option<&Report>,
    best: Option<EvalPoint>,
) -> Result<(), AppError> {
    let train = peregrine_kernels::data::Dataset::open(&r.data)?;
    let mut meta = std::collections::HashMap::new();
    meta.insert("model".to_owned(), r.model.name().to_owned());
    meta.insert("scheme".into(), r.scheme.to_string());
    meta.insert("optimizer".into(), r.optimizer.to_string());
    meta.insert("iterations".into(), iteration.to_string());
    meta.insert("written_at".into(), when.to_owned());
    let data = std::fs::canonicalize(&r.data).unwrap_or_else(|_| r.data.clone());
    meta.insert("train_data".into(), data.display().to_string());
    if r.model == ModelKind::Mlp {
        meta.insert("hidden".into(), r.hidden.iter().map(ToString::to_string).collect::<Vec<_>>().join(","));
    }
    if let Some(b) = r.hash_bits {
        meta.insert("hash_bits".into(), b.to_string());
    }
    if r.model == ModelKind::Lda {
        meta.insert("alpha".into(), r.alpha.to_string());
        meta.insert("eta".into(), r.eta.to_string());
    }
    if let Some(report) = report {
        meta.insert("ranks".into(), report.ranks.to_string());
        if let Some(e) = best.or(report.last_eval()) {
            meta.insert("eval_loss".into(), e.loss.to_string());
            meta.insert(format!("eval_{}", report.metric), e.metric.to_string());
        }
        if let Some(i) = report.stopped_early {
            meta.insert("stopped_early_at".into(), i.to_string());
        }
    }
    if let Some(b) = best {
        meta.insert("best_iteration".into(), b.iter.to_string());
        meta.entry("eval_loss".into()).or_insert_with(|| b.loss.to_string());
    }
    // A scaling applied on the fly is recorded as the file's would be; `predict` applies it to
    // raw data (`standardized = on-the-fly`).
    let on_the_fly = r.scaling.as_ref().map(|s| (s.shift.as_slice(), s.mult.as_slice()));
    if on_the_fly.is_some() {
        meta.insert(crate::model_file::STANDARDIZED.into(), crate::model_file::ON_THE_FLY.into());
    }
    let scaling = on_the_fly.or(train.scaling());
    if r.npy {
        crate::model_file::save_npy(&dir.join("model"), model, params, &meta, scaling)?;
    }
    crate::model_file::save(&dir.join(crate::model_file::FILE_NAME), model, params, meta, scaling)
}

/// Where the ranks write their parts of the trace (joined into `trace.json` at the end).
pub(super) const TRACE_PARTS: &str = "trace-parts";

/// Joins the ranks' trace parts (one event per line) into one Chrome Trace Event file, then
/// removes them. Streams: memory holds one line at a time.
pub(super) fn join_trace(parts: &Path, out: &Path, world: usize) -> Result<(), AppError> {
    use std::io::BufRead;
    let file = crate::output::AtomicFile::create(out)?;
    let tmp = file.temp_path().to_owned();
    let mut w = BufWriter::new(file);
    let werr = |e| AppError::Io { what: format!("writing {}", tmp.display()), source: e };
    w.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n").map_err(werr)?;
    let mut first = true;
    for r in 0..world {
        let part = parts.join(format!("rank-{r}.jsonl"));
        let f = std::fs::File::open(&part).map_err(io(format!("reading {}", part.display())))?;
        for line in std::io::BufReader::new(f).lines() {
            let line = line.map_err(io(format!("reading {}", part.display())))?;
            if !first {
                w.write_all(b",\n").map_err(werr)?;
            }
            w.write_all(line.as_bytes()).map_err(werr)?;
            first = false;
        }
    }
    w.write_all(b"\n]}\n").map_err(werr)?;
    w.into_inner().map_err(|e| werr(e.into_error()))?.commit()?;
    std::fs::remove_dir_all(parts).map_err(io(format!("removing {}", parts.display())))
}

pub(super) fn rate_text(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2}M samples/s", r / 1e6)
    } else {
        format!("{:.0}k samples/s", r / 1e3)
    }
}

pub(super) fn print_summary(r: &Report, dir: &Path, data_check_seconds: f64) {
    println!(
        "{} | {} | {} rank{} | {} iterations | {} samples in {:.3} s ({}; evaluation {:.3} s, data check \
         {:.3} s, not counted)",
        r.model,
        r.scheme,
        r.ranks,
        if r.ranks == 1 { "" } else { "s" },
        r.iterations,
        r.samples,
        r.train_seconds,
        rate_text(r.samples_per_second()),
        r.eval_seconds,
        data_check_seconds
    );
    if let Some(e) = r.last_eval() {
        let train = e.train_loss.map(|l| format!("; training loss {l:.4} since the previous evaluation"));
        println!(
            "final evaluation: loss {:.4}, {} {:.4}{}",
            e.loss,
            r.metric,
            e.metric,
            train.unwrap_or_default()
        );
    }
    match (r.target_loss, r.time_to_target) {
        (Some(g), Some(s)) => println!("reached loss <= {g} after {s:.3} s"),
        (Some(g), None) => println!("did not reach loss <= {g}"),
        _ => {}
    }
    if let Some(nodes) = &r.node_combined {
        println!(
            "node-combined pulls and pushes: {} nodes, ranks per node {} (one copy of the weights and one update per node)",
            nodes.len(),
            peregrine_slurm::format_tasks_per_node(&nodes.iter().map(|&n| n as u32).collect::<Vec<_>>())
        );
    }
    if let (Some(n), Some(at)) = (r.early_stop, r.stopped_early) {
        println!("early stopping: no improvement in {n} evaluations, stopped after the evaluation at iteration {at}");
    }
    if let (Some(b), Some(_)) = (r.best, &r.best_params) {
        println!(
            "model.safetensors: the best evaluated model, iteration {} (loss {:.4}, {} {:.4})",
            b.iter, b.loss, r.metric, b.metric
        );
    }
    println!(
        "{:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>12}",
        "rank", "compute s", "comm s", "wait s", "own", "taken", "rows"
    );
    for (i, t) in r.per_rank.iter().enumerate() {
        println!(
            "{i:>5} {:>10.3} {:>10.3} {:>10.3} {:>8} {:>8} {:>12}",
            t.compute, t.comm, t.wait, t.own, t.taken, t.rows
        );
    }
    println!("run directory: {}", dir.display());
}
