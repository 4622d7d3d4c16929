//! The dataset file: a 192-byte header, then up to six arrays, each starting on a 64-byte
//! boundary, little-endian, read in place from a memory mapping.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "PRGRNDS\0"
//!      8     4  version (1)
//!     12     4  kind: 1 sparse binary-labelled (CSR), 2 dense multiclass, 3 ratings
//!     16     8  rows
//!     24     8  cols       features (sparse, dense) or items (ratings)
//!     32     8  nnz        stored values: nonzeros (sparse), rows*cols (dense), rows (ratings)
//!     40     4  classes    2 (sparse), k (dense), 0 (ratings)
//!     44     4  truth_rank rank of the generating factors (generated ratings), else 0
//!     48     8  users      ratings: number of users (max user id + 1), else 0
//!     56    96  sections   6 x (offset u64, bytes u64)
//!    152     4  data_crc   CRC-32 of all section bytes, in order
//!    156     4  header_crc CRC-32 of bytes 0..156
//!    160    32  reserved (zero)
//! ```
//!
//! | kind | section 0 | 1 | 2 | 3 | 4 (optional) | 5 (optional) |
//! |---|---|---|---|---|---|---|
//! | sparse | row_ptr u64 x (rows+1) | indices u32 x nnz (0-based, increasing per row) | values f32 x nnz | labels f32 x rows (0 or 1) | true model f32 x cols | scaling f32 x 2*cols |
//! | dense | features f32 x rows*cols (row-major) | labels u32 x rows | | | true model f32 x classes*cols | scaling f32 x 2*cols |
//! | ratings | users u32 x rows | items u32 x rows | ratings f32 x rows | | true factors f32 x (users+items)*truth_rank | |
//!
//! The scaling section, written by `peregrine data standardize`, records the transformation the
//! stored features went through: `cols` shifts, then `cols` multipliers (`x = (raw - shift) *
//! multiplier`), so that other files can be given the same one.
//!
//! Opening checks the header (magic, version, header CRC, kind, the counts that size a model
//! within [`MAX_IDS`] and [`MAX_CLASSES`], that every section lies inside the file with the size
//! the counts imply, and the ends of `row_ptr`): O(1), whatever the size.
//! [`Dataset::verify`] checks the data CRC and every index and label: O(size).
//!
//! The code, one file a purpose: `header` (the header, the layout a [`Shape`] implies, the checks
//! of its counts), `dataset` (mapping and reading: [`Dataset`]), `verify` ([`Dataset::verify`],
//! [`combine_crcs`]), `writer` ([`Writer`]) and `rows` (the zero-copy views [`SparseRows`],
//! [`DenseRows`], [`Ratings`]; [`shard`], [`chunks`]).

#[cfg(not(target_endian = "little"))]
compile_error!("the dataset format is little-endian and read in place: big-endian targets are not supported");

mod dataset;
mod header;
mod rows;
mod verify;
mod writer;

pub use dataset::{huge_pages_enabled, Dataset};
pub use header::{
    Header, Kind, Shape, Truth, ALIGN, HEADER_BYTES, MAGIC, MAX_CLASSES, MAX_IDS, SECTIONS, VERSION,
};
pub use rows::{chunks, shard, DenseRows, Ratings, SparseRows};
pub use verify::combine_crcs;
pub use writer::Writer;
