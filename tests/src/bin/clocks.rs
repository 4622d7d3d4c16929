//! SPMD program: the clocks' combining-tree check (`peregrine_tests::clocks`) on every rank.
//!
//! `clocks [--backend local|mpi] [--ranks N] [--iterations K] [--threads T]`; exit 0 iff every
//! rank saw the trees answer exactly as reading every rank's word does (and the tree of sums as
//! the values every rank added).

use std::process::ExitCode;

use peregrine_tests::clocks::agree;
use peregrine_tests::SpmdArgs;
use peregrine_transport::{Backend, Transport};

fn main() -> ExitCode {
    let defaults = SpmdArgs { backend: Backend::detect(), ranks: 4, iterations: 30, threads: 2 };
    let SpmdArgs { backend, ranks, iterations, threads } = match SpmdArgs::parse("clocks", defaults) {
        Ok(a) => a,
        Err(m) => {
            eprintln!("{m}");
            return ExitCode::from(2);
        }
    };
    let body = |t: Transport| -> bool {
        match agree(&t, iterations, threads) {
            Ok(r) => {
                if t.rank() == 0 {
                    println!(
                        "clocks: the trees agree with every rank's words: {} ranks x {threads} threads, {} iterations lined up, {} ticks under SSP(2), {} rounds of sums ({})",
                        t.world_size(),
                        r.lined_up,
                        r.ticked,
                        r.summed,
                        t.backend()
                    );
                }
                true
            }
            Err(m) => {
                eprintln!("FAIL {m}");
                // The others wait for this rank in the check's next collective: end them all.
                if t.world_size() > 1 {
                    t.abort(1);
                }
                false
            }
        }
    };
    peregrine_tests::run_spmd(backend, ranks, body)
}
