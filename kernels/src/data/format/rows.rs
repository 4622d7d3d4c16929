//! Zero-copy views of a dataset's rows ([`SparseRows`], [`DenseRows`], [`Ratings`]), and the
//! row ranges of a rank ([`shard`]) and of its mini-batch chunks ([`chunks`]).

use std::ops::Range;

/// Sparse rows in CSR form: row `r` spans `row_ptr[r] - row_ptr[0] .. row_ptr[r + 1] - row_ptr[0]`
/// of `indices` and `values` (a sub-range keeps the absolute `row_ptr` of the whole file).
#[derive(Clone, Copy, Debug)]
pub struct SparseRows<'a> {
    /// Row offsets (rows + 1).
    pub row_ptr: &'a [u64],
    /// 0-based feature indices, increasing within a row.
    pub indices: &'a [u32],
    /// Values.
    pub values: &'a [f32],
    /// Labels, 0 or 1.
    pub labels: &'a [f32],
    /// Features.
    pub cols: usize,
}

impl<'a> SparseRows<'a> {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Rows `range`, zero-copy.
    pub fn rows(&self, range: Range<usize>) -> SparseRows<'a> {
        let base = self.row_ptr[0];
        let (lo, hi) =
            ((self.row_ptr[range.start] - base) as usize, (self.row_ptr[range.end] - base) as usize);
        SparseRows {
            row_ptr: &self.row_ptr[range.start..=range.end],
            indices: &self.indices[lo..hi],
            values: &self.values[lo..hi],
            labels: &self.labels[range],
            cols: self.cols,
        }
    }
}

/// Dense rows, row-major.
#[derive(Clone, Copy, Debug)]
pub struct DenseRows<'a> {
    /// rows x cols values.
    pub features: &'a [f32],
    /// Class of each row.
    pub labels: &'a [u32],
    /// Features per row.
    pub cols: usize,
    /// Classes.
    pub classes: usize,
}

impl<'a> DenseRows<'a> {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Rows `range`, zero-copy.
    pub fn rows(&self, range: Range<usize>) -> DenseRows<'a> {
        DenseRows {
            features: &self.features[range.start * self.cols..range.end * self.cols],
            labels: &self.labels[range],
            cols: self.cols,
            classes: self.classes,
        }
    }
}

/// (user, item, rating) triples.
#[derive(Clone, Copy, Debug)]
pub struct Ratings<'a> {
    /// User of each rating.
    pub users: &'a [u32],
    /// Item of each rating.
    pub items: &'a [u32],
    /// The ratings.
    pub ratings: &'a [f32],
    /// Users (max id + 1).
    pub n_users: usize,
    /// Items (max id + 1).
    pub n_items: usize,
}

impl<'a> Ratings<'a> {
    /// Number of ratings.
    pub fn len(&self) -> usize {
        self.ratings.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ratings.is_empty()
    }

    /// Ratings `range`, zero-copy.
    pub fn rows(&self, range: Range<usize>) -> Ratings<'a> {
        Ratings {
            users: &self.users[range.clone()],
            items: &self.items[range.clone()],
            ratings: &self.ratings[range],
            n_users: self.n_users,
            n_items: self.n_items,
        }
    }
}

/// Rank `rank`'s rows of `rows` split over `world` ranks, as even as possible (the first
/// `rows % world` ranks get one more).
pub fn shard(rows: usize, rank: usize, world: usize) -> Range<usize> {
    assert!(world > 0 && rank < world, "rank {rank} of a world of {world}");
    let (q, r) = (rows / world, rows % world);
    let start = rank * q + rank.min(r);
    start..start + q + usize::from(rank < r)
}

/// `range` cut into consecutive chunks of `chunk` rows (the last may be shorter).
pub fn chunks(range: Range<usize>, chunk: usize) -> impl Iterator<Item = Range<usize>> {
    assert!(chunk > 0, "chunks of at least one row");
    let end = range.end;
    range.step_by(chunk).map(move |s| s..(s + chunk).min(end))
}
