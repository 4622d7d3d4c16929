//! SPMD program: the chunk-queue exactly-once check (`peregrine_tests::stealing`) on every rank.
//!
//! `stealing [--backend local|mpi] [--ranks N] [--iterations K] [--threads T]`; exit 0 iff every
//! chunk of every iteration was handed out exactly once on every rank.

use std::process::ExitCode;

use peregrine_tests::stealing::exactly_once;
use peregrine_transport::{Backend, ReduceOp, Transport};

fn main() -> ExitCode {
    let (mut backend, mut ranks, mut iterations, mut threads) = (Backend::detect(), 4usize, 20u64, 3usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        let ok = match a.as_str() {
            "--backend" => v.parse().map(|b| backend = b).is_ok(),
            "--ranks" => v.parse().map(|n| ranks = n).is_ok(),
            "--iterations" => v.parse().map(|n| iterations = n).is_ok(),
            "--threads" => v.parse().map(|n| threads = n).is_ok(),
            _ => false,
        };
        if !ok {
            eprintln!("error: bad argument `{a} {v}`; usage: stealing [--backend local|mpi] [--ranks N] [--iterations K] [--threads T]");
            return ExitCode::from(2);
        }
    }
    let body = |t: Transport| -> bool {
        match exactly_once(&t, iterations, threads) {
            Ok(r) => {
                let mut s = [r.stolen, r.own];
                if t.allreduce(&mut s, ReduceOp::Sum).is_err() {
                    return false;
                }
                if t.rank() == 0 {
                    println!(
                        "stealing: every chunk handed out exactly once: {} ranks x {threads} threads, {iterations} iterations, {} chunks taken over, {} own ({})",
                        t.world_size(),
                        s[0],
                        s[1],
                        t.backend()
                    );
                }
                true
            }
            Err(m) => {
                eprintln!("FAIL {m}");
                false
            }
        }
    };
    peregrine_tests::run_spmd(backend, ranks, body)
}
