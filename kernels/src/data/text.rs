//! Reading text inputs: plain or gzipped files, line by line as bytes, with positions for errors.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

use super::error::{DataError, Result};

/// Opens `path`, transparently decompressing gzip (detected by its magic bytes, not the name).
pub fn open(path: &Path) -> Result<Box<dyn BufRead>> {
    let mut file = File::open(path).map_err(DataError::io(path, "opening"))?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(DataError::io(path, "reading"))?;
    let file = File::open(path).map_err(DataError::io(path, "opening"))?;
    Ok(if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(BufReader::with_capacity(
            1 << 20,
            MultiGzDecoder::new(BufReader::with_capacity(1 << 20, file)),
        ))
    } else {
        Box::new(BufReader::with_capacity(1 << 20, file))
    })
}

/// Reads the whole (possibly gzipped) file.
pub fn read_all(path: &Path) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    open(path)?.read_to_end(&mut buf).map_err(DataError::io(path, "reading"))?;
    Ok(buf)
}

/// The UTF-8 byte-order mark, which some tools (Excel, Notepad, PowerShell) write at the start
/// of a text file.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Lines of a text input with their 1-based numbers; `\r\n` is accepted, and a UTF-8
/// byte-order mark at the start of the first line is dropped (it is not text: columns are
/// counted after it).
pub struct Lines {
    input: Box<dyn BufRead>,
    path: PathBuf,
    buf: Vec<u8>,
    line: u64,
    bytes: u64,
}

impl std::fmt::Debug for Lines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lines").field("path", &self.path).field("line", &self.line).finish_non_exhaustive()
    }
}

impl Lines {
    /// Lines of `path`.
    pub fn new(path: &Path) -> Result<Self> {
        Ok(Self {
            input: open(path)?,
            path: path.to_owned(),
            buf: Vec::with_capacity(1 << 12),
            line: 0,
            bytes: 0,
        })
    }

    /// The next line (without its end) and its number, or `None` at the end.
    pub fn next_line(&mut self) -> Result<Option<(u64, &[u8])>> {
        self.buf.clear();
        let n = self.input.read_until(b'\n', &mut self.buf).map_err(DataError::io(&self.path, "reading"))?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        self.bytes += n as u64;
        let mut line = &self.buf[..];
        if self.line == 1 {
            line = line.strip_prefix(BOM).unwrap_or(line);
        }
        if let Some(l) = line.strip_suffix(b"\n") {
            line = l;
        }
        if let Some(l) = line.strip_suffix(b"\r") {
            line = l;
        }
        Ok(Some((self.line, line)))
    }

    /// Text bytes read so far (after decompression).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The input's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A parse error at `line`, byte offset `at` of `text` (the line), saying what was expected.
pub fn parse_error(path: &Path, line: u64, text: &[u8], at: usize, expected: impl Into<String>) -> DataError {
    let rest = &text[at.min(text.len())..];
    let token: Vec<u8> = rest.iter().copied().take_while(|b| !b.is_ascii_whitespace()).take(40).collect();
    let found =
        if rest.is_empty() { "end of line".to_owned() } else { String::from_utf8_lossy(&token).into_owned() };
    DataError::Parse { path: path.to_owned(), line, column: at as u64 + 1, expected: expected.into(), found }
}

/// Exact powers of ten in f32 (10^10 is the largest that is exact).
const POW10: [f32; 11] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10];

/// Clinger's fast path: `[+-]digits[.digits]` with at most 7 significant digits and 10 decimals
/// is `m / 10^k` with `m` and `10^k` exact in f32, so one IEEE division rounds it correctly.
/// Anything else (exponents, long mantissas) goes to the standard library's parser.
#[inline]
fn parse_f32_fast(tok: &[u8]) -> Option<f32> {
    let (neg, digits) = match tok.first() {
        Some(b'-') => (true, &tok[1..]),
        Some(b'+') => (false, &tok[1..]),
        _ => (false, tok),
    };
    let (mut m, mut n, mut frac, mut dot) = (0u32, 0usize, 0usize, false);
    for &b in digits {
        match b {
            b'0'..=b'9' => {
                if m > 0 || b != b'0' {
                    n += 1;
                }
                m = m.wrapping_mul(10).wrapping_add(u32::from(b - b'0'));
                frac += usize::from(dot);
            }
            b'.' if !dot => dot = true,
            _ => return None,
        }
    }
    if n > 7 || frac > 10 || digits.len() == usize::from(dot) {
        return None;
    }
    let v = m as f32 / POW10[frac];
    Some(if neg { -v } else { v })
}

/// Parses a finite float from ASCII bytes.
pub fn parse_f32(tok: &[u8]) -> Option<f32> {
    if let Some(v) = parse_f32_fast(tok) {
        return Some(v);
    }
    let s = std::str::from_utf8(tok).ok()?;
    let v: f32 = s.parse().ok()?;
    v.is_finite().then_some(v)
}

/// Parses an unsigned decimal integer (digits only).
pub fn parse_u64(tok: &[u8]) -> Option<u64> {
    if tok.is_empty() || tok.len() > 19 {
        return None;
    }
    let mut v = 0u64;
    for &b in tok {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u64::from(b - b'0');
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn floats() {
        for (t, v) in [
            ("1", 1.0),
            ("-1", -1.0),
            ("+1", 1.0),
            ("0.5", 0.5),
            ("-150", -150.0),
            ("1e-3", 1e-3),
            ("0.1", 0.1),
        ] {
            assert_eq!(parse_f32(t.as_bytes()), Some(v), "{t}");
        }
        for t in ["", "-", ".", "1.2.3", "nan", "inf", "-inf", "1e99", "0x10", "1,5"] {
            assert_eq!(parse_f32(t.as_bytes()), None, "{t}");
        }
    }

    proptest! {
        /// The fast path rounds exactly as the standard library does.
        #[test]
        fn fast_path_matches_std(m in 0u32..10_000_000, k in 0usize..11, neg: bool) {
            let digits = format!("{m:0>width$}", width = k + 1);
            let (int, frac) = digits.split_at(digits.len() - k);
            let text = format!("{}{int}{}{frac}", if neg { "-" } else { "" }, if k > 0 { "." } else { "" });
            let want: f32 = text.parse().expect("valid");
            prop_assert_eq!(parse_f32(text.as_bytes()), Some(want), "{}", text);
        }
    }
}
