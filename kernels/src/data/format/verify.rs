//! Verifying a dataset: the data checksum (whole, or in parts combined with [`combine_crcs`])
//! and the structural invariants the kernels rely on, row range by row range.

use std::ops::Range;

use super::dataset::Dataset;
use super::header::Kind;
use crate::data::error::{DataError, Result};

impl Dataset {
    /// Checks the data checksum and every structural invariant: O(size).
    pub fn verify(&self) -> Result<()> {
        let crc = self.crc_part(0, 1).0;
        self.check_crc(crc)?;
        self.check_rows(0..self.rows())
    }

    /// The data checksum recorded in the header.
    pub fn data_crc(&self) -> u32 {
        self.header.data_crc
    }

    /// Bytes covered by the data checksum (every section, in order).
    fn data_bytes(&self) -> u64 {
        self.header.sections.iter().map(|[_, len]| len).sum()
    }

    /// The CRC-32 of part `part` of `parts` equal parts of the checksummed bytes, and its length:
    /// combined in order with [`combine_crcs`], the parts give the checksum of the whole, so that
    /// each of `parts` ranks reads only its share.
    pub fn crc_part(&self, part: usize, parts: usize) -> (u32, u64) {
        assert!(part < parts, "part {part} of {parts}");
        let total = self.data_bytes();
        let at = |p: usize| (u128::from(total) * p as u128 / parts as u128) as u64;
        let (lo, hi) = (at(part), at(part + 1));
        let mut crc = crc32fast::Hasher::new();
        let mut pos = 0u64;
        for [off, len] in self.header.sections {
            let (a, b) = (lo.max(pos), hi.min(pos + len));
            if a < b {
                crc.update(&self.map[(off + a - pos) as usize..(off + b - pos) as usize]);
            }
            pos += len;
        }
        (crc.finalize(), hi - lo)
    }

    /// An error unless `crc` (computed over the data) is the header's.
    pub fn check_crc(&self, crc: u32) -> Result<()> {
        if crc != self.header.data_crc {
            return Err(DataError::format(
                &self.path,
                format!(
                    "data checksum mismatch: {crc:#010x}, header says {:#010x}: the data is corrupt (or was \
                     modified after it was written)",
                    self.header.data_crc
                ),
            ));
        }
        Ok(())
    }

    /// Checks the structural invariants the kernels rely on, for rows `range` (O(rows in range)):
    /// sparse `row_ptr` non-decreasing, indices increasing within a row and below the feature
    /// count, labels 0 or 1, values finite; dense labels below the class count, features finite;
    /// ratings' users and items below their counts, ratings finite.
    pub fn check_rows(&self, range: Range<usize>) -> Result<()> {
        let bad = |d: String| DataError::format(&self.path, d);
        if range.start > range.end || range.end > self.rows() {
            return Err(bad(format!("rows {range:?} of {}", self.rows())));
        }
        let first = range.start;
        match self.kind {
            Kind::Sparse => {
                let s = self.sparse()?;
                let row_ptr = &s.row_ptr[range.start..=range.end];
                if let Some(w) = row_ptr.windows(2).position(|w| w[1] < w[0]) {
                    return Err(bad(format!("row_ptr decreases at row {}", first + w)));
                }
                // Every rank checks its rows; the ends of the whole are checked at open.
                let (lo, hi) = (row_ptr[0], row_ptr[row_ptr.len() - 1]);
                if hi > s.indices.len() as u64 {
                    return Err(bad(format!("row_ptr points past the {} nonzeros", s.indices.len())));
                }
                for r in range.clone() {
                    let (a, b) = (s.row_ptr[r] as usize, s.row_ptr[r + 1] as usize);
                    let idx = &s.indices[a..b];
                    if let Some(w) = idx.windows(2).find(|w| w[0] >= w[1]) {
                        return Err(bad(format!("row {r}: indices not increasing ({} then {})", w[0], w[1])));
                    }
                    if let Some(&i) = idx.last().filter(|&&i| i as usize >= s.cols) {
                        return Err(bad(format!("row {r}: index {i} beyond {} features", s.cols)));
                    }
                }
                let labels = &s.labels[range];
                if let Some(r) = first_bad(labels, |y| y == 0.0 || y == 1.0) {
                    return Err(bad(format!("row {}: label {} is not 0 or 1", first + r, labels[r])));
                }
                let values = &s.values[lo as usize..hi as usize];
                if let Some(i) = first_bad(values, f32::is_finite) {
                    // The row holding value `lo + i`: the last whose start is at or before it.
                    let at = lo + i as u64;
                    let r = first + row_ptr.partition_point(|&p| p <= at) - 1;
                    let feature = s.indices[at as usize];
                    return Err(bad(format!("row {r}: feature {feature} is {} (not finite)", values[i])));
                }
            }
            Kind::Dense => {
                let d = self.dense()?.rows(range);
                if let Some(r) = first_bad(d.labels, |y| (y as usize) < d.classes) {
                    return Err(bad(format!(
                        "row {}: label {} >= {} classes",
                        first + r,
                        d.labels[r],
                        d.classes
                    )));
                }
                if let Some(i) = first_bad(d.features, f32::is_finite) {
                    return Err(bad(format!(
                        "row {}: feature {} is not finite",
                        first + i / d.cols,
                        i % d.cols
                    )));
                }
            }
            Kind::Ratings => {
                let t = self.ratings()?.rows(range);
                if let Some(i) = first_bad(t.users, |u| (u as usize) < t.n_users) {
                    return Err(bad(format!(
                        "rating {}: user {} >= {} users",
                        first + i,
                        t.users[i],
                        t.n_users
                    )));
                }
                if let Some(i) = first_bad(t.items, |u| (u as usize) < t.n_items) {
                    return Err(bad(format!(
                        "rating {}: item {} >= {} items",
                        first + i,
                        t.items[i],
                        t.n_items
                    )));
                }
                if let Some(i) = first_bad(t.ratings, f32::is_finite) {
                    return Err(bad(format!("rating {} is not finite", first + i)));
                }
            }
        }
        Ok(())
    }
}

/// The index of the first element of `xs` that is not `ok`. Runs of 4096 are tested whole
/// without an early exit (which the compiler vectorizes), and searched only when one fails: the
/// checks before training read whole files.
fn first_bad<T: Copy>(xs: &[T], ok: impl Fn(T) -> bool) -> Option<usize> {
    let mut at = 0;
    for run in xs.chunks(4096) {
        if !run.iter().fold(true, |all, &x| all & ok(x)) {
            return run.iter().position(|&x| !ok(x)).map(|i| at + i);
        }
        at += run.len();
    }
    None
}

/// The checksum of consecutive parts from their (CRC-32, length) pairs, in order
/// ([`Dataset::crc_part`]).
pub fn combine_crcs(parts: &[(u32, u64)]) -> u32 {
    let mut whole = crc32fast::Hasher::new();
    for &(crc, len) in parts {
        whole.combine(&crc32fast::Hasher::new_with_initial_len(crc, len));
    }
    whole.finalize()
}
