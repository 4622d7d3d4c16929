//! Hostlist expansion and compression, as Slurm writes node lists: `node[01-04,7],gpu[1-2]`.

use std::fmt::Write as _;

use crate::error::{Error, HostlistProblem, MAX_EXPANDED_BYTES, MAX_HOSTS};

/// A hostlist error before it knows the whole list and where the list came from.
#[derive(Debug)]
pub(crate) struct Fail {
    position: usize,
    text: String,
    problem: HostlistProblem,
}

impl Fail {
    fn new(position: usize, text: impl Into<String>, problem: HostlistProblem) -> Self {
        Self { position, text: text.into(), problem }
    }

    pub(crate) fn into_error(self, list: &str, variable: Option<&'static str>) -> Error {
        Error::Hostlist {
            variable,
            list: list.to_owned(),
            position: self.position,
            text: self.text,
            problem: self.problem,
        }
    }
}

/// Expands a Slurm hostlist into host names, in order, keeping duplicates (as
/// `scontrol show hostnames` does).
///
/// Elements are separated by commas outside brackets, with optional whitespace around them. A
/// bracket group holds comma-separated numbers and `low-high` ranges; numbers are zero-padded to
/// the width of the range's lower bound as written (`n[08-11]` gives `n08 n09 n10 n11`,
/// `n[8-11]` gives `n8 n9 n10 n11`). Text may follow a group (`c[1-2]-ib`) and a name may hold
/// several groups, the leftmost varying slowest (`r[1-2]n[1-2]` gives `r1n1 r1n2 r2n1 r2n2`).
///
/// # Errors
///
/// [`Error::Hostlist`] with the byte position and offending text for: an empty list or empty
/// element, unbalanced or nested brackets, an empty or descending range, a non-digit or a number
/// over 64 bits in a range, whitespace inside a name, or more than [`MAX_HOSTS`] hosts (or
/// [`MAX_EXPANDED_BYTES`] bytes of names) in total.
///
/// ```
/// let hosts = peregrine_slurm::expand("node[01-02,7],login")?;
/// assert_eq!(hosts, ["node01", "node02", "node7", "login"]);
/// # Ok::<(), peregrine_slurm::Error>(())
/// ```
pub fn expand(list: &str) -> Result<Vec<String>, Error> {
    expand_inner(list).map_err(|f| f.into_error(list, None))
}

/// [`expand`] for the value of an environment variable: errors name the variable.
pub(crate) fn expand_var(variable: &'static str, list: &str) -> Result<Vec<String>, Error> {
    expand_inner(list).map_err(|f| f.into_error(list, Some(variable)))
}

/// One bracket range: `lo..=hi`, printed zero-padded to `width` digits.
#[derive(Debug)]
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

impl Range {
    fn len(&self) -> u64 {
        // Never overflows: ranges wider than MAX_HOSTS are rejected when parsed.
        self.hi - self.lo + 1
    }
}

/// A piece of one hostlist element: literal text or a bracket group.
#[derive(Debug)]
enum Segment<'a> {
    Literal(&'a str),
    Group(Vec<Range>),
}

fn expand_inner(list: &str) -> Result<Vec<String>, Fail> {
    if list.trim().is_empty() {
        return Err(Fail::new(0, list, HostlistProblem::EmptyList));
    }
    let mut elements = Vec::new();
    let mut hosts: u64 = 0;
    let mut bytes: u64 = 0;
    for (start, raw) in split_top(list)? {
        let trimmed_start = raw.trim_start();
        let element = trimmed_start.trim_end();
        if element.is_empty() {
            return Err(Fail::new(start, "", HostlistProblem::EmptyElement));
        }
        let position = start + (raw.len() - trimmed_start.len());
        let segments = parse_element(element, position)?;
        let (count, longest) = element_size(&segments);
        hosts = hosts.saturating_add(count);
        if hosts > MAX_HOSTS as u64 {
            return Err(Fail::new(position, element, HostlistProblem::TooManyHosts { count: hosts }));
        }
        bytes = bytes.saturating_add(count.saturating_mul(longest));
        if bytes > MAX_EXPANDED_BYTES as u64 {
            return Err(Fail::new(position, element, HostlistProblem::TooLong { bytes }));
        }
        elements.push(segments);
    }
    // Bounded by MAX_HOSTS above.
    let mut out = Vec::with_capacity(usize::try_from(hosts).unwrap_or(MAX_HOSTS));
    for segments in &elements {
        generate(segments, &mut out);
    }
    Ok(out)
}

/// Splits `list` at commas outside brackets, returning each piece with its byte offset, and
/// checks that brackets balance and do not nest.
fn split_top(list: &str) -> Result<Vec<(usize, &str)>, Fail> {
    let mut pieces = Vec::new();
    let mut open: Option<usize> = None;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' => match open {
                Some(o) => return Err(Fail::new(i, &list[o..=i], HostlistProblem::NestedBracket)),
                None => open = Some(i),
            },
            ']' => match open {
                Some(_) => open = None,
                None => return Err(Fail::new(i, "]", HostlistProblem::UnmatchedBracket)),
            },
            ',' if open.is_none() => {
                pieces.push((start, &list[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    if let Some(o) = open {
        return Err(Fail::new(o, &list[o..], HostlistProblem::UnclosedBracket));
    }
    pieces.push((start, &list[start..]));
    Ok(pieces)
}

/// Parses one trimmed, non-empty element starting at byte `base` of the list.
fn parse_element(element: &str, base: usize) -> Result<Vec<Segment<'_>>, Fail> {
    let mut segments = Vec::new();
    let mut literal_start = 0;
    let mut chars = element.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '[' => {
                if literal_start < i {
                    segments.push(Segment::Literal(&element[literal_start..i]));
                }
                // split_top checked that brackets balance and do not nest, but stay defensive.
                let Some(close) = element[i..].find(']').map(|k| i + k) else {
                    return Err(Fail::new(base + i, &element[i..], HostlistProblem::UnclosedBracket));
                };
                let group = &element[i..=close];
                segments.push(Segment::Group(parse_group(group, base + i)?));
                literal_start = close + 1;
                // Skip the group's characters.
                for (j, _) in chars.by_ref() {
                    if j == close {
                        break;
                    }
                }
            }
            ']' => return Err(Fail::new(base + i, "]", HostlistProblem::UnmatchedBracket)),
            c if c.is_whitespace() => {
                return Err(Fail::new(base + i, c.to_string(), HostlistProblem::Whitespace));
            }
            _ => {}
        }
    }
    if literal_start < element.len() {
        segments.push(Segment::Literal(&element[literal_start..]));
    }
    Ok(segments)
}

/// Parses a bracket group `[...]` (brackets included) starting at byte `base` of the list.
fn parse_group(group: &str, base: usize) -> Result<Vec<Range>, Fail> {
    let inner = &group[1..group.len() - 1];
    if let Some(k) = inner.find('[') {
        return Err(Fail::new(base + 1 + k, group, HostlistProblem::NestedBracket));
    }
    if inner.is_empty() {
        return Err(Fail::new(base, group, HostlistProblem::EmptyRange));
    }
    let mut ranges = Vec::new();
    let mut offset = 1; // byte offset of the current part within `group`
    for part in inner.split(',') {
        let at = base + offset;
        // The character after the part: ',' or the closing ']'.
        let next = group[offset + part.len()..].chars().next().unwrap_or(']');
        offset += part.len() + 1;
        if part.is_empty() {
            return Err(Fail::new(at, group, HostlistProblem::EmptyRange));
        }
        let (lo_str, hi_str, hi_at) = match part.split_once('-') {
            Some((lo, hi)) => (lo, Some(hi), at + lo.len() + 1),
            None => (part, None, 0),
        };
        let lo = number(lo_str, at, if hi_str.is_some() { '-' } else { next }, part)?;
        let hi = match hi_str {
            Some(h) => number(h, hi_at, next, part)?,
            None => lo,
        };
        if lo > hi {
            return Err(Fail::new(at, part, HostlistProblem::DescendingRange { low: lo, high: hi }));
        }
        if hi - lo >= MAX_HOSTS as u64 {
            let count = (hi - lo).saturating_add(1);
            return Err(Fail::new(at, part, HostlistProblem::TooManyHosts { count }));
        }
        ranges.push(Range { lo, hi, width: lo_str.len() });
    }
    Ok(ranges)
}

/// Parses the digits `s` found at byte `at` of the list; `next` is the character after them, the
/// one reported when `s` is empty.
fn number(s: &str, at: usize, next: char, part: &str) -> Result<u64, Fail> {
    if s.is_empty() {
        return Err(Fail::new(at, part, HostlistProblem::ExpectedDigit { found: next }));
    }
    if let Some((k, c)) = s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        return Err(Fail::new(at + k, part, HostlistProblem::ExpectedDigit { found: c }));
    }
    s.parse().map_err(|_| Fail::new(at, s, HostlistProblem::NumberTooLarge))
}

/// How many hosts an element names and the length of its longest host name, both saturating.
fn element_size(segments: &[Segment<'_>]) -> (u64, u64) {
    let mut count: u64 = 1;
    let mut longest: u64 = 0;
    for segment in segments {
        match segment {
            Segment::Literal(s) => longest = longest.saturating_add(s.len() as u64),
            Segment::Group(ranges) => {
                let n = ranges.iter().fold(0u64, |n, r| n.saturating_add(r.len()));
                count = count.saturating_mul(n);
                let widest = ranges.iter().map(|r| r.width.max(digits(r.hi)) as u64).max().unwrap_or(0);
                longest = longest.saturating_add(widest);
            }
        }
    }
    (count, longest)
}

fn digits(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 10 {
        v /= 10;
        n += 1;
    }
    n
}

/// Appends every host an element names, the leftmost group varying slowest.
fn generate(segments: &[Segment<'_>], out: &mut Vec<String>) {
    // Each segment's choices, formatted once; then an odometer over them (no recursion, so no
    // stack depth proportional to the number of groups).
    let choices: Vec<Vec<String>> = segments
        .iter()
        .map(|s| match s {
            Segment::Literal(text) => vec![(*text).to_owned()],
            Segment::Group(ranges) => {
                let mut v = Vec::new();
                for r in ranges {
                    for n in r.lo..=r.hi {
                        v.push(format!("{n:0width$}", width = r.width));
                    }
                }
                v
            }
        })
        .collect();
    let mut index = vec![0usize; choices.len()];
    loop {
        let mut host = String::new();
        for (c, &i) in choices.iter().zip(&index) {
            host.push_str(&c[i]);
        }
        out.push(host);
        // Advance the odometer from the right.
        let mut k = choices.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            index[k] += 1;
            if index[k] < choices[k].len() {
                break;
            }
            index[k] = 0;
        }
    }
}

/// A host name split around its last run of digits.
struct Numbered<'a> {
    prefix: &'a str,
    digits: &'a str,
    value: u64,
    suffix: &'a str,
}

fn split_number(host: &str) -> Option<Numbered<'_>> {
    let bytes = host.as_bytes();
    let end = bytes.iter().rposition(u8::is_ascii_digit)? + 1;
    let start = bytes[..end].iter().rposition(|b| !b.is_ascii_digit()).map_or(0, |p| p + 1);
    let digits = &host[start..end];
    let value = digits.parse().ok()?;
    Some(Numbered { prefix: &host[..start], digits, value, suffix: &host[end..] })
}

/// Compresses host names into a Slurm hostlist, for display: consecutive hosts that differ only
/// in their last number (same prefix, same suffix, same zero padding) become one bracket group of
/// ranges, `node01,node02,node03,node7` giving `node[01-03,7]`.
///
/// Order and duplicates are kept, so `expand(&compress(hosts))` gives back `hosts` whenever
/// every host is non-empty and free of whitespace, commas and brackets. An empty slice gives an
/// empty string (which [`expand`] rejects).
///
/// ```
/// let hosts: Vec<String> = ["n08", "n09", "n10", "n12", "login"].map(String::from).to_vec();
/// assert_eq!(peregrine_slurm::compress(&hosts), "n[08-10,12],login");
/// ```
pub fn compress(hosts: &[String]) -> String {
    struct Group<'a> {
        prefix: &'a str,
        suffix: &'a str,
        /// `(lo, hi, width)`, in order.
        ranges: Vec<(u64, u64, usize)>,
    }

    fn flush(group: Option<Group<'_>>, out: &mut Vec<String>) {
        let Some(g) = group else { return };
        let mut s = String::from(g.prefix);
        match g.ranges.as_slice() {
            [(lo, hi, width)] if lo == hi => {
                let _ = write!(s, "{lo:0width$}");
            }
            ranges => {
                s.push('[');
                for (k, (lo, hi, width)) in ranges.iter().enumerate() {
                    if k > 0 {
                        s.push(',');
                    }
                    let _ = write!(s, "{lo:0width$}");
                    if hi != lo {
                        let _ = write!(s, "-{hi:0width$}");
                    }
                }
                s.push(']');
            }
        }
        s.push_str(g.suffix);
        out.push(s);
    }

    let mut out = Vec::new();
    let mut current: Option<Group<'_>> = None;
    for host in hosts {
        let Some(n) = split_number(host) else {
            flush(current.take(), &mut out);
            out.push(host.clone());
            continue;
        };
        if let Some(g) = current.as_mut().filter(|g| g.prefix == n.prefix && g.suffix == n.suffix) {
            if let Some(last) = g.ranges.last_mut() {
                let (_, hi, width) = *last;
                // Extends the range only if expand would print this number exactly as written.
                if hi.checked_add(1) == Some(n.value) && format!("{:0width$}", n.value) == n.digits {
                    last.1 = n.value;
                    continue;
                }
            }
            g.ranges.push((n.value, n.value, n.digits.len()));
            continue;
        }
        flush(current.take(), &mut out);
        current = Some(Group {
            prefix: n.prefix,
            suffix: n.suffix,
            ranges: vec![(n.value, n.value, n.digits.len())],
        });
    }
    flush(current, &mut out);
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(list: &str) -> Vec<String> {
        match expand(list) {
            Ok(v) => v,
            Err(e) => panic!("expand({list:?}) failed: {e}"),
        }
    }

    /// The error's (position, text, problem).
    fn err(list: &str) -> (usize, String, HostlistProblem) {
        match expand(list) {
            Ok(v) => panic!("expand({list:?}) should fail, gave {v:?}"),
            Err(Error::Hostlist { variable, list: l, position, text, problem }) => {
                assert_eq!(variable, None);
                assert_eq!(l, list);
                (position, text, problem)
            }
            Err(e) => panic!("expand({list:?}): unexpected error {e:?}"),
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn ranges_and_single_numbers() {
        assert_eq!(
            ok("node[01-04,7],gpu[1-2]"),
            ["node01", "node02", "node03", "node04", "node7", "gpu1", "gpu2"]
        );
    }

    #[test]
    fn padding_follows_the_lower_bound() {
        assert_eq!(ok("n[08-11]"), ["n08", "n09", "n10", "n11"]);
        assert_eq!(ok("n[8-11]"), ["n8", "n9", "n10", "n11"]);
        assert_eq!(ok("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(ok("n[0-1]"), ["n0", "n1"]);
        assert_eq!(ok("n[9-10,007]"), ["n9", "n10", "n007"]);
    }

    #[test]
    fn plain_names_and_whitespace_around_commas() {
        assert_eq!(ok("login1,login2"), ["login1", "login2"]);
        assert_eq!(ok("  a , b[1-2] ,\tc  "), ["a", "b1", "b2", "c"]);
        assert_eq!(ok("solo"), ["solo"]);
        assert_eq!(ok("a,a"), ["a", "a"]);
    }

    #[test]
    fn several_groups_leftmost_slowest() {
        assert_eq!(ok("rack[1-2]-node[1-2]"), ["rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"]);
        assert_eq!(ok("[1-2][7,9]"), ["17", "19", "27", "29"]);
    }

    #[test]
    fn suffix_after_bracket() {
        assert_eq!(ok("c[1-2]-ib"), ["c1-ib", "c2-ib"]);
        assert_eq!(ok("c[1-2]-ib,d3"), ["c1-ib", "c2-ib", "d3"]);
        assert_eq!(ok("[3]x"), ["3x"]);
    }

    #[test]
    fn empty_list() {
        assert_eq!(err(""), (0, String::new(), HostlistProblem::EmptyList));
        assert_eq!(err("  "), (0, "  ".to_owned(), HostlistProblem::EmptyList));
    }

    #[test]
    fn empty_element() {
        assert_eq!(err("a,,b"), (2, String::new(), HostlistProblem::EmptyElement));
        assert_eq!(err("a, ,b"), (2, String::new(), HostlistProblem::EmptyElement));
        assert_eq!(err("a,"), (2, String::new(), HostlistProblem::EmptyElement));
        assert_eq!(err(",a"), (0, String::new(), HostlistProblem::EmptyElement));
    }

    #[test]
    fn unbalanced_brackets() {
        assert_eq!(err("n[1-2"), (1, "[1-2".to_owned(), HostlistProblem::UnclosedBracket));
        assert_eq!(err("a,n[1-2,b"), (3, "[1-2,b".to_owned(), HostlistProblem::UnclosedBracket));
        assert_eq!(err("n1-2]"), (4, "]".to_owned(), HostlistProblem::UnmatchedBracket));
        assert_eq!(err("n[1-2]]"), (6, "]".to_owned(), HostlistProblem::UnmatchedBracket));
    }

    #[test]
    fn nested_brackets() {
        assert_eq!(err("n[1[2]]"), (3, "[1[".to_owned(), HostlistProblem::NestedBracket));
    }

    #[test]
    fn empty_range() {
        assert_eq!(err("n[]"), (1, "[]".to_owned(), HostlistProblem::EmptyRange));
        assert_eq!(err("n[1,]"), (4, "[1,]".to_owned(), HostlistProblem::EmptyRange));
        assert_eq!(err("n[,1]"), (2, "[,1]".to_owned(), HostlistProblem::EmptyRange));
    }

    #[test]
    fn descending_range() {
        assert_eq!(
            err("node[5-3]"),
            (5, "5-3".to_owned(), HostlistProblem::DescendingRange { low: 5, high: 3 })
        );
        assert_eq!(
            err("a,node[1,10-09]"),
            (9, "10-09".to_owned(), HostlistProblem::DescendingRange { low: 10, high: 9 })
        );
    }

    #[test]
    fn non_digit_in_range() {
        assert_eq!(err("n[a-3]"), (2, "a-3".to_owned(), HostlistProblem::ExpectedDigit { found: 'a' }));
        assert_eq!(err("n[1-3x]"), (5, "1-3x".to_owned(), HostlistProblem::ExpectedDigit { found: 'x' }));
        assert_eq!(err("n[1-]"), (4, "1-".to_owned(), HostlistProblem::ExpectedDigit { found: ']' }));
        assert_eq!(err("n[1-,2]"), (4, "1-".to_owned(), HostlistProblem::ExpectedDigit { found: ',' }));
        assert_eq!(err("n[-3]"), (2, "-3".to_owned(), HostlistProblem::ExpectedDigit { found: '-' }));
        assert_eq!(err("n[1-2-3]"), (5, "1-2-3".to_owned(), HostlistProblem::ExpectedDigit { found: '-' }));
        assert_eq!(err("n[ 1]"), (2, " 1".to_owned(), HostlistProblem::ExpectedDigit { found: ' ' }));
        assert_eq!(err("n[é]"), (2, "é".to_owned(), HostlistProblem::ExpectedDigit { found: 'é' }));
    }

    #[test]
    fn number_too_large() {
        assert_eq!(
            err("n[1-99999999999999999999]"),
            (4, "99999999999999999999".to_owned(), HostlistProblem::NumberTooLarge)
        );
    }

    #[test]
    fn too_many_hosts() {
        assert_eq!(
            err("n[1-1000001]"),
            (2, "1-1000001".to_owned(), HostlistProblem::TooManyHosts { count: 1_000_001 })
        );
        assert_eq!(
            err("n[0-18446744073709551615]"),
            (2, "0-18446744073709551615".to_owned(), HostlistProblem::TooManyHosts { count: u64::MAX })
        );
        // Each group is small; their product is not.
        assert_eq!(
            err("n[1-1000][1-1001]"),
            (0, "n[1-1000][1-1001]".to_owned(), HostlistProblem::TooManyHosts { count: 1_001_000 })
        );
        // Each element is small; their sum is not.
        assert_eq!(
            err("a[1-600000],b[1-400001]"),
            (12, "b[1-400001]".to_owned(), HostlistProblem::TooManyHosts { count: 1_000_001 })
        );
        // Exactly the limit is fine.
        assert_eq!(ok("n[1-1000000]").len(), MAX_HOSTS);
    }

    #[test]
    fn too_long() {
        let list = format!("{}[1-1000]", "x".repeat(70_000));
        let (position, _, problem) = err(&list);
        assert_eq!(position, 0);
        assert_eq!(problem, HostlistProblem::TooLong { bytes: 1000 * 70_004 });
    }

    #[test]
    fn whitespace_inside_a_name() {
        assert_eq!(err("a b"), (1, " ".to_owned(), HostlistProblem::Whitespace));
        assert_eq!(err("x, n[1-2] y"), (9, " ".to_owned(), HostlistProblem::Whitespace));
    }

    #[test]
    fn many_groups_do_not_recurse() {
        let list = "[1]".repeat(50_000);
        assert_eq!(ok(&list), ["1".repeat(50_000)]);
    }

    #[test]
    fn error_message_names_text_and_position() {
        let e = expand("node[5-3]").err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("invalid hostlist \"node[5-3]\" at byte 5 (\"5-3\"): descending range 5-3 (expected low <= high)")
        );
        let e = expand_var("SLURM_JOB_NODELIST", "n[1").err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("SLURM_JOB_NODELIST: invalid hostlist \"n[1\" at byte 1 (\"[1\"): '[' is never closed (expected ']')")
        );
    }

    #[test]
    fn compress_examples() {
        let c = |v: &[&str]| compress(&strings(v));
        assert_eq!(c(&[]), "");
        assert_eq!(
            c(&["node01", "node02", "node03", "node04", "node7", "gpu1", "gpu2"]),
            "node[01-04,7],gpu[1-2]"
        );
        assert_eq!(c(&["n8", "n9", "n10", "n11"]), "n[8-11]");
        assert_eq!(c(&["n08", "n09", "n10", "n11"]), "n[08-11]");
        // Padding changes break ranges.
        assert_eq!(c(&["n9", "n010"]), "n[9,010]");
        assert_eq!(c(&["n09", "n10", "n011"]), "n[09-10,011]");
        assert_eq!(c(&["login1"]), "login1");
        assert_eq!(c(&["login", "n1", "n3", "n2"]), "login,n[1,3,2]");
        assert_eq!(c(&["c1-ib", "c2-ib", "c3"]), "c[1-2]-ib,c3");
        assert_eq!(c(&["rack1-node1", "rack1-node2", "rack2-node1"]), "rack1-node[1-2],rack2-node1");
        assert_eq!(c(&["n1", "n1"]), "n[1,1]");
        // Numbers past 64 bits stay as written.
        assert_eq!(c(&["n99999999999999999999"]), "n99999999999999999999");
        assert_eq!(
            c(&["n18446744073709551614", "n18446744073709551615"]),
            "n[18446744073709551614-18446744073709551615]"
        );
    }

    fn host() -> impl Strategy<Value = String> {
        let prefix = prop::sample::select(vec!["n", "node", "gpu", "rack1-n", "", "x9y"]);
        let suffix = prop::sample::select(vec!["", "-ib", "a"]);
        prop_oneof![
            4 => (prefix, 0u64..40, 0usize..4, suffix)
                .prop_map(|(p, n, w, s)| format!("{p}{n:0w$}{s}")),
            1 => "[a-z][a-z._-]{0,6}",
        ]
    }

    proptest! {
        #[test]
        fn expand_inverts_compress(hosts in prop::collection::vec(host(), 1..40)) {
            let list = compress(&hosts);
            prop_assert_eq!(expand(&list).ok(), Some(hosts), "list {:?}", list);
        }

        #[test]
        fn expand_inverts_compress_sorted_unique(mut hosts in prop::collection::vec(host(), 1..60)) {
            hosts.sort();
            hosts.dedup();
            let list = compress(&hosts);
            prop_assert_eq!(expand(&list).ok(), Some(hosts), "list {:?}", list);
        }

        #[test]
        fn compress_inverts_expand_of_ranges(start in 0u64..1000, len in 1u64..50, width in 1usize..5) {
            let hosts: Vec<String> = (start..start + len).map(|n| format!("h{n:0width$}")).collect();
            let list = compress(&hosts);
            if len > 1 {
                prop_assert_eq!(list.matches('[').count(), 1, "list {:?}", list);
            }
            prop_assert_eq!(expand(&list).ok(), Some(hosts));
        }

        #[test]
        fn expand_never_panics(list in "[a-c0-9,\\[\\]\\- ]{0,20}") {
            let _ = expand(&list);
        }
    }
}
