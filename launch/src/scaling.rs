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

/// A column is off unit scale when the root mean square of its stored values is above this or
/// below its inverse.
pub const OFF_BY: f64 = 10.0;
/// `auto` standardizes when at least this share of the columns holding a nonzero value is off
/// unit scale ...
pub const OFF_SHARE: f64 = 0.1;
/// ... or when any column's root mean square is above this: one such feature alone dominates
/// every gradient (its weight's steps are 10^4 times too large at a learning rate for unit-scale
/// features).
pub const HUGE: f64 = 100.0;

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
pub fn measure(t: &Transport, data: &Path, when: Standardize) -> Result<Measured, AppError> {
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
    let (count, rest) = words.split_at(cols);
    let (sum, squares) = rest.split_at(cols);
    let off_scale = far_from_unit_scale(count, squares);
    let apply = match when {
        Standardize::On => true,
        Standardize::Auto => off_scale.is_some(),
        Standardize::Off => false,
    };
    if !apply {
        return Ok(Measured { applied: None, off_scale });
    }
    let total = Sums { count: count.to_vec(), sum: sum.to_vec(), squares: squares.to_vec() };
    let mean = total.means(ds.rows());
    let mut sq = deviations(&ds, rows, &mean)?;
    t.allreduce(&mut sq, ReduceOp::Sum)?;
    let made = Scaling::from_moments(ds.rows(), &total.count, &mean, &sq);
    let mut bits: Vec<f32> = [made.shift, made.mult].concat();
    t.broadcast(&mut bits, 0)?;
    let (shift, mult) = bits.split_at(cols);
    Ok(Measured { applied: Some(Scaling { shift: shift.to_vec(), mult: mult.to_vec() }), off_scale })
}

/// Why features of stored-value counts `count` and sums of squares `squares` are far from unit
/// scale, or `None`: a column is off when the root mean square of its stored values is above
/// [`OFF_BY`] or below `1 / OFF_BY`, and the features are far from unit scale when at least
/// [`OFF_SHARE`] of the columns with a nonzero value are, or any column's root mean square is
/// above [`HUGE`]. Columns of zeros only (never stored, or stored as 0) are not counted.
pub fn far_from_unit_scale(count: &[f64], squares: &[f64]) -> Option<String> {
    let rms: Vec<(usize, f64)> = count
        .iter()
        .zip(squares)
        .enumerate()
        .filter(|&(_, (&c, &s))| c > 0.0 && s > 0.0)
        .map(|(j, (&c, &s))| (j, (s / c).sqrt()))
        .collect();
    let off = rms.iter().filter(|&&(_, r)| !(1.0 / OFF_BY..=OFF_BY).contains(&r)).count();
    let (widest, most) = rms.iter().copied().fold((0, 0.0f64), |b, c| if c.1 > b.1 { c } else { b });
    let (narrowest, least) =
        rms.iter().copied().fold((0, f64::INFINITY), |b, c| if c.1 < b.1 { c } else { b });
    if rms.is_empty() || (off as f64) < OFF_SHARE * rms.len() as f64 && most <= HUGE {
        return None;
    }
    Some(format!(
        "{off} of the {} nonzero feature columns have a root mean square beyond {OFF_BY}x or below 1/{OFF_BY} \
         of 1 (column {widest}: {}; column {narrowest}: {})",
        rms.len(),
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
        // 0-255 pixels: root mean square ~100 in most columns; one blank column.
        let pixels = far_from_unit_scale(&[10.0, 10.0, 10.0, 10.0], &[1e5, 2e5, 9e4, 0.0]);
        assert!(pixels.as_deref().is_some_and(|w| w.contains("3 of the 3")), "{pixels:?}");
        // One-hot: every stored value is 1.
        assert_eq!(far_from_unit_scale(&[3.0, 1.0, 50.0], &[3.0, 1.0, 50.0]), None);
        // Standardized-like and [0, 1] data.
        assert_eq!(far_from_unit_scale(&[100.0; 3], &[100.0, 30.0, 250.0]), None);
        // Values of about 0.001 in every column.
        assert!(far_from_unit_scale(&[100.0; 2], &[1e-4, 1e-4]).is_some());
        // One column in twenty at 1000 is enough; one at 20 is not.
        let mut sq = vec![100.0; 20];
        sq[7] = 1e8;
        assert!(far_from_unit_scale(&[100.0; 20], &sq).is_some_and(|w| w.contains("column 7")));
        sq[7] = 4e4;
        assert_eq!(far_from_unit_scale(&[100.0; 20], &sq), None);
        assert_eq!(far_from_unit_scale(&[], &[]), None);
    }
}
