//! `peregrine`: straggler-resilient data-parallel training for CPU clusters.
//!
//! One SPMD program for every launch: `mpirun -n N peregrine ...` or `srun peregrine ...` (MPI
//! backend, when built with `--features mpi`), or `peregrine ... --ranks N` with no MPI at all
//! (ranks as threads of this process).

mod world;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use peregrine_benches::rma;
use peregrine_transport::conformance::{self, Params};

use world::{run_world, AppError, WorldArgs};

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
        mpirun -n 2 peregrine bench rma          # OSU-style RMA latency/bandwidth vs raw MPI"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the transport conformance suite on every rank; exit 0 iff every case passes everywhere.
    ///
    /// Cases: collectives; uneven shards and ranges that cross them; every rank accumulating into
    /// every shard (f32, f64, u64); fetch_add tickets; compare-and-swap election and spin lock;
    /// bad use reported as errors.
    Conformance(ConformanceArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// OSU-style one-sided latency (8 B) and bandwidth (8 B..4 MiB) of get, put, accumulate and
    /// fetch_add, rank 0 -> rank 1; under MPI, next to raw MPI measured in the same run.
    Rma(RmaArgs),
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
    /// Timed iterations of each latency loop.
    #[arg(long, default_value_t = rma::Config::default().latency_iters, value_name = "N")]
    iters: usize,
    /// Trials per figure; the median is reported.
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Conformance(a) => conformance_cmd(&a),
        Command::Bench(BenchCommand::Rma(a)) => rma_cmd(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("peregrine: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn conformance_cmd(a: &ConformanceArgs) -> Result<(), AppError> {
    let params = Params { tickets_per_rank: a.tickets, election_rounds: a.rounds, lock_sections: a.rounds };
    run_world(&a.world, 4, |t| {
        let outcome = conformance::run_all(t, &params, |r| {
            if t.rank() == 0 || r.outcome.is_err() {
                println!("{}", r.line(t));
            }
        });
        outcome.map_err(|e| AppError::Conformance(e.to_string()))?;
        if t.rank() == 0 {
            println!("{}", conformance::summary_line(t));
        }
        Ok(())
    })
}

fn rma_cmd(a: &RmaArgs) -> Result<(), AppError> {
    if a.min_size > a.max_size {
        return Err(AppError::Usage(format!(
            "--min-size {} is larger than --max-size {}",
            a.min_size, a.max_size
        )));
    }
    let cfg = rma::Config {
        min_size: a.min_size,
        max_size: a.max_size,
        latency_iters: a.iters,
        trials: a.trials,
        raw: !a.no_raw,
        ..rma::Config::default()
    };
    run_world(&a.world, 2, |t| {
        if t.rank() == 0 {
            println!(
                "# peregrine bench rma: backend {}, {} ranks, rank 0 -> rank {}; median of {} trials",
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
