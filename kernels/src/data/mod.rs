//! Datasets: a binary format read zero-copy from a memory mapping ([`format`](mod@format)), converters from
//! LIBSVM ([`libsvm`]), MNIST IDX ([`idx`]) and ratings text ([`ratings`]), and seeded
//! generators ([`gen`]).
//!
//! Any rank can map any row range of a dataset (on a cluster the file sits on a shared file
//! system): [`shard`] gives a rank its rows and [`chunks`] cuts them into mini-batch chunks, all
//! as zero-copy views. Bad input is a [`DataError`] naming the file, and for text the line and
//! column; converters write into a temporary file renamed into place, so a failed conversion
//! leaves nothing behind.

pub mod bow;
pub mod csv;
pub mod error;
pub mod format;
pub mod gen;
pub mod guard;
pub mod idx;
pub mod libsvm;
pub mod npy;
pub mod ratings;
pub mod sparsify;
pub mod split;
pub mod standardize;
pub mod text;

pub use error::{DataError, Result};
pub use format::{
    chunks, combine_crcs, huge_pages_enabled, shard, Dataset, DenseRows, Kind, Ratings, Shape, SparseRows,
    Truth, Writer, MAX_CLASSES, MAX_IDS,
};
pub use libsvm::Converted;

#[cfg(test)]
mod tests;
