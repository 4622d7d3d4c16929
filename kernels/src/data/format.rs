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

use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use bytemuck::{Pod, Zeroable};
use memmap2::Mmap;

use super::error::{DataError, Result};

#[cfg(not(target_endian = "little"))]
compile_error!("the dataset format is little-endian and read in place: big-endian targets are not supported");

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

    fn from_code(c: u32) -> Option<Self> {
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
    fn check_bounds(&self) -> std::result::Result<(), String> {
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
    fn layout(&self) -> Option<(Header, u64)> {
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

fn header_crc(h: &Header) -> u32 {
    let bytes = bytemuck::bytes_of(h);
    crc32fast::hash(&bytes[..152 + 4])
}

/// Writes a dataset section by section, into a temporary file renamed into place by
/// [`finish`](Self::finish): an interrupted or failed write never leaves a half-written dataset
/// (the temporary file, of a name no file had, is removed on drop and when `finish` fails).
#[derive(Debug)]
pub struct Writer {
    out: Option<BufWriter<File>>,
    tmp: PathBuf,
    /// Set once the temporary file is renamed into place.
    renamed: bool,
    dest: PathBuf,
    header: Header,
    /// Section being written and bytes written into it.
    section: usize,
    filled: u64,
    /// Bytes written to the file so far.
    pos: u64,
    crc: crc32fast::Hasher,
}

impl Writer {
    /// Starts writing a dataset of `shape` to `dest`.
    pub fn create(dest: &Path, shape: Shape) -> Result<Self> {
        shape.check_bounds().map_err(|e| DataError::Invalid(format!("{}: {e}", dest.display())))?;
        let (header, _) =
            shape.layout().ok_or_else(|| DataError::Invalid(format!("dataset too large: {shape:?}")))?;
        let (tmp, file) = create_temp(dest)?;
        let mut w = Self {
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            tmp,
            renamed: false,
            dest: dest.to_owned(),
            header,
            section: 0,
            filled: 0,
            pos: HEADER_BYTES as u64,
            crc: crc32fast::Hasher::new(),
        };
        let tmp = w.tmp.clone();
        w.out().write_all(&[0u8; HEADER_BYTES]).map_err(DataError::io(&tmp, "writing"))?;
        Ok(w)
    }

    fn out(&mut self) -> &mut BufWriter<File> {
        self.out.as_mut().expect("the output is present until finish or drop")
    }

    /// Appends `data` to section `section` (sections are written in order; a section may be
    /// written in several calls).
    pub fn write<T: Pod>(&mut self, section: usize, data: &[T]) -> Result<()> {
        while self.section < section {
            self.end_section()?;
        }
        if section != self.section {
            return Err(DataError::Invalid(format!(
                "section {section} written after section {}",
                self.section
            )));
        }
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let [_, len] = self.header.sections[section];
        if self.filled + bytes.len() as u64 > len {
            return Err(DataError::Invalid(format!(
                "section {section} holds {len} bytes; {} more would overflow it",
                bytes.len()
            )));
        }
        self.crc.update(bytes);
        let tmp = self.tmp.clone();
        self.out().write_all(bytes).map_err(DataError::io(&tmp, "writing"))?;
        self.filled += bytes.len() as u64;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Checks the current section is complete and pads to the next one.
    fn end_section(&mut self) -> Result<()> {
        let [start, len] = self.header.sections[self.section];
        if self.filled != len {
            return Err(DataError::Invalid(format!(
                "section {} got {} bytes, the shape needs {len}",
                self.section, self.filled
            )));
        }
        let next = (start + len).next_multiple_of(ALIGN);
        let pad = (next - self.pos) as usize;
        let tmp = self.tmp.clone();
        self.out().write_all(&[0u8; ALIGN as usize][..pad]).map_err(DataError::io(&tmp, "writing"))?;
        self.pos = next;
        self.section += 1;
        self.filled = 0;
        Ok(())
    }

    /// Completes every section, writes the header, and renames the file into place.
    pub fn finish(mut self) -> Result<()> {
        while self.section < SECTIONS {
            self.end_section()?;
        }
        self.header.data_crc = std::mem::replace(&mut self.crc, crc32fast::Hasher::new()).finalize();
        self.header.header_crc = header_crc(&self.header);
        let tmp = self.tmp.clone();
        let mut out = self.out.take().expect("the output is present until finish");
        out.flush().map_err(DataError::io(&tmp, "writing"))?;
        let mut file = out.into_inner().map_err(|e| DataError::io(&tmp, "writing")(e.into_error()))?;
        use std::io::Seek;
        file.seek(std::io::SeekFrom::Start(0)).map_err(DataError::io(&tmp, "writing"))?;
        file.write_all(bytemuck::bytes_of(&self.header)).map_err(DataError::io(&tmp, "writing"))?;
        file.sync_all().map_err(DataError::io(&tmp, "syncing"))?;
        drop(file);
        std::fs::rename(&tmp, &self.dest)
            .map_err(DataError::io(&self.dest, "renaming the finished file to"))?;
        self.renamed = true;
        Ok(())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.out.take());
        if !self.renamed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Temporary files made by this process so far: with the process id, a name no other writer
/// takes.
static TEMPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Creates `<dest>.tmp.<pid>.<n>` beside `dest`, only where no file has that name (a file left
/// there, or a link planted there, is never opened: the next `n` is taken).
fn create_temp(dest: &Path) -> Result<(PathBuf, File)> {
    loop {
        let n = TEMPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut name = dest.file_name().unwrap_or_default().to_owned();
        name.push(format!(".tmp.{}.{n}", std::process::id()));
        let tmp = dest.with_file_name(name);
        match File::options().write(true).create_new(true).open(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(DataError::io(&tmp, "creating")(e)),
        }
    }
}

/// A dataset file mapped into memory.
#[derive(Debug)]
pub struct Dataset {
    /// Registered with the `SIGBUS` handler ([`super::guard`]) while the data is read through
    /// the file's mapping (`None` for a copy in memory: [`Dataset::into_memory`]); dropped
    /// before the mapping.
    _guard: Option<super::guard::Registration>,
    map: Mmap,
    header: Header,
    kind: Kind,
    path: PathBuf,
}

/// Whether the kernel gives transparent huge pages to memory that asks for them (its
/// `enabled` setting is `always` or `madvise`; false where it is `never` or cannot be read).
pub fn huge_pages_enabled() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
}

/// What to do with a file that is not a dataset, judged from its first bytes: text and gzip
/// files are what `peregrine data convert` reads.
fn convert_hint(head: &[u8]) -> &'static str {
    if head.starts_with(&[0x1f, 0x8b]) {
        "; it is gzip-compressed: convert it first with `peregrine data convert libsvm|idx|ratings` (gzip is read directly)"
    } else if head.starts_with(&[0, 0, 8]) {
        "; it looks like an MNIST IDX file: convert it first with `peregrine data convert idx`"
    } else if !head.is_empty() && head.iter().all(|&b| b.is_ascii_graphic() || b.is_ascii_whitespace()) {
        "; it looks like text: convert it first with `peregrine data convert libsvm` (LIBSVM/SVMlight), `csv` or `ratings`"
    } else {
        ""
    }
}

impl Dataset {
    /// Maps `path` and checks its header: O(1) in the dataset's size.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(DataError::io(path, "opening"))?;
        // SAFETY: the file is mapped read-only. Datasets are written once, into a temporary file
        // renamed into place, and never modified after (a rewrite replaces the directory entry,
        // not the mapped inode). A file truncated anyway raises SIGBUS on a read past its new
        // end, which the guard registered below turns into an error naming the file; a file
        // rewritten in place with the same length shows the new bytes, which are data like any
        // other to the kernels (indices are checked before they are used: `check_rows`).
        let map = unsafe { Mmap::map(&file) }.map_err(DataError::io(path, "mapping"))?;
        let guard =
            super::guard::Registration::new(map.as_ptr(), map.len(), path, file.metadata().ok().as_ref());
        let bad = |d: String| DataError::format(path, d);
        if map.len() < MAGIC.len() || map[..MAGIC.len()] != MAGIC {
            let found = &map[..map.len().min(MAGIC.len())];
            return Err(bad(format!(
                "not a Peregrine dataset (starts with {found:?}, expected {MAGIC:?}){}",
                convert_hint(&map[..map.len().min(512)])
            )));
        }
        if map.len() < HEADER_BYTES {
            return Err(bad(format!(
                "truncated: {} bytes, a dataset header alone is {HEADER_BYTES}",
                map.len()
            )));
        }
        let header: Header = bytemuck::pod_read_unaligned(&map[..HEADER_BYTES]);
        if header.version != VERSION {
            return Err(bad(format!(
                "format version {}, this build reads version {VERSION}",
                header.version
            )));
        }
        if header_crc(&header) != header.header_crc {
            return Err(bad("header checksum mismatch: the header is corrupt".into()));
        }
        let kind =
            Kind::from_code(header.kind).ok_or_else(|| bad(format!("unknown kind {}", header.kind)))?;
        let truth =
            if header.sections[4][1] > 0 { Truth::Present { rank: header.truth_rank } } else { Truth::None };
        let shape = Shape {
            kind,
            rows: header.rows,
            cols: header.cols,
            nnz: header.nnz,
            classes: header.classes,
            users: header.users,
            truth,
            scaled: header.sections[5][1] > 0,
        };
        shape.check_bounds().map_err(bad)?;
        let (expected, size) = shape.layout().ok_or_else(|| bad("counts overflow".into()))?;
        if expected.sections != header.sections || expected.nnz != header.nnz {
            return Err(bad(format!(
                "section table {:?} does not match the counts {shape:?}",
                header.sections
            )));
        }
        let last_end = header.sections.iter().map(|[o, l]| o + l).max().unwrap_or(0);
        if (map.len() as u64) < last_end {
            return Err(bad(format!(
                "truncated: the header describes {size} bytes, the file has {}",
                map.len()
            )));
        }
        let d = Self { _guard: Some(guard), map, header, kind, path: path.to_owned() };
        if kind == Kind::Sparse {
            let rp: &[u64] = d.section(0);
            if rp.first() != Some(&0) || rp.last() != Some(&header.nnz) {
                return Err(bad(format!(
                    "row_ptr runs from {:?} to {:?}, expected 0 to {}",
                    rp.first(),
                    rp.last(),
                    header.nnz
                )));
            }
        }
        Ok(d)
    }

    /// The dataset copied out of its file into anonymous memory, which asks the kernel for
    /// transparent huge pages if `huge` (advice: where they are off, the copy keeps 4 KiB pages).
    /// Rows read from 2 MiB pages miss the TLB far less: a chunk of the MLP's 64 rows of
    /// Fashion-MNIST (200 KB, 49 pages of 4 KiB) took 25 us more from memory than from cache
    /// with huge pages against 40-48 us with small ones (one core, alternated), and training at
    /// batch 128 on 2 ranks ran 7 % faster. Reads the whole file once (a truncation meanwhile is
    /// the mapping's `SIGBUS` error); costs its size in memory, per copy.
    pub fn into_memory(self, huge: bool) -> Result<Self> {
        let mut copy = memmap2::MmapMut::map_anon(self.map.len())
            .map_err(DataError::io(&self.path, "allocating memory for"))?;
        // Advice only, each of it: a kernel without transparent huge pages keeps small ones, and
        // one without the populating advice (before 5.14) faults the pages in as they are
        // copied. With it, the file's pages are mapped and the copy's allocated in one call each
        // rather than a fault per page (188 MB: 85-110 ms a copy against 63-510, the worst
        // where the kernel compacted memory for the huge pages fault by fault).
        if huge {
            let _ = copy.advise(memmap2::Advice::HugePage);
        }
        let _ = self.map.advise(memmap2::Advice::PopulateRead);
        let _ = copy.advise(memmap2::Advice::PopulateWrite);
        copy.copy_from_slice(&self.map);
        let map = copy.make_read_only().map_err(DataError::io(&self.path, "protecting the copy of"))?;
        let Self { _guard: guard, map: file, header, kind, path } = self;
        // The file's mapping goes after its registration.
        drop(guard);
        drop(file);
        Ok(Self { _guard: None, map, header, kind, path })
    }

    /// A dataset of `shape` built in anonymous memory (huge pages asked for if `huge`), named
    /// `path` in messages: `fill(section, bytes)` writes each section's bytes, in order (they
    /// start zeroed); the header and both checksums are then set as a [`Writer`] sets them.
    pub fn build_in_memory(
        path: &Path,
        shape: Shape,
        huge: bool,
        mut fill: impl FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<Self> {
        shape.check_bounds().map_err(|e| DataError::format(path, e))?;
        let (mut header, size) =
            shape.layout().ok_or_else(|| DataError::Invalid(format!("dataset too large: {shape:?}")))?;
        let size =
            usize::try_from(size).map_err(|_| DataError::Invalid(format!("dataset too large: {shape:?}")))?;
        let mut copy = memmap2::MmapMut::map_anon(size)
            .map_err(DataError::io(path, "allocating memory for a copy of"))?;
        if huge {
            let _ = copy.advise(memmap2::Advice::HugePage);
        }
        let mut crc = crc32fast::Hasher::new();
        for (i, [off, len]) in header.sections.into_iter().enumerate() {
            let bytes = &mut copy[off as usize..(off + len) as usize];
            fill(i, bytes)?;
            crc.update(bytes);
        }
        header.data_crc = crc.finalize();
        header.header_crc = header_crc(&header);
        copy[..HEADER_BYTES].copy_from_slice(bytemuck::bytes_of(&header));
        let map = copy.make_read_only().map_err(DataError::io(path, "protecting the copy of"))?;
        let kind = shape.kind;
        Ok(Self { _guard: None, map, header, kind, path: path.to_owned() })
    }

    /// Whether the data is read through the file's mapping, not a copy in memory
    /// ([`into_memory`](Self::into_memory)).
    pub fn is_mapped(&self) -> bool {
        self._guard.is_some()
    }

    /// The file's size in bytes.
    pub fn bytes(&self) -> usize {
        self.map.len()
    }

    fn section<T: Pod>(&self, i: usize) -> &[T] {
        let [off, len] = self.header.sections[i];
        // Offsets are multiples of 64 from a page-aligned mapping, lengths multiples of the
        // element size (checked against the shape at open): the cast cannot fail.
        bytemuck::cast_slice(&self.map[off as usize..(off + len) as usize])
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// What it holds.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.header.rows as usize
    }

    fn expect(&self, kind: Kind) -> Result<()> {
        if self.kind != kind {
            return Err(DataError::WrongKind {
                path: self.path.clone(),
                expected: kind.name(),
                found: self.kind.name(),
            });
        }
        Ok(())
    }

    /// The rows of a sparse dataset.
    pub fn sparse(&self) -> Result<SparseRows<'_>> {
        self.expect(Kind::Sparse)?;
        Ok(SparseRows {
            row_ptr: self.section(0),
            indices: self.section(1),
            values: self.section(2),
            labels: self.section(3),
            cols: self.header.cols as usize,
        })
    }

    /// The rows of a dense dataset.
    pub fn dense(&self) -> Result<DenseRows<'_>> {
        self.expect(Kind::Dense)?;
        Ok(DenseRows {
            features: self.section(0),
            labels: self.section(1),
            cols: self.header.cols as usize,
            classes: self.header.classes as usize,
        })
    }

    /// The triples of a ratings dataset.
    pub fn ratings(&self) -> Result<Ratings<'_>> {
        self.expect(Kind::Ratings)?;
        Ok(Ratings {
            users: self.section(0),
            items: self.section(1),
            ratings: self.section(2),
            n_users: self.header.users as usize,
            n_items: self.header.cols as usize,
        })
    }

    /// The model that generated the data, if it was generated (see the format table).
    pub fn truth(&self) -> Option<&[f32]> {
        let t: &[f32] = self.section(4);
        (!t.is_empty()).then_some(t)
    }

    /// The scaling the stored features went through (`peregrine data standardize`): shifts and
    /// multipliers, one per feature (`x = (raw - shift) * multiplier`).
    pub fn scaling(&self) -> Option<(&[f32], &[f32])> {
        let t: &[f32] = self.section(5);
        (!t.is_empty()).then(|| t.split_at(t.len() / 2))
    }

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

    /// A few lines describing the dataset, from its header alone: O(1), whatever its size. With
    /// `counts`, also the share of positive labels (sparse) and how many features the scaling
    /// centres and scales (standardized data), which reads the labels and the scaling: O(rows +
    /// features).
    pub fn summary(&self, counts: bool) -> String {
        let h = &self.header;
        let mib = self.map.len() as f64 / (1 << 20) as f64;
        let mut s = format!("{}: {} dataset, {:.1} MiB\n", self.path.display(), self.kind.name(), mib);
        match self.kind {
            Kind::Sparse => {
                s += &format!(
                    "  rows {}  features {}  nonzeros {} ({:.1} per row)",
                    h.rows,
                    h.cols,
                    h.nnz,
                    h.nnz as f64 / h.rows.max(1) as f64,
                );
                if counts {
                    let pos =
                        self.sparse().map(|d| d.labels.iter().filter(|&&y| y > 0.5).count()).unwrap_or(0);
                    s += &format!("  positive {:.1}%", 100.0 * pos as f64 / h.rows.max(1) as f64);
                }
                s += "\n";
            }
            Kind::Dense => s += &format!("  rows {}  features {}  classes {}\n", h.rows, h.cols, h.classes),
            Kind::Ratings => s += &format!("  ratings {}  users {}  items {}\n", h.rows, h.users, h.cols),
        }
        if h.sections[4][1] > 0 {
            s += "  generated: holds its true model\n";
        }
        match self.scaling() {
            Some((shift, mult)) if counts => {
                let centred = shift.iter().filter(|&&v| v != 0.0).count();
                let scaled = mult.iter().filter(|&&v| v != 1.0).count();
                s += &format!("  standardized: {centred} features centred, {scaled} scaled\n");
            }
            Some(_) => s += "  standardized (the scaling is recorded)\n",
            None => {}
        }
        s += &format!("  data checksum {:#010x} (verify with --verify)", h.data_crc);
        s
    }
}

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

#[cfg(test)]
mod writer_tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            kind: Kind::Dense,
            rows: 2,
            cols: 1,
            nnz: 0,
            classes: 2,
            users: 0,
            truth: Truth::None,
            scaled: false,
        }
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .expect("list")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_failed_finish_leaves_no_temporary_file() {
        let d = tempfile::tempdir().expect("tmp");
        // The destination is a non-empty directory: the final rename fails.
        let dest = d.path().join("out.pgd");
        std::fs::create_dir_all(dest.join("x")).expect("mkdir");
        let mut w = Writer::create(&dest, shape()).expect("create");
        assert_eq!(names(d.path()).len(), 2, "the temporary file is there while writing");
        w.write(0, &[0f32, 1.0]).expect("values");
        w.write(1, &[0u32, 1]).expect("labels");
        let e = w.finish().expect_err("renaming onto a directory");
        assert!(e.to_string().contains("renaming"), "{e}");
        assert_eq!(names(d.path()), ["out.pgd"]);
    }

    #[test]
    fn a_file_at_the_temporary_name_is_never_opened() {
        let d = tempfile::tempdir().expect("tmp");
        let dest = d.path().join("out.pgd");
        let next = TEMPS.load(std::sync::atomic::Ordering::Relaxed);
        let theirs = |n: u64| d.path().join(format!("out.pgd.tmp.{}.{n}", std::process::id()));
        for n in next..next + 64 {
            std::fs::write(theirs(n), "theirs").expect("write");
        }
        let mut w = Writer::create(&dest, shape()).expect("create");
        w.write(0, &[0f32, 1.0]).expect("values");
        w.write(1, &[0u32, 1]).expect("labels");
        w.finish().expect("finish");
        for n in next..next + 64 {
            assert_eq!(std::fs::read(theirs(n)).expect("still there"), b"theirs");
        }
        assert_eq!(names(d.path()).len(), 65);
    }
}
