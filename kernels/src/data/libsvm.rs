//! LIBSVM / SVMlight text to a sparse binary-labelled dataset.
//!
//! `label index:value index:value ... [# comment]`, indices 1-based and strictly increasing,
//! labels -1/+1 or 0/1 (stored as 0/1), values finite. Blank lines and lines starting with `#` are
//! skipped. Gzipped input is read as is.

use std::path::Path;

use super::error::{DataError, Result};
use super::format::{Kind, Shape, Truth, Writer};
use super::text::{parse_error, parse_f32, parse_u64, Lines};

/// What a conversion produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Converted {
    /// Rows written.
    pub rows: u64,
    /// Columns (features or items).
    pub cols: u64,
    /// Stored values.
    pub nnz: u64,
    /// Bytes of input read (text after decompression; 0 for binary inputs).
    pub input_bytes: u64,
}

/// The parsed arrays of a sparse file.
#[derive(Debug, Default)]
pub struct SparseText {
    /// Row offsets.
    pub row_ptr: Vec<u64>,
    /// 0-based indices.
    pub indices: Vec<u32>,
    /// Values.
    pub values: Vec<f32>,
    /// 0/1 labels.
    pub labels: Vec<f32>,
    /// Largest 1-based index seen (the feature count).
    pub max_index: u64,
    /// Text bytes parsed.
    pub bytes: u64,
}

/// Parses a LIBSVM file into arrays.
pub fn parse(path: &Path) -> Result<SparseText> {
    let mut lines = Lines::new(path)?;
    let mut out = SparseText { row_ptr: vec![0], ..SparseText::default() };
    while let Some((no, line)) = lines.next_line()? {
        parse_line(path, no, line, &mut out)?;
    }
    out.bytes = lines.bytes();
    Ok(out)
}

fn skip_ws(line: &[u8], mut i: usize) -> usize {
    while i < line.len() && (line[i] == b' ' || line[i] == b'\t') {
        i += 1;
    }
    i
}

fn token_end(line: &[u8], mut i: usize, stop: u8) -> usize {
    while i < line.len() && line[i] != b' ' && line[i] != b'\t' && line[i] != stop {
        i += 1;
    }
    i
}

fn parse_line(path: &Path, no: u64, line: &[u8], out: &mut SparseText) -> Result<()> {
    let mut i = skip_ws(line, 0);
    if i == line.len() || line[i] == b'#' {
        return Ok(());
    }
    let end = token_end(line, i, b'#');
    let label = parse_f32(&line[i..end])
        .ok_or_else(|| parse_error(path, no, line, i, "a label (a finite number)"))?;
    let y = if label == 1.0 {
        1.0
    } else if label == -1.0 || label == 0.0 {
        0.0
    } else {
        return Err(parse_error(path, no, line, i, "a binary label: -1 or +1 (or 0 or 1)"));
    };
    i = end;
    // SVMlight's query id (`qid:N`, ranking data) right after the label: read past, not used.
    let at = skip_ws(line, i);
    if line[at..].starts_with(b"qid:") {
        let end = token_end(line, at, b'#');
        if parse_u64(&line[at + 4..end]).is_none() {
            return Err(parse_error(path, no, line, at + 4, "a query id (qid:N, a whole number)"));
        }
        i = end;
    }
    let mut prev = 0u64;
    loop {
        i = skip_ws(line, i);
        if i == line.len() || line[i] == b'#' {
            break;
        }
        let colon = token_end(line, i, b':');
        if colon == line.len() || line[colon] != b':' {
            return Err(parse_error(path, no, line, i, "index:value"));
        }
        let index = parse_u64(&line[i..colon])
            .ok_or_else(|| parse_error(path, no, line, i, "a feature index (1, 2, ...)"))?;
        if index == 0 {
            return Err(parse_error(
                path,
                no,
                line,
                i,
                "a 1-based feature index (LIBSVM indices start at 1)",
            ));
        }
        if index > u64::from(u32::MAX) {
            return Err(parse_error(path, no, line, i, format!("a feature index below {}", u32::MAX)));
        }
        if index == prev {
            return Err(parse_error(path, no, line, i, format!("a new index (duplicate index {index})")));
        }
        if index < prev {
            return Err(parse_error(
                path,
                no,
                line,
                i,
                format!("an index above {prev} (indices must increase)"),
            ));
        }
        let v0 = colon + 1;
        let v1 = token_end(line, v0, b'#');
        let value =
            parse_f32(&line[v0..v1]).ok_or_else(|| parse_error(path, no, line, v0, "a finite value"))?;
        out.indices.push((index - 1) as u32);
        out.values.push(value);
        prev = index;
        i = v1;
    }
    out.max_index = out.max_index.max(prev);
    out.labels.push(y);
    out.row_ptr.push(out.indices.len() as u64);
    Ok(())
}

/// Converts `input` (LIBSVM, maybe gzipped) to a dataset at `output`. `features` fixes the
/// feature count (an index beyond it is an error); by default it is the largest index.
pub fn convert(input: &Path, output: &Path, features: Option<u64>) -> Result<Converted> {
    let t = parse(input)?;
    if t.labels.is_empty() {
        return Err(DataError::format(input, "no examples"));
    }
    let cols = t.columns(features, |f| {
        format!("{}: index {} is beyond --features {f}", input.display(), t.max_index)
    })?;
    t.write(output, cols)
}

impl SparseText {
    /// The column count: `given` if it covers [`max_index`](Self::max_index), else the error
    /// `beyond(given)`; by default `max_index`.
    pub fn columns(&self, given: Option<u64>, beyond: impl FnOnce(u64) -> String) -> Result<u64> {
        match given {
            Some(g) if g < self.max_index => Err(DataError::Invalid(beyond(g))),
            Some(g) => Ok(g),
            None => Ok(self.max_index),
        }
    }

    /// Writes the rows as a sparse dataset of `cols` columns at `output`.
    pub fn write(&self, output: &Path, cols: u64) -> Result<Converted> {
        let shape = Shape {
            kind: Kind::Sparse,
            rows: self.labels.len() as u64,
            cols,
            nnz: self.indices.len() as u64,
            classes: 2,
            users: 0,
            truth: Truth::None,
            scaled: false,
        };
        let mut w = Writer::create(output, shape)?;
        w.write(0, &self.row_ptr)?;
        w.write(1, &self.indices)?;
        w.write(2, &self.values)?;
        w.write(3, &self.labels)?;
        w.finish()?;
        Ok(Converted { rows: shape.rows, cols, nnz: shape.nnz, input_bytes: self.bytes })
    }
}
