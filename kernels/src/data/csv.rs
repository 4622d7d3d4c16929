//! CSV text (gzipped or not) to a dense multiclass dataset: one row per line, one column the
//! label, every other column a number.
//!
//! - Fields are separated by `,` (or the delimiter given); a field may be quoted with `"`, a
//!   doubled `""` inside quotes standing for one quote.
//! - A header line is recognised when a field of the first line other than the label's is not a
//!   number (or forced either way); the label column is named (needs the header) or numbered
//!   from 1, by default the column called `label`, `target`, `class` or `y`, else the last.
//! - Labels that are all whole numbers `0..C` are the classes themselves; any other labels
//!   become classes `0..C` in order, as [`CsvConverted::classes`] reports: by value when every
//!   label is a number (`-1` before `2` before `10`), else as text (`no` before `yes`). At most
//!   [`MAX_CLASSES`] classes: more is an error naming the file and the count.
//! - A missing value (an empty field, `NA`, `NaN`, `?`, `null`) or a field that is not a finite
//!   number is an error naming the file, line and column (and the column's header name), and so
//!   is a line with another number of fields. Nothing is written unless the whole file converts.

use std::collections::HashMap;
use std::path::Path;

use super::error::{DataError, Result};
use super::format::{Kind, Shape, Truth, Writer};
use super::text::{parse_error, parse_f32, Lines};

/// Whether the first line is a header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Header {
    /// A header if a field of the first line other than the label's is not a number.
    #[default]
    Auto,
    /// The first line is a header.
    Yes,
    /// The first line is data.
    No,
}

/// Which column holds the label.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LabelColumn {
    /// The column called `label`, `target`, `class` or `y` (any case), else the last.
    #[default]
    Auto,
    /// The column of this header name.
    Name(String),
    /// The column of this 1-based number.
    Number(usize),
}

/// How to read a CSV file.
#[derive(Clone, Debug)]
pub struct CsvOptions {
    /// Field delimiter.
    pub delimiter: u8,
    /// Whether the first line is a header.
    pub header: Header,
    /// The label column.
    pub label: LabelColumn,
}

impl Default for CsvOptions {
    fn default() -> Self {
        Self { delimiter: b',', header: Header::Auto, label: LabelColumn::Auto }
    }
}

/// What a CSV conversion found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsvConverted {
    /// Rows written.
    pub rows: u64,
    /// Feature columns.
    pub cols: u64,
    /// The label column (1-based) and its header name, if any.
    pub label: (usize, Option<String>),
    /// The classes' labels as written in the file, class 0 first.
    pub classes: Vec<String>,
}

/// The most classes a CSV file may have: labels `0..65535`, as the NumPy reader's whole-number
/// labels (a label column of many more distinct values holds measurements, not classes).
pub const MAX_CLASSES: usize = 1 << 16;

/// Labels that count as missing values.
const MISSING: [&str; 7] = ["", "na", "nan", "n/a", "?", "null", "none"];

/// The fields of `line`, as byte ranges (quotes removed later), or the column where a quoted
/// field is not closed.
fn split(line: &[u8], delimiter: u8, out: &mut Vec<(usize, usize)>) -> std::result::Result<(), usize> {
    out.clear();
    let mut i = 0;
    loop {
        let start = i;
        if line.get(i) == Some(&b'"') {
            i += 1;
            loop {
                match line.get(i) {
                    None => return Err(start),
                    Some(b'"') if line.get(i + 1) == Some(&b'"') => i += 2,
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(_) => i += 1,
                }
            }
            while i < line.len() && line[i] != delimiter {
                i += 1;
            }
        } else {
            while i < line.len() && line[i] != delimiter {
                i += 1;
            }
        }
        out.push((start, i));
        if i == line.len() {
            return Ok(());
        }
        i += 1;
    }
}

/// A field's text: trimmed, unquoted (`""` inside quotes is one quote).
fn field(line: &[u8], (a, b): (usize, usize)) -> String {
    let t = String::from_utf8_lossy(&line[a..b]);
    let t = t.trim();
    match t.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(inner) => inner.replace("\"\"", "\""),
        None => t.to_owned(),
    }
}

/// A feature value, or `None` if it is missing or not a finite number.
fn number(text: &str) -> Option<f32> {
    parse_f32(text.as_bytes()).filter(|v| v.is_finite())
}

/// One pass over the file: calls `row(line number, text, fields)` for every non-blank line, the
/// header included.
fn scan(
    path: &Path,
    delimiter: u8,
    mut row: impl FnMut(u64, &[u8], &[(usize, usize)]) -> Result<()>,
) -> Result<()> {
    let mut lines = Lines::new(path)?;
    let mut fields = Vec::new();
    while let Some((no, line)) = lines.next_line()? {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if let Err(at) = split(line, delimiter, &mut fields) {
            return Err(parse_error(path, no, line, at, "a closing quote"));
        }
        row(no, line, &fields)?;
    }
    Ok(())
}

/// The 0-based label column of `input`, whose first line has `width` fields, header `names` if
/// that line is one.
fn label_column(input: &Path, label: &LabelColumn, width: usize, names: Option<&[String]>) -> Result<usize> {
    match label {
        LabelColumn::Number(n) if (1..=width).contains(n) => Ok(n - 1),
        LabelColumn::Number(n) => Err(DataError::Invalid(format!(
            "{}: label column {n} does not exist: the first line has {width} columns",
            input.display()
        ))),
        LabelColumn::Name(name) => {
            let Some(names) = names else {
                return Err(DataError::Invalid(format!(
                    "{}: label column `{name}` named, but the first line is not a header",
                    input.display()
                )));
            };
            names.iter().position(|h| h == name).ok_or_else(|| {
                DataError::Invalid(format!(
                    "{}: no column `{name}` in the header ({})",
                    input.display(),
                    names.join(", ")
                ))
            })
        }
        LabelColumn::Auto => Ok(names
            .and_then(|n| {
                n.iter().position(|h| {
                    ["label", "target", "class", "y"].contains(&h.to_ascii_lowercase().as_str())
                })
            })
            .unwrap_or(width - 1)),
    }
}

/// Each row's class and the classes' labels, class 0 first (see the module's documentation), or
/// an error naming `input` if there are more than [`MAX_CLASSES`].
fn classes(input: &Path, labels: &[String]) -> Result<(Vec<u32>, Vec<String>)> {
    let numeric: Option<Vec<u32>> = labels.iter().map(|y| y.parse::<u32>().ok()).collect();
    if let Some(ys) = numeric.filter(|ys| ys.iter().all(|&y| (y as usize) < MAX_CLASSES)) {
        let c = ys.iter().max().map_or(0, |&m| m + 1);
        return Ok((ys, (0..c).map(|c| c.to_string()).collect()));
    }
    let mut distinct: Vec<&str> = labels.iter().map(String::as_str).collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() > MAX_CLASSES {
        return Err(DataError::format(
            input,
            format!(
                "{} distinct labels, more than the {MAX_CLASSES} classes supported (is the label column \
                 a measurement? --label chooses another column)",
                distinct.len()
            ),
        ));
    }
    let values: Option<Vec<f64>> =
        distinct.iter().map(|y| y.parse::<f64>().ok().filter(|v| v.is_finite())).collect();
    if let Some(values) = values {
        let mut by_value: Vec<(f64, &str)> = values.into_iter().zip(distinct).collect();
        by_value.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        distinct = by_value.into_iter().map(|(_, y)| y).collect();
    }
    let ids: HashMap<&str, u32> = distinct.iter().copied().zip(0..).collect();
    Ok((labels.iter().map(|y| ids[y.as_str()]).collect(), distinct.into_iter().map(str::to_owned).collect()))
}

/// Converts CSV `input` to a dense dataset at `output`.
pub fn convert(input: &Path, output: &Path, opts: &CsvOptions) -> Result<CsvConverted> {
    // First pass: the header, the label column, the labels, the row count.
    let mut names: Option<Vec<String>> = None;
    let mut width = 0usize;
    let mut label = 0usize;
    let mut labels: Vec<String> = Vec::new();
    let mut first = true;
    scan(input, opts.delimiter, |no, line, fields| {
        if first {
            first = false;
            width = fields.len();
            let texts: Vec<String> = fields.iter().map(|&f| field(line, f)).collect();
            let guess = |names| label_column(input, &opts.label, width, names);
            let header = match opts.header {
                Header::Yes => true,
                Header::No => false,
                Header::Auto => {
                    // A header unless every field but the label's (the last, or the one named)
                    // is a number.
                    let col = guess(Some(&texts)).unwrap_or(width - 1);
                    texts.iter().enumerate().any(|(i, t)| i != col && number(t).is_none())
                }
            };
            if header {
                label = guess(Some(&texts))?;
                names = Some(texts);
                return Ok(());
            }
            label = guess(None)?;
        }
        if fields.len() != width {
            let at = fields.get(width).map_or(line.len(), |f| f.0);
            return Err(parse_error(
                input,
                no,
                line,
                at,
                format!("{width} fields, as on the first line (found {})", fields.len()),
            ));
        }
        let y = field(line, fields[label]);
        if MISSING.contains(&y.to_ascii_lowercase().as_str()) {
            return Err(parse_error(input, no, line, fields[label].0, "a label (this one is missing)"));
        }
        labels.push(y);
        Ok(())
    })?;
    if labels.is_empty() {
        return Err(DataError::format(input, "no data rows"));
    }
    if width < 2 {
        return Err(DataError::format(input, "one column: a label and at least one feature are needed"));
    }
    let (ys, classes) = classes(input, &labels)?;
    if classes.len() < 2 {
        return Err(DataError::format(input, format!("one class only (`{}`): nothing to learn", classes[0])));
    }
    let (rows, cols) = (labels.len() as u64, (width - 1) as u64);
    let shape = Shape {
        kind: Kind::Dense,
        rows,
        cols,
        nnz: 0,
        classes: classes.len() as u32,
        users: 0,
        truth: Truth::None,
        scaled: false,
    };
    // Second pass: the features, checked as they are written.
    let mut w = Writer::create(output, shape)?;
    let mut values = vec![0f32; width - 1];
    let mut skip_header = names.is_some();
    scan(input, opts.delimiter, |no, line, fields| {
        if std::mem::take(&mut skip_header) {
            return Ok(());
        }
        let mut k = 0;
        for (i, &f) in fields.iter().enumerate() {
            if i == label {
                continue;
            }
            let text = field(line, f);
            values[k] = number(&text).ok_or_else(|| {
                let what = match &names {
                    Some(n) => format!("a number in column {} (`{}`)", i + 1, n[i]),
                    None => format!("a number in column {}", i + 1),
                };
                let missing = MISSING.contains(&text.to_ascii_lowercase().as_str());
                parse_error(
                    input,
                    no,
                    line,
                    f.0,
                    if missing { format!("{what}; this value is missing") } else { what },
                )
            })?;
            k += 1;
        }
        w.write(0, &values)
    })?;
    w.write(1, &ys)?;
    w.finish()?;
    Ok(CsvConverted { rows, cols, label: (label + 1, names.map(|n| n[label].clone())), classes })
}
