//! `peregrine predict`: a trained model applied to a dataset; predictions as CSV and the
//! evaluation metrics.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use peregrine_core::model::{
    lda::Lda,
    lr::LogReg,
    metric_value,
    mf::{Mf, ROW_STATE},
    mlp::Mlp,
    softmax::Softmax,
    Export,
};
use peregrine_kernels::data::standardize::Scaling;
use peregrine_kernels::data::Dataset;

use crate::error::AppError;
use crate::model_file::Saved;
use crate::output::{self, AtomicFile};
use crate::train::ModelKind;

/// `peregrine predict` flags.
#[derive(Debug, Args)]
#[command(after_help = "Output columns: lr `probability,label` (probability of label 1); softmax and mlp \
    `class,p0,...,p<k-1>,label` (most probable class, then each class's probability); mf \
    `prediction,user,item,rating`. One row per dataset row, in order.\n\n\
    Examples:\n  \
    peregrine train --model lr --data train.pgd --run-dir runs/adult\n  \
    peregrine predict --model runs/adult --data test.pgd --out test-predictions.csv\n\n\
    Data must be converted like the training data (the same --features for LIBSVM) and, if the \
    training data was standardized with `peregrine data standardize`, standardized with \
    `peregrine data standardize FILE OUT --like TRAIN`. A model that `peregrine train --standardize` \
    standardized on the fly takes raw data, and scales it as it scaled its training data.")]
pub struct PredictArgs {
    /// The trained model: the model.safetensors `peregrine train` writes, or its run directory.
    #[arg(long, value_name = "FILE|DIR")]
    model: PathBuf,
    /// The dataset to predict (a dataset file, of the kind the model was trained on).
    #[arg(long, value_name = "FILE")]
    data: PathBuf,
    /// Where to write the predictions (CSV); `-` for standard output. Written aside and renamed
    /// into place; refused if it is the model, the data or a file of the model's run directory,
    /// a symbolic link, or an existing entry that is not a regular file (a directory, a device,
    /// a FIFO).
    #[arg(long, short = 'o', value_name = "FILE")]
    out: PathBuf,
}

fn data_err(e: peregrine_core::model::ModelError) -> AppError {
    AppError::Data { what: "predict".into(), detail: e.to_string() }
}

pub fn run(a: PredictArgs) -> Result<(), AppError> {
    let start = Instant::now();
    check_out(&a)?;
    let saved = Saved::load(&a.model)?;
    let kind = ModelKind::from_str(saved.get("model")?, true).map_err(|_| AppError::Data {
        what: saved.path.display().to_string(),
        detail: "unknown model".into(),
    })?;
    let nothing = || AppError::Data {
        what: saved.path.display().to_string(),
        detail: "a synthetic workload's model (zeros standing in for a model's size): nothing to predict \
                 with"
            .into(),
    };
    if kind == ModelKind::Synthetic {
        return Err(nothing());
    }
    // The kernels read every row: the file is checked whole first (checksum, indices, labels), as
    // training checks it.
    Dataset::open(&a.data)?.verify()?;
    let scaling = check_scaling(&saved, &a.data)?;
    let scaling = scaling.as_ref();
    let shape = |name: &str| saved.tensors.get(name).map(|t| t.0.clone()).unwrap_or_default();
    match kind {
        ModelKind::Lr => {
            let features = shape("weight").first().copied().unwrap_or(0);
            let intercept = saved.tensors.contains_key("bias");
            let m = match saved.meta.get("hash_bits") {
                // Hashed features: any ids, the same buckets as in training.
                Some(b) => {
                    let bits = b.parse().ok().filter(|&b: &u32| 1usize.checked_shl(b) == Some(features));
                    let bits = bits.ok_or_else(|| AppError::Data {
                        what: saved.path.display().to_string(),
                        detail: format!("bad metadata `hash_bits` = {b} for {features} weights"),
                    })?;
                    LogReg::with_hashing(&a.data, None, 0.0, intercept, bits)
                }
                None => LogReg::new(&a.data, None, 0.0, intercept).and_then(|m| m.with_features(features)),
            }
            .and_then(|m| scaled(m, scaling, LogReg::standardized))
            .map_err(data_err)?;
            write(&m, &saved, &a, start)
        }
        ModelKind::Softmax => {
            let m = Softmax::new(&a.data, None, 0.0).and_then(|m| scaled(m, scaling, Softmax::standardized));
            write(&m.map_err(data_err)?, &saved, &a, start)
        }
        ModelKind::Mlp => {
            let hidden: Vec<usize> =
                saved.get("hidden")?.split(',').map(|h| h.parse()).collect::<Result<_, _>>().map_err(
                    |_| AppError::Data {
                        what: saved.path.display().to_string(),
                        detail: "bad metadata `hidden`".into(),
                    },
                )?;
            let m = Mlp::new(&a.data, None, &hidden, 0.0).and_then(|m| scaled(m, scaling, Mlp::standardized));
            write(&m.map_err(data_err)?, &saved, &a, start)
        }
        ModelKind::Lda => {
            // The topic proportions of the training documents (the model holds their counts).
            let number = |key: &str| -> Result<f64, AppError> {
                saved.get(key)?.parse().map_err(|_| AppError::Data {
                    what: saved.path.display().to_string(),
                    detail: format!("bad metadata `{key}`"),
                })
            };
            let topics = shape("topic").first().copied().unwrap_or(0);
            let m = Lda::new(&a.data, None, topics, number("alpha")?, number("eta")?).map_err(data_err)?;
            write(&m, &saved, &a, start)
        }
        ModelKind::Synthetic => Err(nothing()),
        ModelKind::Mf => {
            let (u, v) = (shape("users"), shape("items"));
            // With biases each row holds the factors, then the bias, and the mean is stored.
            // Under adaptive rates each row ends with its Gs (`row_state` says how many).
            let mean = saved.tensors.get("mean").and_then(|t| t.1.first().copied());
            let state = saved.tensors.get("row_state").and_then(|t| t.1.first().copied());
            if let Some(n) = state.filter(|&n| n != ROW_STATE as f32) {
                return Err(AppError::Data {
                    what: saved.path.display().to_string(),
                    detail: format!(
                        "rows end with {n} adaptive-rate values (`row_state`); this version of \
                         Peregrine writes and reads {ROW_STATE} (libmf's two groups): train the model again"
                    ),
                });
            }
            let adaptive = state.is_some();
            let extra = usize::from(mean.is_some()) + ROW_STATE * usize::from(adaptive);
            let k = u.get(1).copied().unwrap_or(0).saturating_sub(extra);
            let m = Mf::new(&a.data, None, k.max(1), 0.0, 0.0)
                .map(|m| m.with_biases(mean.is_some()).with_mean(mean.unwrap_or(0.0)).with_adaptive(adaptive))
                .and_then(|m| m.with_size(u.first().copied().unwrap_or(0), v.first().copied().unwrap_or(0)))
                .map_err(data_err)?;
            write(&m, &saved, &a, start)
        }
    }
}

/// `--out` must not be the model, the data, any file of the model's run directory, a link or a
/// non-regular file (`-`, standard output, excepted).
fn check_out(a: &PredictArgs) -> Result<(), AppError> {
    if a.out.as_os_str() == "-" {
        return Ok(());
    }
    let model = crate::model_file::file_of(&a.model);
    output::check("--out", &a.out, &[("--model", &model), ("--data", &a.data)])?;
    match crate::model_file::run_dir_of(&a.model) {
        Some(run) => output::check_outside_run("--out", &a.out, "--model", &run),
        None => Ok(()),
    }
}

/// `m` reading its data through `scaling` (`standardized`, the model's), if there is one.
fn scaled<M>(
    m: M,
    scaling: Option<&Scaling>,
    standardized: impl FnOnce(M, &Scaling) -> peregrine_core::model::Built<M>,
) -> peregrine_core::model::Built<M> {
    match scaling {
        Some(s) => standardized(m, s),
        None => Ok(m),
    }
}

/// The data must have gone through the scaling the training data went through: the scaling to
/// apply to it here, for raw data and a model that standardized its raw training data on the
/// fly (`train --standardize`); data standardized alike (`data standardize --like`) is read as
/// it is.
fn check_scaling(saved: &Saved, data: &Path) -> Result<Option<Scaling>, AppError> {
    let d = Dataset::open(data)?;
    let train = saved.meta.get("train_data").map_or("the training file", String::as_str);
    let fail = |detail: String| Err(AppError::Data { what: data.display().to_string(), detail });
    match (saved.scaling(), d.scaling()) {
        (None, None) => Ok(None),
        (Some(a), Some(b)) if a == b => Ok(None),
        (Some((shift, mult)), None) if saved.standardized_on_the_fly() => {
            if shift.len() != mult.len() {
                return Err(AppError::Data {
                    what: saved.path.display().to_string(),
                    detail: format!("scaling.shift has {} values, scaling.mult {}", shift.len(), mult.len()),
                });
            }
            Ok(Some(Scaling { shift: shift.to_vec(), mult: mult.to_vec() }))
        }
        (Some(_), None) => fail(format!(
            "the model was trained on standardized data ({train}); standardize this file the same way first: \
             peregrine data standardize {} OUT --like {train}",
            data.display()
        )),
        (Some(_), Some(_)) if saved.standardized_on_the_fly() => fail(format!(
            "is standardized, but the model was trained on raw data ({train}), standardized as it was read: give \
             it the raw file"
        )),
        (Some(_), Some(_)) => fail(format!(
            "standardized with other statistics than the model's training data ({train}); standardize the raw \
             file with --like {train}"
        )),
        (None, Some(_)) => fail(format!("is standardized, but the model's training data ({train}) was not")),
    }
}

fn write<M: Export>(m: &M, saved: &Saved, a: &PredictArgs, start: Instant) -> Result<(), AppError> {
    let params = saved.params_for(m)?;
    let rows = m.eval_rows();
    let sums = m.evaluate(&params, 0..rows);
    let outputs = m.outputs();
    let classes = outputs.len() > 1;
    let to_stdout = a.out.as_os_str() == "-";
    let mut file = if to_stdout { None } else { Some(AtomicFile::create(&a.out)?) };
    let written =
        file.as_ref().map_or_else(|| "standard output".into(), |f| f.temp_path().display().to_string());
    let sink: Box<dyn Write + '_> = match &mut file {
        Some(f) => Box::new(f),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = BufWriter::new(sink);
    let result = (|| -> std::io::Result<()> {
        writeln!(out, "{}{},{}", if classes { "class," } else { "" }, outputs.join(","), m.label_names())?;
        let mut values = Vec::new();
        let block = 1 << 14;
        for s in (0..rows).step_by(block) {
            let e = (s + block).min(rows);
            values.clear();
            m.predict(&params, s..e, &mut values);
            for (r, v) in (s..e).zip(values.chunks_exact(outputs.len())) {
                if classes {
                    let best = v.iter().enumerate().fold(0, |b, (i, &p)| if p > v[b] { i } else { b });
                    write!(out, "{best},")?;
                }
                for p in v {
                    write!(out, "{p},")?;
                }
                writeln!(out, "{}", m.label(r))?;
            }
        }
        out.flush()
    })();
    drop(out);
    // On an error the temporary file is removed as `file` drops.
    result.map_err(|source| AppError::Io { what: format!("writing {written}"), source })?;
    if let Some(f) = file {
        f.commit()?;
    }
    let metric = m.metric();
    eprintln!(
        "{} rows of {} predicted in {:.2} s{}: loss {:.4}, {} {:.4}",
        rows,
        a.data.display(),
        start.elapsed().as_secs_f64(),
        if to_stdout { String::new() } else { format!(" into {}", a.out.display()) },
        sums[0] / sums[2].max(1.0),
        metric.name(),
        metric_value(metric, sums)
    );
    Ok(())
}
