//! `peregrine report RUN_DIR`: a finished run's straggler report, and its plots.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use clap::Args;
use peregrine_core::straggler::StragglerReport;
use serde::Deserialize;

use crate::error::AppError;
use crate::output;
use crate::plots::{self, RankPhases, Series};

/// Arguments of `peregrine report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A run directory written by `peregrine train` (summary.json, metrics/).
    run_dir: PathBuf,
    /// Where the plots go [default: RUN_DIR/report]: a directory, made if missing (not a link).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The report only, no plots.
    #[arg(long)]
    no_plots: bool,
}

/// What the report reads from summary.json.
#[derive(Deserialize)]
struct Summary {
    model: String,
    scheme: String,
    ranks: usize,
    iterations: u64,
    train_seconds: f64,
    evals: Vec<peregrine_core::engine::EvalPoint>,
    stragglers: StragglerReport,
}

/// What the plots read from a metrics line.
#[derive(Deserialize)]
struct Line {
    iter: u64,
    compute: f64,
    comm: f64,
    wait: f64,
    #[serde(default)]
    taken_from: Vec<(usize, u64)>,
}

/// Bins of iterations per rank panel.
const BINS: usize = 200;
/// Rank panels in the phases plot (flagged ranks first).
const PANELS: usize = 8;

/// `peregrine report`.
pub fn run(a: &ReportArgs) -> Result<(), AppError> {
    let out = a.out.clone().unwrap_or_else(|| a.run_dir.join("report"));
    if !a.no_plots {
        output::check_dir(if a.out.is_some() { "--out" } else { "RUN_DIR/report" }, &out)?;
    }
    let path = a.run_dir.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(|source| AppError::Io {
        what: format!("reading {} (a finished run directory of `peregrine train`)", path.display()),
        source,
    })?;
    let s: Summary = serde_json::from_str(&text).map_err(|e| AppError::Data {
        what: path.display().to_string(),
        detail: format!("not a summary with a straggler report ({e}); written by an older Peregrine?"),
    })?;
    println!(
        "{} | {} | {} ranks | {} iterations in {:.3} s",
        s.model, s.scheme, s.ranks, s.iterations, s.train_seconds
    );
    print!("{}", s.stragglers);
    if a.no_plots {
        return Ok(());
    }
    std::fs::create_dir_all(&out)
        .map_err(|source| AppError::Io { what: format!("creating {}", out.display()), source })?;
    let loss: Vec<(f64, f64)> = s.evals.iter().map(|e| (e.time, e.loss)).collect();
    plots::lines(
        &out.join("loss"),
        &format!("{} under {}: evaluation loss", s.model, s.scheme),
        "training seconds",
        "loss",
        &[Series { name: s.scheme.clone(), points: loss }],
    )?;
    let (phases, moved) = read_metrics(&a.run_dir.join("metrics"), s.ranks, &s.stragglers)?;
    plots::rank_phases(
        &out.join("ranks"),
        "seconds per iteration: compute, communication, waiting",
        &phases,
    )?;
    let cells: Vec<(usize, usize, f64)> = moved.into_iter().map(|((t, v), n)| (t, v, n as f64)).collect();
    plots::matrix(
        &out.join("transfers"),
        "chunks taken over (row: the rank that took them, column: whose they were)",
        ("taken by rank", "chunks of rank"),
        s.ranks,
        &cells,
    )?;
    println!("plots: {} (loss, ranks, transfers; .png and .svg)", out.display());
    Ok(())
}

/// Per-rank phases in bins of iterations (the panels: flagged ranks first, then by rank, at
/// most [`PANELS`]), and the chunks taken over, by `(thief, victim)`.
#[allow(clippy::type_complexity)]
fn read_metrics(
    dir: &Path,
    ranks: usize,
    report: &StragglerReport,
) -> Result<(Vec<RankPhases>, BTreeMap<(usize, usize), u64>), AppError> {
    let mut order: Vec<usize> = report.flagged.clone();
    order.extend((0..ranks).filter(|r| !report.flagged.contains(r)));
    let shown: Vec<usize> = order.into_iter().take(PANELS).collect();
    let mut panels = Vec::new();
    let mut moved = BTreeMap::new();
    for r in 0..ranks {
        let path = dir.join(format!("rank-{r}.jsonl"));
        let f = std::fs::File::open(&path)
            .map_err(|source| AppError::Io { what: format!("reading {}", path.display()), source })?;
        let mut lines = Vec::new();
        for (i, l) in std::io::BufReader::new(f).lines().enumerate() {
            let l =
                l.map_err(|source| AppError::Io { what: format!("reading {}", path.display()), source })?;
            let line: Line = serde_json::from_str(&l).map_err(|e| AppError::Data {
                what: format!("{}:{}", path.display(), i + 1),
                detail: e.to_string(),
            })?;
            for &(v, n) in &line.taken_from {
                *moved.entry((r, v)).or_insert(0) += n;
            }
            if shown.contains(&r) {
                lines.push((line.iter, line.compute, line.comm, line.wait));
            }
        }
        if shown.contains(&r) {
            let per = lines.len().div_ceil(BINS).max(1);
            let bins = lines
                .chunks(per)
                .map(|c| {
                    let n = c.len() as f64;
                    let sum = |f: fn(&(u64, f64, f64, f64)) -> f64| c.iter().map(f).sum::<f64>() / n;
                    (c[0].0 as f64, sum(|x| x.1), sum(|x| x.2), sum(|x| x.3))
                })
                .collect();
            panels.push((r, bins));
        }
    }
    panels.sort_by_key(|(r, _)| shown.iter().position(|s| s == r));
    let phases = panels
        .into_iter()
        .map(|(rank, bins)| RankPhases { rank, flagged: report.flagged.contains(&rank), bins })
        .collect();
    Ok((phases, moved))
}
