//! `peregrine simulate`: the schemes' own policies at any scale in virtual time
//! ([`peregrine_core::sim`]), and replays of real runs to check the simulator against them.

use std::path::{Path, PathBuf};

use clap::Args;
use peregrine_core::engine::{Config, Elastic};
use peregrine_core::inject::Injection;
use peregrine_core::sim::{
    self, ComputeModel, Measured, Network, NodeCombine, Preset, Replay, SimConfig, SimReport,
};
use peregrine_core::{Scheme, SchemeSpec};
use serde_json::Value;

use crate::error::AppError;
use crate::output;

/// Parameters of the MLP 784-128-10 (the main job's model): the default model size.
const MLP_PARAMS: usize = 784 * 128 + 128 + 128 * 10 + 10;

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    peregrine simulate --ranks 512 --threads 16 --straggler persistent:rank=0,speed=0.5 \\\n      \
    --scheme bsp --scheme bsp+steal --scheme flexrr --scheme falcon\n  \
    peregrine simulate --ranks 4096 --threads 16 --iterations 1000 --scheme bsp+steal   # scale\n  \
    peregrine simulate --replay runs/mlp-bsp-1795424116   # a real run again, in simulation\n\n\
    Numbers out of range are refused (exit 2), and so is a run whose virtual time would pass 146 \
    years.\n\n\
    What is modelled and what is not: see the README's \"Simulating a cluster\".")]
pub struct SimArgs {
    /// Re-run a real run's configuration in simulation with that run's measured per-chunk,
    /// communication and fixed costs (from its metrics), and compare: prints `measured <s> s,
    /// simulated <s> s, ratio <r>` for time per iteration and, if the run had a target, time to
    /// target. Every other option is ignored.
    #[arg(long, value_name = "RUN_DIR")]
    replay: Option<PathBuf>,
    /// Schemes to compare, `name[+steal]` (repeat the flag); each is run next to Ideal (BSP, no
    /// straggler). The default is each scheme family's usual forms.
    #[arg(long, value_name = "SCHEME", default_values_t = compared_by_default())]
    scheme: Vec<SchemeSpec>,
    /// Ranks.
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    ranks: usize,
    /// Compute threads per rank.
    #[arg(long, default_value_t = 8, value_name = "T", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    threads: usize,
    /// Iterations.
    #[arg(long, default_value_t = 1000, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..))]
    iterations: u64,
    /// Rows per chunk.
    #[arg(long, default_value_t = 64, value_name = "ROWS", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    chunk: usize,
    /// Global batch rows (default: 4 chunks per thread of every rank).
    #[arg(long, value_name = "ROWS", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    batch: Option<usize>,
    /// Training rows (default: 100 batches).
    #[arg(long, value_name = "ROWS", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    rows: Option<usize>,
    /// Chunks a thread takes from its own queue at a time.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..))]
    grain: u32,
    /// Fraction of a victim's queued chunks taken at once, in (0, 1].
    #[arg(long, default_value_t = 0.5, value_name = "F")]
    steal_fraction: f64,
    /// Injected stragglers, as for `train` (ideal, slow-worker, disrupted, power-law, persistent,
    /// heterogeneous).
    #[arg(long, default_value = "ideal", value_name = "PATTERN")]
    straggler: String,
    /// Seed of the batch order and of the straggler pattern.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds a thread takes per chunk, at most a day (default 200 us: an MLP 784-128-10 chunk
    /// of 64 rows on one core of the development machine is 150-250 us).
    #[arg(long, default_value_t = 200e-6, value_name = "SECONDS", conflicts_with = "chunk_times_from")]
    chunk_time: f64,
    /// Draw chunk times from a real run's measured ones (its metrics), by the chunk's identity.
    #[arg(long, value_name = "RUN_DIR")]
    chunk_times_from: Option<PathBuf>,
    /// Model parameters (f32) every rank pulls and pushes per iteration, at most 10^13 (default:
    /// the MLP 784-128-10's 101,770).
    #[arg(long, default_value_t = MLP_PARAMS, value_name = "N")]
    params: usize,
    /// Fixed seconds per rank and iteration outside compute, communication and waits (at most a
    /// day).
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    overhead: f64,
    /// Ranks per node (the rest of the world is reached over the inter-node link).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    ranks_per_node: usize,
    /// Node-combined communication, as `train --node-combine`: `auto` lets the ranks of a node
    /// share one copy of the parameters and combine their updates on the node before anything
    /// crosses the network (each rank pulls and pushes only its stripe between nodes, with a
    /// barrier of the node after the pull and before the sum), under synchronous schemes (bsp,
    /// lb-bsp, with or without +steal) with more than one rank a node and more than one node;
    /// `off`: every rank pulls from and pushes to every shard itself. Between nodes the ranks of
    /// a node share its link's bandwidth either way.
    #[arg(long, default_value = "auto", value_name = "auto|off")]
    node_combine: NodeCombine,
    /// Link within a node: local (ranks as threads), shm (MPI shared memory), ib, ethernet.
    #[arg(long, default_value = "shm", value_name = "LINK")]
    intra: Preset,
    /// Link between nodes: ib (InfiniBand HDR), ethernet (25 GbE), shm, local.
    #[arg(long, default_value = "ib", value_name = "LINK")]
    inter: Preset,
    /// Override the inter-node latency (seconds, at most a day).
    #[arg(long, value_name = "SECONDS")]
    inter_latency: Option<f64>,
    /// Override the inter-node atomic round trip (seconds, at most a day).
    #[arg(long, value_name = "SECONDS")]
    inter_atomic: Option<f64>,
    /// Override the inter-node gap: seconds one more operation adds when issued back to back
    /// behind others before one completion (a batch reading a word of every rank; at most a day).
    #[arg(long, value_name = "SECONDS")]
    inter_gap: Option<f64>,
    /// Override the inter-node bandwidth (bytes per second, at least 1).
    #[arg(long, value_name = "BYTES_PER_S")]
    inter_bandwidth: Option<f64>,
    /// Iterations a real run needed to reach its target: time to target is when rank 0 has
    /// completed that many.
    #[arg(long, value_name = "N")]
    target_iterations: Option<u64>,
    /// Write every report as JSON to this file (written aside and renamed; not a link, a
    /// non-regular file, or a file of the run directory read).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// The schemes compared when no `--scheme` is given: the registry's (each scheme file names its
/// own).
fn compared_by_default() -> Vec<SchemeSpec> {
    Scheme::compared_by_default().map(|s| s.parse().expect("the registry's names parse")).collect()
}

fn usage(s: impl std::fmt::Display) -> AppError {
    AppError::Usage(s.to_string())
}

pub fn run(a: SimArgs) -> Result<(), AppError> {
    if let Some(json) = &a.json {
        check_json(json, &a)?;
    }
    if let Some(dir) = &a.replay {
        return replay_cmd(dir, a.json.as_deref());
    }
    let base = forward(&a)?;
    let schemes = a.scheme.clone();
    for s in &schemes {
        s.scheme.validate(a.ranks).map_err(usage)?;
    }
    println!(
        "simulated: {} ranks x {} threads, {} iterations of {} chunks of {} rows, {}; {} per node, intra {}, inter {}, {}",
        a.ranks,
        a.threads,
        a.iterations,
        base.cfg.batch.div_ceil(base.cfg.chunk),
        base.cfg.chunk,
        a.straggler,
        a.ranks_per_node,
        a.intra,
        a.inter,
        combine_note(&base)
    );
    let mut reports = Vec::new();
    let ideal = SimConfig {
        cfg: Config { scheme: SchemeSpec::reference(), inject: Injection::default(), ..base.cfg.clone() },
        ..base.clone()
    };
    let r = sim::simulate(&ideal, None).map_err(|e| sim_err("", e))?;
    // What no scheme can beat under this straggler pattern.
    let bound = sim::balanced_bound(&base, &r);
    let chunks = sim::chunk_bound(&base, &r);
    if let (Some(b), Some(c)) = (bound, chunks) {
        println!("balanced bound: {b:.6} s/iteration (the batch spread over every rank's speed, plus Ideal's communication)");
        println!(
            "whole-chunk bound: {c:.6} s/iteration (each chunk whole on the thread that finishes it first; \
             no scheme that ends each iteration before the next does better)"
        );
    }
    println!(
        "{:<24} {:>12} {:>9} {:>7} {:>10} {:>11} {:>9} {:>10} {:>9} {:>9}",
        "scheme",
        "s/iteration",
        "vs ideal",
        "wait %",
        "taken",
        "to target s",
        "wall s",
        "events",
        "vs bound",
        "vs chunks"
    );
    let ideal_s = r.per_iteration;
    print_row("ideal (bsp, no straggler)", &r, ideal_s, None, None);
    reports.push(("ideal".to_string(), r));
    for s in schemes {
        let c = SimConfig { cfg: Config { scheme: s.clone(), ..base.cfg.clone() }, ..base.clone() };
        let r = sim::simulate(&c, None).map_err(|e| sim_err(format!("{s}: "), e))?;
        print_row(&s.to_string(), &r, ideal_s, bound, chunks);
        reports.push((s.to_string(), r));
    }
    if let Some(path) = &a.json {
        write_json(
            path,
            &serde_json::json!(reports
                .iter()
                .map(|(n, r)| serde_json::json!({"name": n, "report": r}))
                .collect::<Vec<_>>()),
        )?;
    }
    Ok(())
}

/// Whether the ranks of a node combine on the node, as the header says it.
fn combine_note(base: &SimConfig) -> &'static str {
    if base.node_combine == NodeCombine::Off {
        "node combine off (--node-combine off)"
    } else if base.net.ranks_per_node.min(base.ranks) <= 1 {
        "node combine off (1 rank a node)"
    } else if base.ranks <= base.net.ranks_per_node {
        "node combine off (one node)"
    } else {
        "node combine on for synchronous schemes (ideal, bsp, lb-bsp; others flat)"
    }
}

fn print_row(name: &str, r: &SimReport, ideal: f64, bound: Option<f64>, chunks: Option<f64>) {
    let against = |b: Option<f64>| {
        b.filter(|&b| b > 0.0).map_or("-".into(), |b| format!("{:.2}x", r.per_iteration / b))
    };
    println!(
        "{:<24} {:>12.6} {:>8.2}x {:>6.1}% {:>10} {:>11} {:>9.2} {:>10} {:>9} {:>9}",
        name,
        r.per_iteration,
        if ideal > 0.0 { r.per_iteration / ideal } else { 0.0 },
        100.0 * r.wait_share(),
        r.taken(),
        r.time_to_target.map_or("-".into(), |t| format!("{t:.3}")),
        r.wall_seconds,
        r.events,
        against(bound),
        against(chunks)
    );
}

/// `--json` must not be a link, a non-regular file, or a file of a run directory read.
fn check_json(json: &Path, a: &SimArgs) -> Result<(), AppError> {
    output::check("--json", json, &[])?;
    for (flag, dir) in [("--replay", &a.replay), ("--chunk-times-from", &a.chunk_times_from)] {
        if let Some(dir) = dir {
            output::check_outside_run("--json", json, flag, dir)?;
        }
    }
    Ok(())
}

fn write_json(path: &Path, v: &Value) -> Result<(), AppError> {
    let text = serde_json::to_string_pretty(v).map_err(|e| AppError::Train(e.to_string()))?;
    output::write_atomically(path, text.as_bytes())
}

/// The most seconds `--chunk-time`, `--overhead` and the `--inter-*` times may give: a day.
const MAX_SECONDS: f64 = 86_400.0;
/// The most `--params`: 10^13 (40 TB of f32 pulled and pushed by every rank every iteration).
const MAX_PARAMS: usize = 10_000_000_000_000;
/// The most `--rows` and `--batch`: 2^53 (every count exact in the simulator's float figures).
const MAX_ROWS: usize = 1 << 53;

/// Checks every numeric flag for its range (exit 2 naming the flag), before anything is
/// computed from them. What the flags say together (a run past the simulator's horizon) is
/// checked by the simulation.
fn check_flags(a: &SimArgs) -> Result<(), AppError> {
    let seconds = |flag: &str, v: f64, zero: bool| {
        let low = if zero { v >= 0.0 } else { v > 0.0 };
        if low && v <= MAX_SECONDS {
            Ok(())
        } else {
            let range = if zero { "[0, 86400]" } else { "(0, 86400]" };
            Err(usage(format!("{flag} must be a number of seconds in {range} (at most a day), got {v}")))
        }
    };
    if a.chunk_times_from.is_none() {
        seconds("--chunk-time", a.chunk_time, false)?;
    }
    seconds("--overhead", a.overhead, true)?;
    for (flag, v) in [
        ("--inter-latency", a.inter_latency),
        ("--inter-atomic", a.inter_atomic),
        ("--inter-gap", a.inter_gap),
    ] {
        if let Some(v) = v {
            seconds(flag, v, true)?;
        }
    }
    if let Some(b) = a.inter_bandwidth.filter(|b| !(b.is_finite() && *b >= 1.0)) {
        return Err(usage(format!(
            "--inter-bandwidth must be a finite number of bytes per second, at least 1, got {b}"
        )));
    }
    if !(a.steal_fraction > 0.0 && a.steal_fraction <= 1.0) {
        return Err(usage(format!("--steal-fraction must be in (0, 1], got {}", a.steal_fraction)));
    }
    if a.params > MAX_PARAMS {
        return Err(usage(format!("--params must be at most {MAX_PARAMS} (10^13), got {}", a.params)));
    }
    for (flag, v) in [("--rows", a.rows), ("--batch", a.batch)] {
        if let Some(v) = v.filter(|&v| v > MAX_ROWS) {
            return Err(usage(format!("{flag} must be at most {MAX_ROWS} (2^53), got {v}")));
        }
    }
    if a.target_iterations == Some(0) {
        return Err(usage("--target-iterations must be at least 1, got 0"));
    }
    Ok(())
}

/// The global batch: `--batch`, else 4 chunks per thread of every rank, if that is at most
/// [`MAX_ROWS`].
fn batch_rows(a: &SimArgs) -> Result<usize, AppError> {
    if let Some(b) = a.batch {
        return Ok(b);
    }
    [a.threads, a.ranks, a.chunk]
        .into_iter()
        .try_fold(4usize, usize::checked_mul)
        .filter(|&b| b <= MAX_ROWS)
        .ok_or_else(|| {
            usage(format!(
                "the default --batch, 4 chunks of --chunk {} rows per thread of every rank, is past {MAX_ROWS} \
                 rows (2^53): give a smaller --chunk, or --batch",
                a.chunk
            ))
        })
}

/// The simulated run the options describe (scheme: BSP; the caller sets it).
pub(crate) fn forward(a: &SimArgs) -> Result<SimConfig, AppError> {
    check_flags(a)?;
    let pattern = a.straggler.parse().map_err(usage)?;
    let batch = batch_rows(a)?;
    let rows = match a.rows {
        Some(rows) => rows,
        // 100 batches, or as many as fit.
        None => batch.saturating_mul(100).min(MAX_ROWS),
    };
    let compute = match &a.chunk_times_from {
        Some(dir) => ComputeModel::Samples(measured_chunks(dir)?),
        None => ComputeModel::Constant(a.chunk_time),
    };
    let mut net =
        Network { intra: a.intra.link(), inter: a.inter.link(), ranks_per_node: a.ranks_per_node.max(1) };
    if let Some(v) = a.inter_latency {
        net.inter.latency = v;
    }
    if let Some(v) = a.inter_atomic {
        net.inter.atomic = v;
    }
    if let Some(v) = a.inter_gap {
        net.inter.gap = v;
    }
    if let Some(v) = a.inter_bandwidth {
        net.inter.bandwidth = v;
    }
    let c = SimConfig {
        cfg: Config {
            scheme: SchemeSpec::reference(),
            batch,
            chunk: a.chunk,
            grain: a.grain,
            iterations: a.iterations,
            steal_fraction: a.steal_fraction,
            seed: a.seed,
            threads: a.threads,
            elastic: Elastic::Fixed,
            inject: Injection { pattern, seed: a.seed },
            ..Config::default()
        },
        ranks: a.ranks,
        rows,
        params: a.params,
        compute,
        net,
        node_combine: a.node_combine,
        overhead: a.overhead,
        target_iterations: a.target_iterations,
    };
    // Refused here as `peregrine train` would refuse it, before anything is printed or run.
    peregrine_core::engine::check(&c.cfg, c.ranks, c.rows).map_err(usage)?;
    Ok(c)
}

/// A simulation's error: the user's to fix (exit 2) or the run's.
fn sim_err(what: impl std::fmt::Display, e: sim::SimError) -> AppError {
    let flags = match e {
        sim::SimError::Horizon { .. } => {
            " (see --iterations, --chunk-time, --params and --inter-bandwidth, --inter-latency, --overhead, \
             --straggler)"
        }
        _ => "",
    };
    let text = format!("{what}{e}{flags}");
    if e.is_usage() {
        AppError::Usage(text)
    } else {
        AppError::Train(text)
    }
}

/// One run of a simulated experiment: `base`'s options with the experiment's world, scheme,
/// pattern and seed.
pub(crate) fn experiment_run(
    base: &SimArgs,
    ranks: usize,
    threads: usize,
    scheme: &SchemeSpec,
    pattern: &str,
    seed: u64,
) -> Result<SimConfig, AppError> {
    let a = SimArgs {
        ranks,
        threads,
        straggler: pattern.into(),
        seed,
        scheme: Vec::new(),
        replay: None,
        json: None,
        chunk_times_from: base.chunk_times_from.clone(),
        ..*base
    };
    let mut c = forward(&a)?;
    c.cfg.scheme = scheme.clone();
    Ok(c)
}

/// A real run's directory, read back.
pub(crate) struct RunDir {
    /// Its configuration and measured costs as a simulation.
    pub sim: SimConfig,
    /// Measured seconds per iteration (training seconds over iterations).
    pub per_iteration: f64,
    /// Measured seconds to the target, if it had one and reached it.
    pub to_target: Option<f64>,
    /// Whether the dataset's rows were known (else the plan assumes no short batch).
    pub rows_known: bool,
}

fn bad(dir: &Path, what: &str, detail: impl std::fmt::Display) -> AppError {
    AppError::Data { what: format!("{}/{what}", dir.display()), detail: detail.to_string() }
}

fn read(dir: &Path, name: &str) -> Result<String, AppError> {
    let p = dir.join(name);
    std::fs::read_to_string(&p)
        .map_err(|source| AppError::Io { what: format!("reading {}", p.display()), source })
}

/// Every rank's metric lines: `[rank][line]`.
fn metric_lines(dir: &Path, ranks: usize) -> Result<Vec<Vec<Value>>, AppError> {
    (0..ranks)
        .map(|r| {
            let name = format!("metrics/rank-{r}.jsonl");
            read(dir, &name)?
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .map(|(i, l)| serde_json::from_str(l).map_err(|e| bad(dir, &format!("{name}:{}", i + 1), e)))
                .collect()
        })
        .collect()
}

fn num(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

/// A record's measured costs; `next_start` is the start of the rank's next iteration.
fn measured(rec: &Value, next_start: Option<f64>) -> Option<Measured> {
    let chunks = ["own", "taken", "cloned", "discarded"].iter().map(|k| num(rec, k)).sum::<f64>();
    let (compute, comm, wait) = (num(rec, "compute"), num(rec, "comm"), num(rec, "wait"));
    let chunk = if chunks > 0.0 && compute > 0.0 {
        compute * num(rec, "threads").max(1.0) / chunks / (1.0 + num(rec, "delay"))
    } else {
        f64::NAN // no chunk computed: the rank's median stands in
    };
    let overhead = next_start.map_or(0.0, |n| (n - num(rec, "start") - compute - comm - wait).max(0.0));
    Some(Measured { chunk, comm, overhead })
}

/// The measured chunk times of a run (every rank, every iteration).
fn measured_chunks(dir: &Path) -> Result<Vec<f64>, AppError> {
    let summary: Value =
        serde_json::from_str(&read(dir, "summary.json")?).map_err(|e| bad(dir, "summary.json", e))?;
    let ranks =
        summary.get("ranks").and_then(Value::as_u64).ok_or_else(|| bad(dir, "summary.json", "no `ranks`"))?;
    let lines = metric_lines(dir, ranks as usize)?;
    let v: Vec<f64> = lines
        .iter()
        .flatten()
        .filter_map(|r| measured(r, None))
        .map(|m| m.chunk)
        .filter(|c| !c.is_nan())
        .collect();
    if v.is_empty() {
        return Err(bad(dir, "metrics", "no iteration with computed chunks"));
    }
    Ok(v)
}

/// Reads a run directory as a replay.
pub(crate) fn read_run(dir: &Path) -> Result<RunDir, AppError> {
    let cfg: toml::Table = read(dir, "config.toml")?.parse().map_err(|e| bad(dir, "config.toml", e))?;
    let summary: Value =
        serde_json::from_str(&read(dir, "summary.json")?).map_err(|e| bad(dir, "summary.json", e))?;
    let key = |k: &str| cfg.get(k).ok_or_else(|| bad(dir, "config.toml", format!("no `{k}`")));
    let int = |k: &str| -> Result<u64, AppError> {
        key(k)?
            .as_integer()
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| bad(dir, "config.toml", format!("`{k}` is not a count")))
    };
    let text = |k: &str| -> Result<String, AppError> {
        key(k)?
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| bad(dir, "config.toml", format!("`{k}` is not a string")))
    };
    let scheme = SchemeSpec::new(
        text("scheme")?.parse().map_err(|e| bad(dir, "config.toml", e))?,
        key("steal")?.as_bool().unwrap_or(true),
    );
    let ranks =
        summary.get("ranks").and_then(Value::as_u64).ok_or_else(|| bad(dir, "summary.json", "no `ranks`"))?
            as usize;
    let iterations = summary.get("iterations").and_then(Value::as_u64).unwrap_or(0);
    let train = num(&summary, "train_seconds");
    let (batch, chunk, seed) = (int("batch")? as usize, int("chunk")? as usize, int("seed")?);
    let pattern = text("straggler")?.parse().map_err(|e| bad(dir, "config.toml", e))?;
    // Whether the run combined on the node, and its ranks per node (summary.json's
    // `node_combined`; runs from before it, or that did not combine, name none): replayed
    // with the same barriers, its nodes all as large as its first.
    let nodes: Option<usize> = summary
        .get("node_combined")
        .and_then(Value::as_array)
        .and_then(|n| n.first())
        .and_then(Value::as_u64)
        .map(|k| k as usize);
    let (node_combine, per_node) = match nodes {
        Some(k) if k > 1 => (NodeCombine::Auto, k),
        _ => (NodeCombine::Off, ranks),
    };
    // The dataset's rows (the plan's epoch): the data path as written, or next to the run.
    let data = PathBuf::from(text("data")?);
    let rows = [data.clone(), dir.join("..").join(&data), dir.join("../..").join(&data)]
        .iter()
        .find_map(|p| peregrine_kernels::data::Dataset::open(p).ok().map(|d| d.rows()));
    let lines = metric_lines(dir, ranks)?;
    let mut per_rank = Vec::with_capacity(ranks);
    for (r, recs) in lines.iter().enumerate() {
        // One slot per iteration of the run: an iteration number beyond it is a damaged file.
        let mut its: Vec<Option<Measured>> = vec![None; iterations as usize];
        for (i, rec) in recs.iter().enumerate() {
            let it =
                rec.get("iter").and_then(Value::as_u64).filter(|&it| it < iterations).ok_or_else(|| {
                    bad(
                        dir,
                        &format!("metrics/rank-{r}.jsonl:{}", i + 1),
                        format!("`iter` must be an iteration of the run's {iterations}"),
                    )
                })?;
            its[it as usize] = measured(rec, recs.get(i + 1).map(|n| num(n, "start")));
        }
        per_rank.push(its);
    }
    let target = summary.get("target_loss").and_then(Value::as_f64);
    let evals = summary.get("evals").and_then(Value::as_array).cloned().unwrap_or_default();
    let target_iterations =
        target.and_then(|g| evals.iter().find(|e| num(e, "loss") <= g).map(|e| num(e, "iter") as u64));
    let sim = SimConfig {
        cfg: Config {
            scheme,
            batch,
            chunk,
            grain: int("grain")? as u32,
            iterations,
            steal_fraction: key("steal-fraction")?.as_float().unwrap_or(0.5),
            seed,
            threads: int("threads")? as usize,
            elastic: Elastic::Fixed,
            inject: Injection { pattern, seed },
            ..Config::default()
        },
        ranks,
        rows: rows.unwrap_or(batch.saturating_mul(iterations.max(1) as usize)),
        params: 0,
        compute: ComputeModel::Replay(Replay::new(per_rank)),
        net: Network { intra: Preset::Local.link(), inter: Preset::Local.link(), ranks_per_node: per_node },
        node_combine,
        overhead: 0.0,
        target_iterations,
    };
    Ok(RunDir {
        sim,
        per_iteration: if iterations > 0 { train / iterations as f64 } else { 0.0 },
        to_target: summary.get("time_to_target").and_then(Value::as_f64),
        rows_known: rows.is_some(),
    })
}

/// What a replay found: measured and simulated time per iteration and to target.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Replayed {
    pub scheme: String,
    pub ranks: usize,
    pub straggler: String,
    pub measured: f64,
    pub simulated: f64,
    pub measured_to_target: Option<f64>,
    pub simulated_to_target: Option<f64>,
}

pub(crate) fn replay(dir: &Path, run: &RunDir) -> Result<Replayed, AppError> {
    let r = sim::simulate(&run.sim, None)
        .map_err(|e| AppError::Train(format!("replaying {}: {e}", dir.display())))?;
    Ok(Replayed {
        scheme: run.sim.cfg.scheme.to_string(),
        ranks: run.sim.ranks,
        straggler: run.sim.cfg.inject.pattern.to_string(),
        measured: run.per_iteration,
        simulated: r.per_iteration,
        measured_to_target: run.to_target,
        simulated_to_target: r.time_to_target,
    })
}

fn replay_cmd(dir: &Path, json: Option<&Path>) -> Result<(), AppError> {
    let run = read_run(dir)?;
    if !run.rows_known {
        eprintln!("note: the run's dataset was not found: its plan is taken to have no short batch");
    }
    let r = replay(dir, &run)?;
    println!(
        "replay of {}: {}, {} ranks x {} threads, {} iterations, {}",
        dir.display(),
        r.scheme,
        r.ranks,
        run.sim.cfg.threads,
        run.sim.cfg.iterations,
        r.straggler
    );
    println!("time per iteration: {}", compare(r.measured, r.simulated));
    if let (Some(m), Some(s)) = (r.measured_to_target, r.simulated_to_target) {
        println!("time to target: {}", compare(m, s));
    }
    if let Some(path) = json {
        write_json(path, &serde_json::to_value(&r).map_err(|e| AppError::Train(e.to_string()))?)?;
    }
    Ok(())
}

/// `measured <s> s, simulated <s> s, ratio <r>`; seconds to four significant digits, so that
/// a sub-millisecond iteration is not rounded to a figure the ratio does not match.
pub(crate) fn compare(measured: f64, simulated: f64) -> String {
    let ratio = if measured > 0.0 { simulated / measured } else { f64::NAN };
    format!("measured {} s, simulated {} s, ratio {ratio:.3}", significant(measured), significant(simulated))
}

/// `v` in plain decimal notation with four significant digits (at least three decimals).
fn significant(v: f64) -> String {
    let decimals = if v.is_finite() && v > 0.0 { (3 - v.log10().floor() as i32).clamp(3, 12) } else { 3 };
    format!("{v:.*}", decimals as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_keep_four_significant_digits() {
        assert_eq!(significant(0.000309123), "0.0003091");
        assert_eq!(significant(12.34567), "12.346");
        assert_eq!(significant(1234.5), "1234.500");
        assert_eq!(significant(0.0), "0.000");
        assert_eq!(compare(0.0003, 0.00027), "measured 0.0003000 s, simulated 0.0002700 s, ratio 0.900");
    }
}
