//! The header as stored and the counts it is derived from: the format's constants, [`Header`],
//! [`Kind`], [`Shape`] and [`Truth`], the section layout a shape implies and the checks of its
//! counts, and the header checksum.

use bytemuck::{Pod, Zeroable};

/// `"PRGRNDS\0"`.
pub const MAGIC: [u8; 8] = *b"PRGRNDS\0";
/// The format version this code reads and writes.
pub const VERSION: u32 = 1;
/// Bytes before the first section.
pub const HEADER_BYTES: usize = 192;
/// Section alignment.
pub const ALIGN: u64 = 64;
/// Sections in the table.
pub const SECTIONS: usize = 6;

/// Most classes a dense dataset may declare (labels `0..65535`, as the CSV and NumPy converters
/// accept): a model holds a row of weights per class, so that a count from a corrupt or crafted
/// header would otherwise size it.
pub const MAX_CLASSES: u32 = 1 << 16;
/// Most features (columns), items or users a dataset may declare: their ids are stored as `u32`.
pub const MAX_IDS: u64 = 1 << 32;

/// The header as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`VERSION`].
    pub version: u32,
    /// [`Kind`] as a number.
    pub kind: u32,
    /// Rows (examples, or ratings).
    pub rows: u64,
    /// Features, or items.
    pub cols: u64,
    /// Stored values.
    pub nnz: u64,
    /// Classes.
    pub classes: u32,
    /// Rank of generated ratings' true factors.
    pub truth_rank: u32,
    /// Users (ratings).
    pub users: u64,
    /// (offset, bytes) of each section.
    pub sections: [[u64; 2]; SECTIONS],
    /// CRC-32 of the section bytes.
    pub data_crc: u32,
    /// CRC-32 of the bytes before this field.
    pub header_crc: u32,
    /// Zero.
    pub reserved: [u64; 4],
}

const _: () = assert!(size_of::<Header>() == HEADER_BYTES);

/// What a dataset holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Sparse rows (CSR) with binary labels: logistic regression.
    Sparse,
    /// Dense rows with class labels: softmax regression, MLP.
    Dense,
    /// (user, item, rating) triples: matrix factorization.
    Ratings,
}

impl Kind {
    /// Name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sparse => "sparse binary-labelled",
            Self::Dense => "dense multiclass",
            Self::Ratings => "ratings",
        }
    }

    fn code(self) -> u32 {
        match self {
            Self::Sparse => 1,
            Self::Dense => 2,
            Self::Ratings => 3,
        }
    }

    pub(super) fn from_code(c: u32) -> Option<Self> {
        match c {
            1 => Some(Self::Sparse),
            2 => Some(Self::Dense),
            3 => Some(Self::Ratings),
            _ => None,
        }
    }
}

/// The counts that fix a dataset's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// What it holds.
    pub kind: Kind,
    /// Rows (examples, or ratings).
    pub rows: u64,
    /// Features, or items.
    pub cols: u64,
    /// Nonzeros (sparse); ignored (derived) for the other kinds.
    pub nnz: u64,
    /// Classes (dense); 2 for sparse; 0 for ratings.
    pub classes: u32,
    /// Users (ratings).
    pub users: u64,
    /// Whether the optional true-model section is present, and for ratings its rank.
    pub truth: Truth,
    /// Whether the optional scaling section is present (sparse and dense only).
    pub scaled: bool,
}

/// The optional section of generated data: the model that generated it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Truth {
    /// Not present (converted data).
    None,
    /// Present: for ratings, the factors' rank; ignored otherwise.
    Present {
        /// Rank of the true factors (ratings only).
        rank: u32,
    },
}

impl Shape {
    /// Stored values (`nnz` for sparse; derived for the others).
    fn values(&self) -> Option<u64> {
        match self.kind {
            Kind::Sparse => Some(self.nnz),
            Kind::Dense => self.rows.checked_mul(self.cols),
            Kind::Ratings => Some(self.rows),
        }
    }

    /// An error naming the header field unless the counts that size a model (features, items,
    /// users, classes) are within what the format's ids can number ([`MAX_IDS`],
    /// [`MAX_CLASSES`]); rows and stored values are bounded by the file's size instead.
    pub(super) fn check_bounds(&self) -> std::result::Result<(), String> {
        let field = |name: &str, v: u64, max: u64, what: &str| {
            if v > max {
                Err(format!("header field `{name}` is {v}: at most {max} {what}"))
            } else {
                Ok(())
            }
        };
        let ids = "(ids are 32-bit)";
        match self.kind {
            Kind::Sparse => field("cols", self.cols, MAX_IDS, &format!("features {ids}")),
            Kind::Dense => {
                field("cols", self.cols, MAX_IDS, &format!("features {ids}"))?;
                field(
                    "classes",
                    u64::from(self.classes),
                    u64::from(MAX_CLASSES),
                    "classes (labels 0 to 65535, as the converters write them)",
                )
            }
            Kind::Ratings => {
                field("cols", self.cols, MAX_IDS, &format!("items {ids}"))?;
                field("users", self.users, MAX_IDS, &format!("users {ids}"))
            }
        }
    }

    /// Bytes of each section.
    fn section_bytes(&self) -> Option<[u64; SECTIONS]> {
        let (r, c, v) = (self.rows, self.cols, self.values()?);
        let truth = match self.truth {
            Truth::None => 0,
            Truth::Present { rank } => match self.kind {
                Kind::Sparse => c.checked_mul(4)?,
                Kind::Dense => c.checked_mul(u64::from(self.classes))?.checked_mul(4)?,
                Kind::Ratings => self.users.checked_add(c)?.checked_mul(u64::from(rank))?.checked_mul(4)?,
            },
        };
        let scaling = if self.scaled && self.kind != Kind::Ratings { c.checked_mul(8)? } else { 0 };
        Some(match self.kind {
            Kind::Sparse => [
                r.checked_add(1)?.checked_mul(8)?,
                v.checked_mul(4)?,
                v.checked_mul(4)?,
                r.checked_mul(4)?,
                truth,
                scaling,
            ],
            Kind::Dense => [v.checked_mul(4)?, r.checked_mul(4)?, 0, 0, truth, scaling],
            Kind::Ratings => [r.checked_mul(4)?, r.checked_mul(4)?, r.checked_mul(4)?, 0, truth, 0],
        })
    }

    /// The header (without CRCs) and the total file size.
    pub(super) fn layout(&self) -> Option<(Header, u64)> {
        let bytes = self.section_bytes()?;
        let mut sections = [[0u64; 2]; SECTIONS];
        let mut at = HEADER_BYTES as u64;
        for (s, &b) in sections.iter_mut().zip(&bytes) {
            *s = [at, b];
            at = at.checked_add(b)?.checked_next_multiple_of(ALIGN)?;
        }
        let header = Header {
            magic: MAGIC,
            version: VERSION,
            kind: self.kind.code(),
            rows: self.rows,
            cols: self.cols,
            nnz: self.values()?,
            classes: self.classes,
            truth_rank: match self.truth {
                Truth::Present { rank } if self.kind == Kind::Ratings => rank,
                _ => 0,
            },
            users: self.users,
            sections,
            data_crc: 0,
            header_crc: 0,
            reserved: [0; 4],
        };
        Some((header, at))
    }
}

/// CRC-32 of the header's bytes before its `header_crc` field.
pub(super) fn header_crc(h: &Header) -> u32 {
    let bytes = bytemuck::bytes_of(h);
    crc32fast::hash(&bytes[..152 + 4])
}
