//! Where a training run starts: from the start, or from its run directory's checkpoint when the
//! checkpoint is of the same configuration and data (rank 0 decides, every rank follows), and the
//! metrics of a resumed run trimmed to the checkpoint.

use std::path::Path;

use peregrine_transport::Transport;

use super::args::RunOpts;
use super::io;
use crate::error::AppError;
use crate::preempt::write_atomically;

/// Where this run starts (collective): `None` for the initial model, or the run directory's
/// checkpoint. Rank 0 decides (a finished run, or a checkpoint of another configuration or
/// whose parameters are in another `order` than the model's, is refused unless `--force`,
/// which clears them) and tells the others, which then read the same checkpoint.
pub(super) fn resume_point(
    t: &Transport,
    a: &RunOpts,
    dir: &Path,
    store: &crate::checkpoint::Store,
    config: &str,
    order: &str,
) -> Result<Option<std::sync::Arc<peregrine_core::engine::Snapshot>>, AppError> {
    // 0: from the start; 1: resume; 2: refused (rank 0 says why).
    let mut decision = [0u64];
    let mut refusal = None;
    // Rank 0's reading of the checkpoint, kept for its resume (the others read it themselves).
    let mut mine = None;
    if t.rank() == 0 {
        let summary = dir.join("summary.json");
        let loaded = store.load();
        let refuse = |why: String| {
            AppError::Usage(format!("{why}; give another --run-dir, or --force to start again there"))
        };
        let differences = |l: &crate::checkpoint::Loaded| config_differences(&l.config, config);
        refusal = match (&loaded, summary.exists()) {
            _ if a.force => None,
            (_, true) => {
                Some(refuse(format!("{} holds a finished run ({})", dir.display(), summary.display())))
            }
            (Ok(Some(l)), _) if !differences(l).is_empty() => Some(refuse(format!(
                "{} holds a checkpoint of another configuration: {}",
                dir.display(),
                differences(l).join("; ")
            ))),
            (Ok(Some(l)), _) if l.order != order => {
                let named =
                    |o: &str| if o.is_empty() { "each block as named".to_owned() } else { format!("`{o}`") };
                Some(refuse(format!(
                    "{}: its parameters are ordered {}, this version of Peregrine orders the model's {} \
                     (a checkpoint of another version: resume it with that version)",
                    l.path.display(),
                    named(&l.order),
                    named(order)
                )))
            }
            (Err(e), _) => Some(refuse(format!("no usable checkpoint: {e}"))),
            _ => None,
        };
        let fresh = a.force || matches!(loaded, Ok(None));
        if fresh && refusal.is_none() {
            // What an earlier run wrote goes (with --force, or where it stopped before its first
            // checkpoint: its metrics, of more ranks perhaps, would stay beside this run's). A
            // failure here is decided like a refusal, so that no rank waits for rank 0.
            if let Err(e) = crate::run_dir::clear(dir) {
                refusal = Some(e);
            }
        }
        decision[0] = match (&refusal, loaded) {
            (Some(_), _) => 2,
            (None, Ok(Some(l))) if !a.force => {
                mine = Some(l);
                1
            }
            _ => 0,
        };
        if let Some(l) = &mine {
            // Decided here, like a refusal, so that no rank waits for rank 0.
            if let Err(e) = trim_metrics(&dir.join("metrics"), l.snapshot.iteration) {
                (refusal, decision[0]) = (Some(e), 2);
            }
        }
    }
    t.broadcast(&mut decision, 0)?;
    match decision[0] {
        2 => Err(refusal
            .unwrap_or_else(|| AppError::Usage("rank 0 refused to start in this run directory".into()))),
        1 => {
            let l = match mine {
                Some(l) => l,
                None => store
                    .load()
                    .map_err(|e| AppError::Data { what: dir.display().to_string(), detail: e })?
                    .ok_or_else(|| AppError::Data {
                        what: dir.display().to_string(),
                        detail: "the checkpoint vanished".into(),
                    })?,
            };
            if t.rank() == 0 {
                if let Some(f) = &l.fallback {
                    eprintln!("warning: {f}; using the previous checkpoint");
                }
                eprintln!(
                    "resuming from iteration {} ({}, {} evaluations so far)",
                    l.snapshot.iteration,
                    l.path.display(),
                    l.snapshot.evals.len()
                );
            }
            Ok(Some(std::sync::Arc::new(l.snapshot)))
        }
        _ => Ok(None),
    }
}

/// The table under which a checkpoint's configuration records the datasets' identities.
pub(super) const IDENTITY: &str = "identity";

/// Keys a run may change between its parts: how it is carried out, not what it computes.
const OPERATIONAL: [&str; 5] =
    ["threads", "checkpoint-every", "checkpoint-seconds", "watchdog", "node-combine"];

/// How the configuration a checkpoint was taken under (`then`, with its datasets' identities)
/// differs from this run's (`now`) in what it computes, key by key, in words. The datasets are
/// compared by identity, not path (a checkpoint without identities, of an earlier version, by
/// path).
fn config_differences(then: &str, now: &str) -> Vec<String> {
    let (Ok(mut then), Ok(mut now)) = (then.parse::<toml::Table>(), now.parse::<toml::Table>()) else {
        return vec!["its configuration cannot be read".into()];
    };
    let mut out = Vec::new();
    let ids = (then.remove(IDENTITY), now.remove(IDENTITY));
    if let (Some(toml::Value::Table(a)), Some(toml::Value::Table(b))) = &ids {
        for key in ["data", "eval"] {
            then.remove(key);
            now.remove(key);
            if a.get(key) != b.get(key) {
                let id =
                    |t: &toml::Table| t.get(key).and_then(toml::Value::as_str).unwrap_or("none").to_owned();
                out.push(format!("`{key}` is another dataset (then {}; now {})", id(a), id(b)));
            }
        }
    }
    let keys: std::collections::BTreeSet<&String> = then.keys().chain(now.keys()).collect();
    for k in keys.into_iter().filter(|k| !OPERATIONAL.contains(&k.as_str())) {
        if then.get(k) != now.get(k) {
            let show = |v: Option<&toml::Value>| v.map_or("unset".to_owned(), ToString::to_string);
            out.push(format!("`{k}` was {}, is {} now", show(then.get(k)), show(now.get(k))));
        }
    }
    out
}

/// Drops from every rank's metrics the iterations at or after `iteration` (run again by the
/// resumed run, which appends its own) and a last line cut short by a killed process. Each file
/// is rewritten aside and renamed.
fn trim_metrics(dir: &Path, iteration: u64) -> Result<(), AppError> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
        let keep: String = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .and_then(|v| v.get("iter").and_then(serde_json::Value::as_u64))
                    .is_some_and(|i| i < iteration)
            })
            .collect();
        if keep.len() != text.len() {
            write_atomically(&path, keep.as_bytes())?;
        }
    }
    Ok(())
}
