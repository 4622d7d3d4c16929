//! `peregrine`: straggler-resilient data-parallel training for CPU clusters.
//!
//! One SPMD program for every launch: `mpirun -n N peregrine ...` or `srun peregrine ...` (MPI
//! backend, when built with `--features mpi`), or `peregrine ... --ranks N` with no MPI at all
//! (ranks as threads of this process).
//!
//! The binary is [`main`]; the library exists so that the parsers of outside input behind the
//! commands can be reached by the fuzz targets (`fuzz/`, see [`fuzzing`]).

mod agree;
mod checkpoint;
mod data_cmd;
mod error;
mod experiment;
mod faults;
pub mod fuzzing;
mod limits;
mod meta;
mod model_file;
mod output;
mod plots;
mod predict_cmd;
mod preempt;
mod report_cmd;
mod run_dir;
mod scaling;
mod sim_cmd;
mod slurm_cmd;
mod train;
mod world;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use peregrine_benches::rma;
use peregrine_transport::conformance::{self, Params, CASES};
use serde::{Deserialize, Serialize};

use error::AppError;
use preempt::{Checkpoint, EXIT_REQUEUE};
use world::{run_world, RunContext, WorldArgs};

#[derive(Debug, Parser)]
#[command(
    name = "peregrine",
    version,
    about = "Straggler-resilient data-parallel training for CPU clusters",
    long_about = "Straggler-resilient data-parallel training for CPU clusters.\n\n\
        Peregrine is one SPMD program. Start it under an MPI launcher (`mpirun -n 4 peregrine ...`, \
        `srun peregrine ...`) to run one rank per process over MPI-3 one-sided windows, or without \
        one (`peregrine ... --ranks 4`) to run the ranks as threads of this process.",
    after_help = "Examples:\n  \
        peregrine conformance --ranks 4          # transport conformance suite, 4 threads\n  \
        mpirun -n 4 peregrine conformance        # the same over MPI (build with --features mpi)\n  \
        mpirun -n 2 peregrine bench rma          # OSU-style RMA latency/bandwidth vs raw MPI\n  \
        peregrine slurm sbatch --nodes 2 --ntasks-per-node 4 --cpus-per-task 8 --time 1:00:00 \\\n      \
        --dry-run -- conformance --repeat 100   # a batch script for Slurm\n\n\
        Exit codes: 0 success, 1 failure, 2 bad command line, 75 stopped on a signal (resume by running \
        the same command with the same --run-dir: from the stop's checkpoint, or the last one when a rank \
        could not reach the stop within 15 s), 101 a panic in any thread (a bug: the message names the rank \
        and thread), 124 ended by the watchdog (a rank made no progress for --watchdog seconds; rerun to \
        resume from the last checkpoint)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train a model data-parallel over the ranks (see `peregrine train --help`).
    ///
    /// Parameters are sharded over all ranks in one-sided windows; each rank computes its part of
    /// every mini-batch on its own pinned threads and takes over chunks from slower ranks.
    Train(Box<train::TrainArgs>),
    /// Apply a trained model (model.safetensors from `peregrine train`) to a dataset: predictions
    /// as CSV, and the loss and accuracy/RMSE when the rows have labels (see `peregrine predict
    /// --help`).
    Predict(predict_cmd::PredictArgs),
    /// Run the straggler experiment: schemes x straggler patterns x workloads x seeds, with tables
    /// and plots (see `peregrine experiment --help`).
    Experiment(Box<experiment::ExperimentArgs>),
    /// A finished run's straggler report (which ranks were slow, by how much, what it cost the
    /// others, the pattern) and plots: loss against time, each rank's compute, communication and
    /// waiting per iteration, chunks taken over between ranks (see `peregrine report --help`).
    Report(report_cmd::ReportArgs),
    /// Simulate a cluster: the schemes' own policies at up to thousands of ranks in virtual time,
    /// or a real run replayed (see `peregrine simulate --help`).
    Simulate(Box<sim_cmd::SimArgs>),
    /// Run the transport conformance suite on every rank; exit 0 iff every case passes everywhere.
    ///
    /// Cases: collectives; uneven shards and ranges that cross them; every rank accumulating into
    /// every shard (f32, f64, u64); fetch_add tickets; compare-and-swap election and spin lock;
    /// bad use reported as errors.
    Conformance(ConformanceArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Datasets: convert LIBSVM, MNIST IDX and ratings text; describe; generate synthetic ones.
    #[command(subcommand)]
    Data(data_cmd::DataCommand),
    /// Slurm: batch scripts, and the job environment as Peregrine reads it.
    #[command(subcommand)]
    Slurm(slurm_cmd::SlurmCommand),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// OSU-style one-sided latency (8 B) and bandwidth (8 B..4 MiB) of get, put, accumulate and
    /// fetch_add, rank 0 -> rank 1; under MPI, next to raw MPI measured in the same run.
    Rma(RmaArgs),
    /// LB-BSP's speed predictors (ARX, moving average, NARX) on synthetic speed traces with and
    /// without structure: mean relative prediction error per trace and the cost of an
    /// observation. One process, no ranks.
    Predictors(PredictorArgs),
    /// This machine's limits, for judging kernels against: the peak f32 FMA throughput (the
    /// widest vectors this build emits, independent chains in registers) on one thread and on
    /// `--threads`, STREAM's triad bandwidth on `--threads`, and the round trip of one cache line
    /// between the first two CPUs this process may use (what every line a rank pushes to or
    /// pulls from another rank of the machine waits on). Best of `--reps` runs each.
    Roofline(RooflineArgs),
}

#[derive(Debug, Args)]
struct RooflineArgs {
    /// Threads of the multi-threaded figures (default: the CPUs this process may run on).
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096))]
    threads: Option<usize>,
    /// Seconds of each FMA run.
    #[arg(long, default_value_t = 0.3, value_name = "S", value_parser = positive_seconds)]
    seconds: f64,
    /// Elements (f32) of each of the triad's three arrays: at least 4x the last-level cache, as
    /// STREAM asks (default 2^25: 128 MiB each).
    #[arg(long, default_value_t = 1 << 25, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..=1 << 34))]
    elems: usize,
    /// Runs of each probe; the best is reported.
    #[arg(long, default_value_t = 5, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    reps: usize,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Also draw the roofline into FILE.png and FILE.svg (a trailing .png or .svg is dropped):
    /// the FMA peak and the triad as the roof, each --point on it.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// A workload on the plot: its label, arithmetic intensity (FLOP per byte moved) and achieved
    /// GFLOP/s, e.g. `softmax=10,16.4` (repeatable; needs --plot).
    #[arg(long, value_name = "LABEL=FLOP_PER_BYTE,GFLOPS", value_parser = roof_point, requires = "plot")]
    point: Vec<plots::RoofPoint>,
    /// The roof as measured before (FMA peak GFLOP/s, triad GB/s), e.g. from an earlier `--json`
    /// of the same run: nothing is measured, only the plot drawn (needs --plot).
    #[arg(long, value_name = "GFLOPS,GBS", value_parser = roof_pair, requires = "plot")]
    roof: Option<(f64, f64)>,
}

/// A positive finite number, or why not.
fn positive(what: &str, s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{what} `{s}` is not a positive number")),
    }
}

/// `LABEL=INTENSITY,GFLOPS`.
fn roof_point(s: &str) -> Result<plots::RoofPoint, String> {
    let (label, rest) = s.rsplit_once('=').ok_or("expected LABEL=FLOP_PER_BYTE,GFLOPS")?;
    let (i, g) = rest.split_once(',').ok_or("expected LABEL=FLOP_PER_BYTE,GFLOPS")?;
    if label.trim().is_empty() {
        return Err("the label is empty".into());
    }
    let (intensity, gflops) = (positive("intensity", i)?, positive("GFLOP/s", g)?);
    Ok(plots::RoofPoint { label: label.trim().to_owned(), intensity, gflops })
}

/// `GFLOPS,GBS`.
fn roof_pair(s: &str) -> Result<(f64, f64), String> {
    let (p, b) = s.split_once(',').ok_or("expected GFLOPS,GBS")?;
    Ok((positive("FMA peak", p)?, positive("bandwidth", b)?))
}

/// A number of seconds in (0, 60].
fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 60.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds in (0, 60]")),
    }
}

#[derive(Debug, Args)]
struct PredictorArgs {
    /// Iterations per trace.
    #[arg(long, default_value_t = 600, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(50..=1_000_000))]
    len: usize,
    /// Seeds of the traces (comma-separated); each trace's error is the mean over them.
    #[arg(long, default_value = "2,3,4", value_delimiter = ',', value_name = "S,...", num_args = 1..)]
    seeds: Vec<u64>,
    /// First iterations of each trace not counted (warm-up).
    #[arg(long, default_value_t = 30, value_name = "N")]
    skip: usize,
}

#[derive(Debug, Args)]
struct ConformanceArgs {
    #[command(flatten)]
    world: WorldArgs,
    /// fetch_add calls per rank on the shared counter.
    #[arg(long, default_value_t = Params::default().tickets_per_rank, value_name = "K")]
    tickets: usize,
    /// Rounds of the compare-and-swap election and critical sections of the spin lock.
    #[arg(long, default_value_t = Params::default().election_rounds, value_name = "R")]
    rounds: usize,
    /// Run the whole suite this many times (a long job, e.g. to try preemption and requeueing).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    repeat: usize,
}

#[derive(Debug, Args)]
struct RmaArgs {
    #[command(flatten)]
    world: WorldArgs,
    /// Smallest message of the bandwidth sweep, bytes (a multiple of 8).
    #[arg(long, default_value_t = 8, value_name = "BYTES", value_parser = size_parser)]
    min_size: usize,
    /// Largest message of the bandwidth sweep, bytes (a multiple of 8; K/M suffixes allowed).
    #[arg(long, default_value = "4M", value_name = "BYTES", value_parser = size_parser)]
    max_size: usize,
    /// Timed iterations of each latency loop; the bandwidth loops time a twentieth as many
    /// windows (each of up to 64 operations), at most 256 MiB a trial.
    #[arg(long, default_value_t = rma::Config::default().latency_iters, value_name = "N")]
    iters: usize,
    /// Trials per figure: the median time is reported, and the median of the trials' ratios to
    /// raw MPI.
    #[arg(long, default_value_t = rma::Config::default().trials, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    trials: usize,
    /// Skip the raw-MPI reference.
    #[arg(long)]
    no_raw: bool,
}

/// Parses `4096`, `64K`, `4M` (binary units) into bytes; must be a positive multiple of 8.
fn size_parser(s: &str) -> Result<usize, String> {
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let mult = match unit {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        _ => return Err(format!("`{s}`: expected a size like 4096, 64K or 4M")),
    };
    let n: usize = digits.parse().map_err(|_| format!("`{s}`: expected a size like 4096, 64K or 4M"))?;
    let bytes = n.checked_mul(mult).ok_or_else(|| format!("`{s}` is too large"))?;
    if bytes == 0 || bytes % 8 != 0 {
        return Err(format!("`{s}`: sizes must be positive multiples of 8 bytes"));
    }
    Ok(bytes)
}

/// Writes `peregrine: {message}` and a newline to stderr in one write. Stderr is unbuffered and
/// `eprintln!` writes each piece of its format separately, so the messages of ranks sharing a
/// terminal or a pipe (`mpirun`) came out interleaved mid-line ("error: rank 1peregrine: error:
/// ..."); one write of a line under the pipe's atomic size (4 KiB) is never split.
pub(crate) fn say(message: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let line = format!("peregrine: {message}\n");
    // Nothing better to do if stderr is gone.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The `peregrine` command: parses the command line, runs the command, and maps its outcome to
/// the exit code.
pub fn main() -> ExitCode {
    // First, before any code compiled for this build's instruction set can meet a CPU without it.
    if let Err(e) = cpu_check() {
        say(format_args!("error: {e}"));
        return ExitCode::from(EXIT_CPU as u8);
    }
    let cli = Cli::parse();
    if let Err(e) = faults::install() {
        say(format_args!("error: {e}"));
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Train(a) => train::run(*a),
        Command::Experiment(a) => experiment::run(*a),
        Command::Predict(a) => predict_cmd::run(a),
        Command::Simulate(a) => sim_cmd::run(*a),
        Command::Report(a) => report_cmd::run(&a),
        Command::Conformance(a) => conformance_cmd(&a),
        Command::Bench(BenchCommand::Rma(a)) => rma_cmd(&a),
        Command::Bench(BenchCommand::Predictors(a)) => {
            predictors_cmd(&a);
            Ok(())
        }
        Command::Bench(BenchCommand::Roofline(a)) => roofline_cmd(&a),
        Command::Slurm(c) => slurm_cmd::run(c),
        Command::Data(c) => data_cmd::run(c),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ (AppError::Preempted { .. } | AppError::StoppedBeforeStart { .. })) => {
            say(format_args!("{e}"));
            ExitCode::from(EXIT_REQUEUE as u8)
        }
        // A usage error, found on this rank or agreed by every rank.
        Err(e) if e.is_usage() => {
            say(format_args!("error: {e}"));
            ExitCode::from(2)
        }
        Err(e) => {
            say(format_args!("error: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// Exit status when the CPU lacks an instruction-set feature this binary was compiled for
/// (the shells' 128 + SIGILL, which the binary would otherwise die with, silently).
pub const EXIT_CPU: i32 = 132;

/// [`peregrine_kernels::cpu::check`] against the CPU, or against the comma-separated feature
/// names in `PEREGRINE_ASSUME_CPU_FEATURES` (for tests: a CPU that lacks some).
fn cpu_check() -> Result<(), String> {
    let assumed = std::env::var("PEREGRINE_ASSUME_CPU_FEATURES").ok();
    let assumed: Option<Vec<&str>> = assumed.as_deref().map(|s| s.split(',').map(str::trim).collect());
    peregrine_kernels::cpu::check(assumed.as_deref())
}

/// Where a repeated conformance run stands: the next case to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct ConformanceState {
    repeat: usize,
    round: usize,
    case: usize,
}

fn conformance_cmd(a: &ConformanceArgs) -> Result<(), AppError> {
    // Per rank: the tickets (a window's share, the list, its ranges and ones: 48 bytes a
    // ticket) and the election's rounds (a window's share and a list: 16 bytes a round).
    let ranks = a.world.ranks.unwrap_or(4) as u128;
    let need = ranks * (48 * a.tickets as u128 + 16 * a.rounds as u128);
    let what = format!("--tickets {} and --rounds {} on {ranks} rank(s)", a.tickets, a.rounds);
    limits::fits(need, &what, "fewer --tickets or --rounds")?;
    let params = Params {
        tickets_per_rank: a.tickets,
        election_rounds: a.rounds,
        lock_sections: a.rounds,
        whole_in_place: None,
    };
    run_world(&a.world, 4, |t, ctx| conformance_rank(t, ctx, a, &params))
}

fn conformance_rank(
    t: &peregrine_transport::Transport,
    ctx: &RunContext,
    a: &ConformanceArgs,
    params: &Params,
) -> Result<(), AppError> {
    let checkpoint = ctx.run_dir.as_deref().map(Checkpoint::in_dir);
    let mut at = ConformanceState { repeat: a.repeat, round: 0, case: 0 };
    if let Some(cp) = &checkpoint {
        if let Some(saved) = cp.load::<ConformanceState>()? {
            if saved.repeat != a.repeat || saved.case >= CASES.len() {
                return Err(AppError::Data {
                    what: cp.path().display().to_string(),
                    detail: format!(
                        "checkpoint of a different run ({saved:?}); remove it or use another --run-dir"
                    ),
                });
            }
            at = saved;
            if t.rank() == 0 {
                println!(
                    "resuming from {}: round {} of {}, case {}",
                    cp.path().display(),
                    at.round + 1,
                    a.repeat,
                    CASES[at.case].name
                );
            }
        }
    }
    if let Some(dir) = &ctx.run_dir {
        meta::write(t, dir, ctx.slurm.as_ref())?;
    }
    while at.round < a.repeat {
        while at.case < CASES.len() {
            if ctx.preemption.should_stop(t)? {
                let Some(cp) = &checkpoint else {
                    return Err(AppError::Launch(
                        "stopped on a signal; no --run-dir to save the state in".into(),
                    ));
                };
                if t.rank() == 0 {
                    cp.save(&at)?;
                }
                t.barrier()?;
                return Err(AppError::Preempted { checkpoint: cp.path().display().to_string() });
            }
            let r = conformance::run_case(t, &CASES[at.case], params);
            if t.rank() == 0 || r.outcome.is_err() {
                let round =
                    if a.repeat > 1 { format!("[{}/{}] ", at.round + 1, a.repeat) } else { String::new() };
                println!("{round}{}", r.line(t));
            }
            r.outcome.map_err(|e| AppError::Conformance(e.to_string()))?;
            at.case += 1;
        }
        at.case = 0;
        at.round += 1;
    }
    if t.rank() == 0 {
        if let Some(cp) = &checkpoint {
            cp.remove()?;
        }
        println!("{}", conformance::summary_line(t));
    }
    Ok(())
}

/// `peregrine bench roofline`: measures (unless `--roof` gives the figures), then draws the plot
/// if asked.
fn roofline_cmd(a: &RooflineArgs) -> Result<(), AppError> {
    // The plot's files are checked before seconds of measuring.
    let stem = a.plot.as_deref().map(plot_stem).transpose()?;
    let (peak, triad) = match a.roof {
        Some(roof) => roof,
        None => measure_roofline(a),
    };
    let Some(stem) = stem else { return Ok(()) };
    let title = format!("Roofline: FMA peak {peak:.1} GFLOP/s, triad {triad:.1} GB/s");
    plots::roofline(&stem, &title, peak, triad, &a.point)?;
    let n = a.point.len();
    say(format_args!(
        "wrote {0}.png and {0}.svg ({n} workload{1})",
        stem.display(),
        if n == 1 { "" } else { "s" }
    ));
    Ok(())
}

/// The stem of `--plot FILE` (a trailing .png or .svg dropped), once both files it names may be
/// written: in an existing folder, each absent or a regular file (not a link, a folder, a FIFO).
fn plot_stem(plot: &std::path::Path) -> Result<PathBuf, AppError> {
    let stem = match plot.extension().and_then(|e| e.to_str()) {
        Some("png" | "svg") => plot.with_extension(""),
        _ => plot.to_owned(),
    };
    let usage = |why: String| AppError::Usage(format!("--plot {}: {why}", plot.display()));
    if stem.file_name().is_none() || plot.to_string_lossy().ends_with('/') {
        return Err(usage("names no file (give a file's path; .png and .svg are added)".into()));
    }
    if let Some(dir) = stem.parent().filter(|d| !d.as_os_str().is_empty() && !d.is_dir()) {
        return Err(usage(format!("the folder {} does not exist", dir.display())));
    }
    for file in plots::files(&stem) {
        output::check("--plot", &file, &[])?;
    }
    Ok(stem)
}

/// The figures of `peregrine bench roofline`, printed (text or `--json`); the FMA peak on every
/// thread and the triad, for the plot.
fn measure_roofline(a: &RooflineArgs) -> (f64, f64) {
    use peregrine_kernels::{cpu, roofline};
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let each = std::time::Duration::from_secs_f64(a.seconds);
    let simd = cpu::summary();
    // The peak of the instructions the MLP's products use (AVX-512 where the CPU has it, chosen
    // at run time), and of the build's own `f32x8` where that differs.
    let isa = cpu::Isa::best();
    let vector = |isa: cpu::Isa| {
        let fused = isa == cpu::Isa::Avx512 || roofline::FUSED;
        format!(
            "f32 x {} lanes ({}), {} chains per thread, {}",
            isa.lanes(),
            isa.name(),
            roofline::chains(isa),
            if fused { "fused multiply-add" } else { "multiply and add (not fused)" }
        )
    };
    let one = roofline::fma_peak_gflops(isa, 1, each, a.reps);
    let all = roofline::fma_peak_gflops(isa, threads, each, a.reps);
    let narrow = (isa != cpu::Isa::F32x8).then(|| {
        let f = cpu::Isa::F32x8;
        (roofline::fma_peak_gflops(f, 1, each, a.reps), roofline::fma_peak_gflops(f, threads, each, a.reps))
    });
    let triad = roofline::triad_gbs(threads, a.elems, a.reps);
    let two = peregrine_core::pool::allowed_cpus().ok().filter(|c| c.len() >= 2).map(|c| [c[0], c[1]]);
    // The first two CPUs: a line's round trip between them (100,000 round trips: 5-40 ms a run on
    // the machines seen), and a block handed both ways (1,000 rounds: ~20 ms).
    let pair = two.map(|cpus| {
        let place = |i: usize| {
            peregrine_core::pool::pin_current_thread(cpus[i]);
        };
        (
            cpus,
            roofline::line_round_trip_ns(100_000, a.reps, place),
            roofline::handoff(roofline::HANDOFF_BYTES, 1000, a.reps, place),
        )
    });
    if a.json {
        let pair_json = pair.map_or_else(
            || {
                "\"line_round_trip_ns\": null, \"handoff_copy_gbs\": null, \"handoff_read_gbs\": null, \
                 \"handoff_local_gbs\": null"
                    .to_owned()
            },
            |(c, ns, h)| {
                format!(
                    "\"line_round_trip_ns\": {ns:.1}, \"line_cpus\": [{}, {}], \"handoff_bytes\": {}, \
                     \"handoff_copy_gbs\": {:.2}, \"handoff_read_gbs\": {:.2}, \"handoff_local_gbs\": {:.2}",
                    c[0],
                    c[1],
                    roofline::HANDOFF_BYTES,
                    h.copy_gbs,
                    h.read_gbs,
                    h.local_gbs
                )
            },
        );
        let narrow_json = narrow.map_or_else(
            || "\"f32x8_fma_gflops_1\": null, \"f32x8_fma_gflops\": null".to_owned(),
            |(one, all)| format!("\"f32x8_fma_gflops_1\": {one:.2}, \"f32x8_fma_gflops\": {all:.2}"),
        );
        println!(
            "{{\"simd\": \"{simd}\", \"isa\": \"{}\", \"vector\": \"{}\", \"threads\": {threads}, \
             \"fma_gflops_1\": {one:.2}, \"fma_gflops\": {all:.2}, {narrow_json}, \"triad_gbs\": {triad:.2}, \
             \"triad_elems\": {}, {pair_json}}}",
            isa.name(),
            vector(isa),
            a.elems
        );
        return (all, triad);
    }
    println!("instruction set   {simd}");
    println!("FMA probe         {}", vector(isa));
    println!("FMA peak          {one:8.1} GFLOP/s on 1 thread, {all:8.1} GFLOP/s on {threads}");
    if let Some((one, all)) = narrow {
        println!("FMA peak, f32x8   {one:8.1} GFLOP/s on 1 thread, {all:8.1} GFLOP/s on {threads} (the build's own vectors)");
    }
    println!(
        "STREAM triad      {triad:8.1} GB/s on {threads} (3 x {} MiB f32, 12 B per element counted)",
        (a.elems * 4) >> 20
    );
    match pair {
        Some((c, ns, h)) => {
            println!(
                "line round trip   {ns:8.1} ns between CPUs {} and {} (one cache line, handed back and forth)",
                c[0], c[1]
            );
            println!(
                "handoff           {:8.1} GB/s a CPU reading {} KiB the other just wrote ({:.1} from its own cache), \
                 {:.1} GB/s copying into lines the other read (both CPUs at once)",
                h.read_gbs,
                roofline::HANDOFF_BYTES >> 10,
                h.local_gbs,
                h.copy_gbs
            );
        }
        None => println!("line round trip   not measured: this process may run on one CPU only"),
    }
    (all, triad)
}

/// Prints the predictors' table: one row per trace, the mean relative error of each predictor
/// over the seeds, the best in bold; then microseconds per observation.
fn predictors_cmd(a: &PredictorArgs) {
    use peregrine_core::scheme::lbbsp::Predictor;
    use peregrine_core::scheme::traces;
    let skip = a.skip.min(a.len - 1);
    println!(
        "# peregrine bench predictors: {} iterations per trace, seeds {:?}, first {skip} not counted; \
         mean |predicted - speed| / speed",
        a.len, a.seeds
    );
    let names: Vec<String> = Predictor::ALL.iter().map(|p| format!("lb-bsp:{p}")).collect();
    println!("| trace | {} |", names.join(" | "));
    println!("|---|{}", "---:|".repeat(names.len()));
    let mut cost = [std::time::Duration::ZERO; 3];
    for name in traces::NAMES {
        let mut err = [0.0; 3];
        for &seed in &a.seeds {
            let t = traces::trace(name, a.len, seed);
            for (k, &p) in Predictor::ALL.iter().enumerate() {
                let t0 = std::time::Instant::now();
                err[k] += traces::error(p, &t, skip) / a.seeds.len() as f64;
                cost[k] += t0.elapsed();
            }
        }
        let best = err.iter().copied().fold(f64::INFINITY, f64::min);
        let cells: Vec<String> =
            err.iter()
                .map(|&e| {
                    if e == best {
                        format!("**{:.2} %**", 100.0 * e)
                    } else {
                        format!("{:.2} %", 100.0 * e)
                    }
                })
                .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    let per = (traces::NAMES.len() * a.seeds.len() * a.len) as f64;
    let us: Vec<String> = cost.iter().map(|c| format!("{:.1}", c.as_secs_f64() * 1e6 / per)).collect();
    println!("| us per observation | {} |", us.join(" | "));
}

fn rma_cmd(a: &RmaArgs) -> Result<(), AppError> {
    if a.min_size > a.max_size {
        return Err(AppError::Usage(format!(
            "--min-size {} is larger than --max-size {}",
            a.min_size, a.max_size
        )));
    }
    // Per rank two windows of --max-size (data and counters, as the raw reference's), and rank
    // 0's origin buffer of at least 16 MiB.
    let ranks = a.world.ranks.unwrap_or(2) as u128;
    let need = ranks * 3 * a.max_size as u128 + (16 << 20);
    limits::fits(need, &format!("--max-size {} on {ranks} rank(s)", a.max_size), "a smaller --max-size")?;
    let cfg = rma::Config {
        min_size: a.min_size,
        max_size: a.max_size,
        latency_iters: a.iters,
        trials: a.trials,
        raw: !a.no_raw,
        ..rma::Config::default()
    };
    run_world(&a.world, 2, |t, _| {
        if t.rank() == 0 {
            println!(
                "# peregrine bench rma: backend {}, {} ranks, rank 0 -> rank {}; median of {} trials (ratio: median of the trials' ratios)",
                t.backend(),
                t.world_size(),
                usize::from(t.world_size() > 1),
                cfg.trials
            );
            println!("{}", rma::Row::header(rma::Kind::Latency));
        }
        let mut last = rma::Kind::Latency;
        rma::run(t, &cfg, |row| {
            if row.kind != last {
                last = row.kind;
                println!("{}", rma::Row::header(row.kind));
            }
            println!("{row}");
        })?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(size_parser("8"), Ok(8));
        assert_eq!(size_parser("64K"), Ok(64 << 10));
        assert_eq!(size_parser("4M"), Ok(4 << 20));
        assert!(size_parser("12").is_err());
        assert!(size_parser("0").is_err());
        assert!(size_parser("4G").is_err());
        assert!(size_parser("x").is_err());
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
