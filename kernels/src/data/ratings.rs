//! Ratings text (`user item rating [timestamp]`, e.g. MovieLens) to a ratings dataset.
//!
//! Fields are separated by tabs, spaces, commas or `::`; a first line whose first field is not a
//! number is a header and skipped (`user_id:token item_id:token rating:float ...`). User and item
//! ids are non-negative integers kept as they are (so 1-based ids leave id 0 unused): the dataset's
//! user and item counts are the largest ids + 1. Ratings must be finite; a timestamp, if present,
//! is ignored.

use std::path::Path;

use super::error::{DataError, Result};
use super::format::{Kind, Shape, Truth, Writer};
use super::libsvm::Converted;
use super::text::{parse_error, parse_f32, parse_u64, Lines};

/// Splits a line into (start, end) fields.
fn fields(line: &[u8], out: &mut Vec<(usize, usize)>) {
    out.clear();
    let mut i = 0;
    let n = line.len();
    while i < n {
        // Skip separators: whitespace, commas, "::".
        while i < n
            && (line[i] == b' '
                || line[i] == b'\t'
                || line[i] == b','
                || (line[i] == b':' && line.get(i + 1) == Some(&b':')))
        {
            i += if line[i] == b':' { 2 } else { 1 };
        }
        if i >= n {
            break;
        }
        let s = i;
        while i < n
            && line[i] != b' '
            && line[i] != b'\t'
            && line[i] != b','
            && !(line[i] == b':' && line.get(i + 1) == Some(&b':'))
        {
            i += 1;
        }
        out.push((s, i));
    }
}

/// Converts `input` to a ratings dataset at `output`.
pub fn convert(input: &Path, output: &Path) -> Result<Converted> {
    let mut lines = Lines::new(input)?;
    let (mut users, mut items, mut ratings) = (Vec::new(), Vec::new(), Vec::new());
    let mut f = Vec::with_capacity(4);
    let mut first = true;
    while let Some((no, line)) = lines.next_line()? {
        fields(line, &mut f);
        if f.is_empty() {
            continue;
        }
        if std::mem::take(&mut first) && parse_f32(&line[f[0].0..f[0].1]).is_none() {
            continue; // header
        }
        if f.len() < 3 {
            let at = f.last().map_or(0, |l| l.1);
            return Err(parse_error(input, no, line, at, "user item rating [timestamp]"));
        }
        if f.len() > 4 {
            return Err(parse_error(
                input,
                no,
                line,
                f[4].0,
                "at most 4 fields (user item rating timestamp)",
            ));
        }
        let id = |k: usize, what: &str| {
            parse_u64(&line[f[k].0..f[k].1])
                .filter(|&v| v < u64::from(u32::MAX))
                .map(|v| v as u32)
                .ok_or_else(|| {
                    parse_error(input, no, line, f[k].0, format!("a {what} id (a non-negative integer)"))
                })
        };
        users.push(id(0, "user")?);
        items.push(id(1, "item")?);
        ratings.push(
            parse_f32(&line[f[2].0..f[2].1])
                .ok_or_else(|| parse_error(input, no, line, f[2].0, "a finite rating"))?,
        );
    }
    if ratings.is_empty() {
        return Err(DataError::format(input, "no ratings"));
    }
    let n_users = u64::from(*users.iter().max().unwrap_or(&0)) + 1;
    let n_items = u64::from(*items.iter().max().unwrap_or(&0)) + 1;
    let shape = Shape {
        kind: Kind::Ratings,
        rows: ratings.len() as u64,
        cols: n_items,
        nnz: 0,
        classes: 0,
        users: n_users,
        truth: Truth::None,
        scaled: false,
    };
    let mut w = Writer::create(output, shape)?;
    w.write(0, &users)?;
    w.write(1, &items)?;
    w.write(2, &ratings)?;
    w.finish()?;
    Ok(Converted { rows: shape.rows, cols: n_items, nnz: shape.rows, input_bytes: lines.bytes() })
}
