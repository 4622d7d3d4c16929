//! SPMD program: the clocks' combining-tree check (`peregrine_tests::clocks`) on every rank.
//!
//! `clocks [--backend local|mpi] [--ranks N] [--iterations K] [--threads T]`; exit 0 iff every
//! rank saw the trees answer exactly as reading every rank's word does.

use std::process::ExitCode;

use peregrine_tests::clocks::agree;
use peregrine_transport::{Backend, Transport};

fn main() -> ExitCode {
    let (mut backend, mut ranks, mut iterations, mut threads) = (Backend::detect(), 4usize, 30u64, 2usize);
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
            eprintln!("error: bad argument `{a} {v}`; usage: clocks [--backend local|mpi] [--ranks N] [--iterations K] [--threads T]");
            return ExitCode::from(2);
        }
    }
    let body = |t: Transport| -> bool {
        match agree(&t, iterations, threads) {
            Ok(r) => {
                if t.rank() == 0 {
                    println!(
                        "clocks: the trees agree with every rank's words: {} ranks x {threads} threads, {} iterations lined up, {} ticks under SSP(2) ({})",
                        t.world_size(),
                        r.lined_up,
                        r.ticked,
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
