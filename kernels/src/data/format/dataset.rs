//! Reading a dataset: [`Dataset`] maps a file and checks its header (or holds a copy in
//! memory), and gives its sections as typed rows; a short summary from the header.

use std::fs::File;
use std::path::{Path, PathBuf};

use bytemuck::Pod;
use memmap2::Mmap;

use super::header::{header_crc, Header, Kind, Shape, Truth, HEADER_BYTES, MAGIC, VERSION};
use super::rows::{DenseRows, Ratings, SparseRows};
use crate::data::error::{DataError, Result};

/// A dataset file mapped into memory.
#[derive(Debug)]
pub struct Dataset {
    /// Registered with the `SIGBUS` handler ([`crate::data::guard`]) while the data is read through
    /// the file's mapping (`None` for a copy in memory: [`Dataset::into_memory`]); dropped
    /// before the mapping.
    _guard: Option<crate::data::guard::Registration>,
    pub(super) map: Mmap,
    pub(super) header: Header,
    pub(super) kind: Kind,
    pub(super) path: PathBuf,
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
        let guard = crate::data::guard::Registration::new(
            map.as_ptr(),
            map.len(),
            path,
            file.metadata().ok().as_ref(),
        );
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
    /// start zeroed); the header and both checksums are then set as a [`Writer`](super::Writer) sets them.
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
