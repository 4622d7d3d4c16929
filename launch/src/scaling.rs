//! `peregrine train --standardize`: the features' scale measured over every rank's shard, and
//! the training and evaluation sets standardized on the fly when it is far from unit scale.

use std::path::Path;

use clap::ValueEnum;
use peregrine_kernels::data::standardize::{deviations, Scaling, Sums};
use peregrine_kernels::data::{shard, Dataset};
use peregrine_transport::{ReduceOp, Transport};
use serde::{Deserialize, Serialize};

use crate::error::AppError;

/// When `peregrine train` standardizes the features (`--standardize`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Standardize {
    /// When the features are far from unit scale ([`far_from_unit_scale`]).
    #[default]
    Auto,
    /// Always.
    On,
    /// Never.
    Off,
}

impl Standardize {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Standardize::Auto => "auto",
            Standardize::On => "on",
            Standardize::Off => "off",
        }
    }
}

/// A column is off unit scale when the largest magnitude it holds is above this or below its
/// inverse (the largest magnitude, not a spread: pixels in [0, 1] reach 1 in most columns,
/// whatever their spread; raw pixels reach 255).
pub const OFF_BY: f64 = 10.0;
/// `auto` standardizes when at least this share of the columns holding a nonzero value is off
/// unit scale ...
pub const OFF_SHARE: f64 = 0.1;
/// ... or when any column's largest magnitude is above this: one such feature alone dominates
/// every gradient at a learning rate chosen for unit-scale features.
pub const HUGE: f64 = 100.0;

/// The share of the memory available on the node that the standardized copies of `auto` may
/// take (over the node's ranks); past it `auto` leaves the data as it is and says why.
pub const COPY_SHARE: f64 = 0.25;

/// What the measure found and did.
#[derive(Clone, Debug)]
pub struct Measured {
    /// The scaling the sets were given (`None`: read as they are).
    pub applied: Option<Scaling>,
    /// Why the features are far from unit scale, if they are: named in the warnings of a model
    /// that does not learn when they were left so.
    pub off_scale: Option<String>,
}

/// Collective: the scaling of the training set at `data` under `when` (`Off`: none, the scale
/// still measured for the warnings).
/// Each rank sums its shard of rows ([`Sums::of`], then the squared deviations from the
/// means), the sums combined by an allreduce of f64; rank 0's scaling, made from them, is then
/// broadcast, so that every rank applies bit-identical shifts and multipliers. A file holding a
/// scaling record (`peregrine data standardize`) is left as it is. Reads the file once, twice
/// when it standardizes; the
/// statistics are 24 bytes a feature.
/// `copy_budget`: the bytes this rank's standardized copies (of the training set and of `eval`)
/// may take (`None`: unknown); `auto` leaves data whose copies would not fit as it is (with a
/// note), `on` refuses it.
pub fn measure(
    t: &Transport,
    data: &Path,
    eval: Option<&Path>,
    when: Standardize,
    copy_budget: Option<u64>,
) -> Result<Measured, AppError> {
    let none = Measured { applied: None, off_scale: None };
    let ds = Dataset::open(data)?;
    if ds.scaling().is_some() {
        if when == Standardize::On && t.rank() == 0 {
            eprintln!(
                "note: {} is standardized already (`peregrine data standardize`): --standardize on leaves it as it is",
                data.display()
            );
        }
        return Ok(none);
    }
    let (rank, world) = (t.rank(), t.world_size());
    let rows = shard(ds.rows(), rank, world);
    let mine = Sums::of(&ds, rows.clone())?;
    let cols = mine.count.len();
    let mut words: Vec<f64> = [mine.count, mine.sum, mine.squares].concat();
    t.allreduce(&mut words, ReduceOp::Sum)?;
    let mut max_abs = mine.max_abs;
    t.allreduce(&mut max_abs, ReduceOp::Max)?;
    let (count, rest) = words.split_at(cols);
    let (sum, squares) = rest.split_at(cols);
    let off_scale = far_from_unit_scale(count, &max_abs);
    let copies = ds.bytes() as u64 + eval.map(Dataset::open).transpose()?.map_or(0, |e| e.bytes() as u64);
    let fits = copy_budget.is_none_or(|b| copies <= b);
    let gib = |b: u64| format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30));
    let apply = match when {
        Standardize::On if !fits => {
            return Err(AppError::Usage(format!(
                "--standardize on: the standardized copies of the training and evaluation sets take {} a rank,                  more than {} of this node's available memory allows; standardize the files once with                  `peregrine data standardize` instead",
                gib(copies),
                COPY_SHARE
            )))
        }
        Standardize::On => true,
        Standardize::Auto if off_scale.is_some() && !fits => {
            if rank == 0 {
                eprintln!(
                    "note: the features are far from unit scale, but standardized copies would take {} a rank:                      left as they are (`peregrine data standardize` standardizes the files once)",
                    gib(copies)
                );
            }
            false
        }
        Standardize::Auto => off_scale.is_some(),
        Standardize::Off => false,
    };
    if !apply {
        return Ok(Measured { applied: None, off_scale });
    }
    let total = Sums { count: count.to_vec(), sum: sum.to_vec(), squares: squares.to_vec(), max_abs };
    let mean = total.means(ds.rows());
    let mut sq = deviations(&ds, rows, &mean)?;
    t.allreduce(&mut sq, ReduceOp::Sum)?;
    let made = Scaling::from_moments(ds.rows(), &total.count, &mean, &sq);
    let mut bits: Vec<f32> = [made.shift, made.mult].concat();
    t.broadcast(&mut bits, 0)?;
    let (shift, mult) = bits.split_at(cols);
    Ok(Measured { applied: Some(Scaling { shift: shift.to_vec(), mult: mult.to_vec() }), off_scale })
}

/// Why features of stored-value counts `count` and largest magnitudes `max_abs` are far from
/// unit scale, or `None`: a column is off when its largest magnitude is above [`OFF_BY`] or below
/// `1 / OFF_BY`, and the features are far from unit scale when at least [`OFF_SHARE`] of the
/// columns with a nonzero value are, or any column's largest magnitude is above [`HUGE`].
/// Columns of zeros only (never stored, or stored as 0) are not counted.
pub fn far_from_unit_scale(count: &[f64], max_abs: &[f64]) -> Option<String> {
    let held: Vec<(usize, f64)> = count
        .iter()
        .zip(max_abs)
        .enumerate()
        .filter(|&(_, (&c, &m))| c > 0.0 && m > 0.0)
        .map(|(j, (_, &m))| (j, m))
        .collect();
    let off = held.iter().filter(|&&(_, m)| !(1.0 / OFF_BY..=OFF_BY).contains(&m)).count();
    let (widest, most) = held.iter().copied().fold((0, 0.0f64), |b, c| if c.1 > b.1 { c } else { b });
    let (narrowest, least) =
        held.iter().copied().fold((0, f64::INFINITY), |b, c| if c.1 < b.1 { c } else { b });
    if held.is_empty() || (off as f64) < OFF_SHARE * held.len() as f64 && most <= HUGE {
        return None;
    }
    Some(format!(
        "{off} of the {} nonzero feature columns reach a magnitude beyond {OFF_BY} or only below 1/{OFF_BY} \
         (column {widest} up to {}; column {narrowest} up to {})",
        held.len(),
        short(most),
        short(least)
    ))
}

/// `x` to 3 significant digits.
fn short(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return x.to_string();
    }
    let digits = (2 - x.abs().log10().floor() as i32).max(0) as usize;
    format!("{x:.digits$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_pixels_and_tiny_values_are_far_from_unit_scale_one_hot_and_unit_data_are_not() {
        // 0-255 pixels: most columns reach about 255; one blank column.
        let pixels = far_from_unit_scale(&[10.0, 10.0, 10.0, 10.0], &[255.0, 250.0, 90.0, 0.0]);
        assert!(pixels.as_deref().is_some_and(|w| w.contains("3 of the 3")), "{pixels:?}");
        // One-hot: every stored value is 1.
        assert_eq!(far_from_unit_scale(&[3.0, 1.0, 50.0], &[1.0; 3]), None);
        // Standardized-like data, and pixels in [0, 1] with a few faint border columns.
        assert_eq!(far_from_unit_scale(&[100.0; 3], &[3.5, 2.0, 6.0]), None);
        let mut unit = vec![1.0; 20];
        unit[0] = 0.05;
        assert_eq!(far_from_unit_scale(&[100.0; 20], &unit), None);
        // Values of at most 0.001 in every column.
        assert!(far_from_unit_scale(&[100.0; 2], &[1e-3, 1e-3]).is_some());
        // One column in twenty up to 1000 is enough; one up to 20 is not.
        let mut m = vec![1.0; 20];
        m[7] = 1e3;
        assert!(far_from_unit_scale(&[100.0; 20], &m).is_some_and(|w| w.contains("column 7")));
        m[7] = 20.0;
        assert_eq!(far_from_unit_scale(&[100.0; 20], &m), None);
        assert_eq!(far_from_unit_scale(&[], &[]), None);
    }
}
