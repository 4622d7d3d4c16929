//! SPMD program: the training engine's checks (`peregrine_tests::training`) on every rank.
//!
//! `training exactly-once [--backend local|mpi] [--ranks N] [--threads T]
//! [--takeover required|optional]`: every chunk computed exactly once under BSP, SSP(2), ASP,
//! Falcon, FlexRR and speculative execution (copies of a chunk race, one result is applied), with
//! rank 0 slowed down (and, unless `--takeover optional`, chunks taken over from it under one
//! scheme at least), and with the active thread count changing between iterations.
//! `training params --data FILE --out FILE [--optimizer NAME] [--backend ...] [--ranks N]`: BSP
//! logistic regression on FILE; rank 0 writes the final parameters, one per line, to `--out`.
//! `training mf-params --data FILE --out FILE --trace DIR [--backend ...] [--ranks N]`: BSP matrix
//! factorization in strata on the ratings in FILE (`training::mf_strata`), the pushes of disjoint
//! batches putting new values, traced into DIR; rank 0 writes the final parameters to `--out`.

use std::process::ExitCode;

use peregrine_core::model::lr::LogReg;
use peregrine_tests::training::{self, exactly_once, exactly_once_elastic, final_params_by, scheme};
use peregrine_transport::{Backend, Transport};

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mode = if args.is_empty() { String::new() } else { args.remove(0) };
    let (mut backend, mut ranks, mut threads) = (Backend::detect(), 2usize, 2usize);
    let mut takeover = true;
    let (mut data, mut out, mut optimizer) = (None, None, peregrine_core::optim::Optimizer::Sgd);
    let mut trace = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let v = it.next().unwrap_or_default();
        let ok = match a.as_str() {
            "--backend" => v.parse().map(|b| backend = b).is_ok(),
            "--ranks" => v.parse().map(|n| ranks = n).is_ok(),
            "--threads" => v.parse().map(|n| threads = n).is_ok(),
            "--takeover" => match v.as_str() {
                "required" => {
                    takeover = true;
                    true
                }
                "optional" => {
                    takeover = false;
                    true
                }
                _ => false,
            },
            "--data" => {
                data = Some(v.clone());
                true
            }
            "--optimizer" => v.parse().map(|o| optimizer = o).is_ok(),
            "--out" => {
                out = Some(v.clone());
                true
            }
            "--trace" => {
                trace = Some(std::path::PathBuf::from(&v));
                true
            }
            _ => false,
        };
        if !ok {
            eprintln!("error: bad argument `{a} {v}`");
            return ExitCode::from(2);
        }
    }
    let body = |t: Transport| -> bool {
        let result = match mode.as_str() {
            "exactly-once" => [scheme("bsp"), scheme("ssp:2"), scheme("asp"), scheme("falcon"), scheme("flexrr:2"), scheme("speculative")]
                .into_iter()
                .try_fold(0, |all, s| {
                let r = exactly_once(&t, s.clone(), threads, 3)?;
                let taken: u64 = r.per_rank.iter().map(|p| p.taken + p.cloned).sum();
                if t.rank() == 0 {
                    println!(
                        "training {s}: every chunk computed exactly once, {} ranks x {threads} threads, {taken} taken over or copied ({})",
                        t.world_size(),
                        t.backend()
                    );
                }
                Ok(all + taken)
            })
            .and_then(|taken| {
                // Oversubscribed (MPICH busy-polls: 4 ranks x 2 threads on 2 cores) the slow rank
                // may finish its own chunks before its starved peers look, in one scheme or
                // another; over all of them, taking over must have happened.
                if takeover && t.world_size() > 1 && taken == 0 {
                    return Err("no chunk was taken over from the slow rank under any scheme".to_string());
                }
                Ok(())
            })
            .and_then(|()| {
                exactly_once_elastic(&t, threads)?;
                if t.rank() == 0 {
                    println!("training elastic: every chunk computed exactly once with 1 <-> {threads} active threads");
                }
                Ok(())
            }),
            "params" => (|| {
                let data = data.as_deref().ok_or("--data is required")?;
                let model = LogReg::new(std::path::Path::new(data), None, 0.5, true).map_err(|e| e.to_string())?;
                let p = final_params_by(&t, &model, 30, scheme("bsp"), optimizer)?;
                write_params(&t, out.as_deref(), &p)
            })(),
            "hashed-params" => (|| {
                // Hashed to 2^17 buckets: a keyed model (past `dense_pull_below`), whose chunks
                // read the weights in place under mpirun on one node.
                let data = data.as_deref().ok_or("--data is required")?;
                let model = LogReg::with_hashing(std::path::Path::new(data), None, 0.5, true, 17)
                    .map_err(|e| e.to_string())?;
                let p = final_params_by(&t, &model, 30, scheme("bsp"), optimizer)?;
                write_params(&t, out.as_deref(), &p)
            })(),
            "mf-params" => (|| {
                let data = data.as_deref().ok_or("--data is required")?;
                let model = training::mf_strata(std::path::Path::new(data))?;
                let cfg = training::mf_strata_config(&t, 60, true, Some(trace.clone().ok_or("--trace is required")?));
                let p = training::final_params_of(&t, &model, &cfg)?;
                write_params(&t, out.as_deref(), &p)
            })(),
            _ => Err(format!("unknown mode `{mode}`: expected exactly-once, params, hashed-params or mf-params")),
        };
        match result {
            Ok(()) => true,
            Err(m) => {
                eprintln!("FAIL rank {}: {m}", t.rank());
                false
            }
        }
    };
    peregrine_tests::run_spmd(backend, ranks, body)
}

/// Rank 0 writes `p`, one parameter a line, to `out`.
fn write_params(t: &peregrine_transport::Transport, out: Option<&str>, p: &[f32]) -> Result<(), String> {
    if t.rank() == 0 {
        let out = out.ok_or("--out is required")?;
        let text: String = p.iter().map(|w| format!("{w:e}\n")).collect();
        std::fs::write(out, text).map_err(|e| format!("{out}: {e}"))?;
    }
    Ok(())
}
