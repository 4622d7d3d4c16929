//! Bag-of-words text to a sparse dataset of word counts (topic models): one row per document,
//! one column per vocabulary word, the value the word's count in the document, labels 0.
//!
//! Two formats:
//! - **UCI docword** (the UCI "Bag of Words" sets: KOS, NIPS, Enron, NYTimes, PubMed): three
//!   header lines `D`, `W`, `NNZ`, then `docID wordID count` triples, IDs 1-based, grouped by
//!   document in increasing order (documents without words may be absent: they are written as
//!   empty rows), word IDs increasing within a document;
//! - **LDA-C** (Blei's `lda-c`, the `lda` package's `reuters.ldac`): one document per line,
//!   `N id:count id:count ...`, IDs 0-based, `N` the number of pairs.
//!
//! Counts must be whole numbers of at least 1. Gzipped input is read as is.

use std::path::Path;

use super::error::{DataError, Result};
use super::libsvm::{Converted, SparseText};
use super::text::{parse_error, parse_u64, Lines};

/// A bag-of-words format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// UCI `docword.*.txt`.
    Docword,
    /// Blei's LDA-C.
    Ldac,
}

/// Whitespace-separated tokens of `line` with their byte offsets.
fn tokens(line: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == line.len() {
            return None;
        }
        let start = i;
        while i < line.len() && !line[i].is_ascii_whitespace() {
            i += 1;
        }
        Some((start, &line[start..i]))
    })
}

/// Parses `input` in `format` into rows of (word, count).
pub fn parse(input: &Path, format: Format) -> Result<SparseText> {
    match format {
        Format::Docword => parse_docword(input),
        Format::Ldac => parse_ldac(input),
    }
}

/// Empty documents a docword header may name beyond its triples (each an empty row in memory).
pub const MAX_EMPTY_DOCUMENTS: u64 = 1 << 24;

fn parse_docword(path: &Path) -> Result<SparseText> {
    let mut lines = Lines::new(path)?;
    let mut header = [0u64; 3];
    let names = ["the document count D", "the vocabulary size W", "the count of triples NNZ"];
    for (k, h) in header.iter_mut().enumerate() {
        let Some((no, line)) = lines.next_line()? else {
            return Err(DataError::format(
                path,
                format!("ends before the header's line {} ({})", k + 1, names[k]),
            ));
        };
        let mut t = tokens(line);
        *h = match (t.next(), t.next()) {
            (Some((_, tok)), None) => {
                parse_u64(tok).ok_or_else(|| parse_error(path, no, line, 0, names[k]))?
            }
            _ => return Err(parse_error(path, no, line, 0, format!("one number, {}", names[k]))),
        };
    }
    let [docs, vocab, nnz] = header;
    if vocab == 0 || vocab > u64::from(u32::MAX) {
        return Err(DataError::format(
            path,
            format!("vocabulary size W = {vocab}: must be 1 to {}", u32::MAX),
        ));
    }
    // Documents without a triple become empty rows, held in memory: a header may not make more
    // of them than the file could ever hold rows for plus a bound (a D of 10^16 would otherwise
    // ask for petabytes before the triples are even read).
    if docs > nnz.saturating_add(MAX_EMPTY_DOCUMENTS) {
        return Err(DataError::format(
            path,
            format!(
                "document count D = {docs}: at most NNZ + {MAX_EMPTY_DOCUMENTS} (NNZ = {nnz}): no more than {MAX_EMPTY_DOCUMENTS} documents may be empty"
            ),
        ));
    }
    let mut out = SparseText { row_ptr: vec![0], max_index: vocab, ..SparseText::default() };
    let (mut doc, mut prev_word) = (0u64, 0u64);
    // Empty documents, counted before their rows are made: a header whose NNZ promises triples
    // the file does not have must not make the empty rows ask for memory that the check above
    // was there to refuse (D = 4 * 10^9, NNZ = 5.3 * 10^9 and no triple: 32 GB of rows).
    let mut empty = 0u64;
    let too_many_empty = |empty: u64, triples: usize| {
        DataError::format(
            path,
            format!(
                "document count D = {docs}: {empty} or more documents without a triple (the file has \
                 {triples} triples); no more than {MAX_EMPTY_DOCUMENTS} documents may be empty"
            ),
        )
    };
    while let Some((no, line)) = lines.next_line()? {
        let mut t = tokens(line);
        let Some((at, d)) = t.next() else { continue };
        let field = |tok: Option<(usize, &[u8])>, what: &str, max: u64| -> Result<u64> {
            let (a, tok) = tok.ok_or_else(|| parse_error(path, no, line, line.len(), what.to_string()))?;
            match parse_u64(tok) {
                Some(v) if (1..=max).contains(&v) => Ok(v),
                _ => Err(parse_error(path, no, line, a, format!("{what} (1 to {max})"))),
            }
        };
        let d = field(Some((at, d)), "a document ID", docs)?;
        let w = field(t.next(), "a word ID", vocab)?;
        let c = field(t.next(), "a count", u64::from(u32::MAX))?;
        if let Some((a, _)) = t.next() {
            return Err(parse_error(path, no, line, a, "the end of the line (docID wordID count)"));
        }
        if d < doc || (d == doc && w <= prev_word) {
            return Err(parse_error(
                path,
                no,
                line,
                at,
                "triples sorted by document, then by word (each word once per document)",
            ));
        }
        // Sorted (checked above): d >= doc, and the documents strictly between are empty.
        empty += (d - doc).saturating_sub(1);
        if empty > MAX_EMPTY_DOCUMENTS {
            return Err(too_many_empty(empty, out.indices.len()));
        }
        while doc < d {
            // Documents up to d - 1 end here (absent ones are empty).
            if doc > 0 {
                out.row_ptr.push(out.indices.len() as u64);
                out.labels.push(0.0);
            }
            doc += 1;
        }
        out.indices.push((w - 1) as u32);
        out.values.push(c as f32);
        prev_word = w;
    }
    if doc > 0 {
        out.row_ptr.push(out.indices.len() as u64);
        out.labels.push(0.0);
    }
    if empty + (docs - doc) > MAX_EMPTY_DOCUMENTS {
        return Err(too_many_empty(empty + (docs - doc), out.indices.len()));
    }
    while (out.labels.len() as u64) < docs {
        out.row_ptr.push(out.indices.len() as u64);
        out.labels.push(0.0);
    }
    if out.indices.len() as u64 != nnz {
        return Err(DataError::format(
            path,
            format!("the header says NNZ = {nnz} triples, the file has {}", out.indices.len()),
        ));
    }
    out.bytes = lines.bytes();
    Ok(out)
}

fn parse_ldac(path: &Path) -> Result<SparseText> {
    let mut lines = Lines::new(path)?;
    let mut out = SparseText { row_ptr: vec![0], ..SparseText::default() };
    while let Some((no, line)) = lines.next_line()? {
        let mut t = tokens(line);
        let Some((at, n)) = t.next() else { continue };
        let n =
            parse_u64(n).ok_or_else(|| parse_error(path, no, line, at, "the number of id:count pairs"))?;
        let (mut pairs, mut prev) = (0u64, None);
        for (a, tok) in t {
            let colon = tok
                .iter()
                .position(|&b| b == b':')
                .ok_or_else(|| parse_error(path, no, line, a, "id:count"))?;
            let id = parse_u64(&tok[..colon])
                .filter(|&v| v < u64::from(u32::MAX))
                .ok_or_else(|| parse_error(path, no, line, a, "a word id (0, 1, ...)"))?;
            let count = parse_u64(&tok[colon + 1..])
                .filter(|&c| (1..=u64::from(u32::MAX)).contains(&c))
                .ok_or_else(|| parse_error(path, no, line, a + colon + 1, "a count (a whole number >= 1)"))?;
            if prev.is_some_and(|p| id <= p) {
                return Err(parse_error(path, no, line, a, "word ids increasing within a document"));
            }
            prev = Some(id);
            out.indices.push(id as u32);
            out.values.push(count as f32);
            out.max_index = out.max_index.max(id + 1);
            pairs += 1;
        }
        if pairs != n {
            return Err(parse_error(
                path,
                no,
                line,
                at,
                format!("{n} pairs as the line says, found {pairs}"),
            ));
        }
        out.row_ptr.push(out.indices.len() as u64);
        out.labels.push(0.0);
    }
    out.bytes = lines.bytes();
    Ok(out)
}

/// Converts `input` to a sparse dataset of word counts at `output`. `vocabulary` fixes the
/// column count (an ID beyond it is an error); by default the header's W (docword) or the largest
/// ID + 1 (LDA-C).
pub fn convert(input: &Path, output: &Path, format: Format, vocabulary: Option<u64>) -> Result<Converted> {
    let t = parse(input, format)?;
    if t.labels.is_empty() {
        return Err(DataError::format(input, "no documents"));
    }
    let cols = t.columns(vocabulary, |v| {
        let whence = match format {
            Format::Docword => "the header's W",
            Format::Ldac => "the largest word ID + 1",
        };
        format!(
            "{}: its vocabulary has {} words ({whence}), more than --vocabulary {v}",
            input.display(),
            t.max_index
        )
    })?;
    t.write(output, cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    #[test]
    fn docword_and_ldac_give_the_same_counts() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Document 2 has no words; word IDs 1-based in docword, 0-based in LDA-C.
        let uci = write(dir.path(), "docword.txt", "3\n5\n4\n1 1 2\n1 4 1\n3 2 3\n3 5 1\n");
        let ldac = write(dir.path(), "c.ldac", "2 0:2 3:1\n0\n2 1:3 4:1\n");
        let a = parse(&uci, Format::Docword).expect("docword");
        let b = parse(&ldac, Format::Ldac).expect("ldac");
        assert_eq!(a.row_ptr, vec![0, 2, 2, 4]);
        assert_eq!((&a.row_ptr, &a.indices, &a.values), (&b.row_ptr, &b.indices, &b.values));
        assert_eq!((a.max_index, b.max_index), (5, 5));
        let out = dir.path().join("c.pgd");
        let c = convert(&uci, &out, Format::Docword, None).expect("convert");
        assert_eq!((c.rows, c.cols, c.nnz), (3, 5, 4));
        // A smaller vocabulary than the header's W (whatever IDs the triples use) is refused,
        // naming where the size comes from; a larger one widens the columns.
        let e = convert(&uci, &dir.path().join("n.pgd"), Format::Docword, Some(4)).expect_err("narrower");
        assert!(
            e.to_string().contains("vocabulary has 5 words (the header's W), more than --vocabulary 4"),
            "{e}"
        );
        assert!(!dir.path().join("n.pgd").exists());
        let e = convert(&ldac, &dir.path().join("n.pgd"), Format::Ldac, Some(4)).expect_err("narrower");
        assert!(e.to_string().contains("5 words (the largest word ID + 1)"), "{e}");
        let c = convert(&ldac, &out, Format::Ldac, Some(9)).expect("wider");
        assert_eq!(c.cols, 9);
    }

    #[test]
    fn bad_bag_of_words_files_name_line_and_what() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, text, format, want) in [
            ("h.txt", "3\n5\n", Format::Docword, "ends before the header's line 3"),
            ("w.txt", "1\n5\n1\n1 6 1\n", Format::Docword, "a word ID (1 to 5)"),
            ("c.txt", "1\n5\n1\n1 2 0\n", Format::Docword, "a count (1 to"),
            ("o.txt", "2\n5\n2\n2 1 1\n1 1 1\n", Format::Docword, "sorted by document"),
            ("n.txt", "1\n5\n2\n1 1 1\n", Format::Docword, "NNZ = 2 triples, the file has 1"),
            // Found by fuzzing: a header naming 4 * 10^16 documents and no triples asked for the
            // empty rows' memory before reading anything.
            (
                "d.txt",
                "39999999999999992\n4\n0\n",
                Format::Docword,
                "no more than 16777216 documents may be empty",
            ),
            // Found by fuzzing: a header whose NNZ promises the triples that would make its D
            // plausible, and no triples (32 GB of empty rows), or one at the last document.
            (
                "e.txt",
                "3999999999\n59999\n5333999993\n",
                Format::Docword,
                "3999999999 or more documents without a triple (the file has 0 triples); no more than 16777216",
            ),
            (
                "f.txt",
                "3999999999\n5\n5333999993\n3999999999 1 1\n",
                Format::Docword,
                "3999999998 or more documents without a triple (the file has 0 triples)",
            ),
            ("p.ldac", "2 0:1\n", Format::Ldac, "2 pairs as the line says, found 1"),
            ("i.ldac", "2 3:1 1:1\n", Format::Ldac, "increasing"),
            ("x.ldac", "1 3:x\n", Format::Ldac, "a count"),
        ] {
            let p = write(dir.path(), name, text);
            let e = parse(&p, format).expect_err(name).to_string();
            assert!(e.contains(want), "{name}: {e}");
            assert!(e.contains(name), "{name}: names the file: {e}");
        }
    }
}
