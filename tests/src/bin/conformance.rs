//! SPMD program: every rank runs the transport conformance suite; rank 0 prints one line per case.
//!
//! `conformance [--backend local|mpi] [--ranks N] [--tickets K] [--rounds R] [--whole-in-place yes|no]`
//! (whether shared windows must be read whole in place; either, if not given). The backend defaults to `mpi` when
//! started by an MPI launcher, else `local` with `--ranks` threads (default 4). Exit code 0 iff every
//! case passed on every rank.

use std::process::ExitCode;

use peregrine_transport::conformance::{run_all, summary_line, Params};
use peregrine_transport::{Backend, Transport};

const USAGE: &str =
    "conformance [--backend local|mpi] [--ranks N] [--tickets K] [--rounds R] [--whole-in-place yes|no]";

fn main() -> ExitCode {
    let mut backend = Backend::detect();
    let mut ranks = 4;
    let mut params = Params::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next();
        let parsed = match (a.as_str(), value.as_deref()) {
            ("--backend", Some(v)) => v.parse().map(|b| backend = b).map_err(|e| e.to_string()),
            ("--ranks", Some(v)) => v.parse().map(|n| ranks = n).map_err(|e| format!("--ranks {v}: {e}")),
            ("--tickets", Some(v)) => {
                v.parse().map(|k| params.tickets_per_rank = k).map_err(|e| format!("--tickets {v}: {e}"))
            }
            ("--rounds", Some(v)) => v
                .parse()
                .map(|k| {
                    params.election_rounds = k;
                    params.lock_sections = k;
                })
                .map_err(|e| format!("--rounds {v}: {e}")),
            ("--whole-in-place", Some(v @ ("yes" | "no"))) => {
                params.whole_in_place = Some(v == "yes");
                Ok(())
            }
            ("--whole-in-place", Some(v)) => Err(format!("--whole-in-place {v}: expected yes or no")),
            _ => Err(format!("unexpected argument `{a}`; usage: {USAGE}")),
        };
        if let Err(e) = parsed {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    let body = |t: Transport| -> bool {
        let ok = run_all(&t, &params, |r| {
            if t.rank() == 0 || r.outcome.is_err() {
                println!("{}", r.line(&t));
            }
        })
        .is_ok();
        if ok && t.rank() == 0 {
            println!("{}", summary_line(&t));
        }
        ok
    };
    peregrine_tests::run_spmd(backend, ranks, body)
}
