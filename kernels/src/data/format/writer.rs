//! Writing a dataset: [`Writer`] fills the sections in order into a temporary file, then writes
//! the header and renames the file into place.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use bytemuck::Pod;

use super::header::{header_crc, Header, Shape, ALIGN, HEADER_BYTES, SECTIONS};
use crate::data::error::{DataError, Result};

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

#[cfg(test)]
mod tests {
    use super::super::header::{Kind, Truth};
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
