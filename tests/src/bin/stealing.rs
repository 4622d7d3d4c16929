//! SPMD program: the chunk-queue exactly-once check (`peregrine_tests::stealing`) on every rank.
//!
//! `stealing [--backend local|mpi] [--ranks N] [--iterations K] [--threads T]`; exit 0 iff every
//! chunk of every iteration was handed out exactly once on every rank.

use std::process::ExitCode;

use peregrine_tests::stealing::exactly_once;
use peregrine_tests::SpmdArgs;
use peregrine_transport::{Backend, ReduceOp, Transport};

fn main() -> ExitCode {
    let defaults = SpmdArgs { backend: Backend::detect(), ranks: 4, iterations: 20, threads: 3 };
    let SpmdArgs { backend, ranks, iterations, threads } = match SpmdArgs::parse("stealing", defaults) {
        Ok(a) => a,
        Err(m) => {
            eprintln!("{m}");
            return ExitCode::from(2);
        }
    };
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
