//! Per-rank timelines in the Chrome Trace Event format (what Perfetto and `chrome://tracing`
//! open): one process per rank, one track per thread (the rank's loop, then its compute
//! threads).
//!
//! Every thread appends its events to its own buffer (the loop to the rank's, a compute thread
//! to its slot's, no lock shared between threads); once per iteration the loop formats them, one
//! JSON object per line, into the rank's file ([`Config::trace`](super::Config::trace)): memory
//! holds one iteration's events whatever the run's length. (A writer thread was tried: on a
//! machine whose cores all compute it costs more than it saves.) Consecutive chunks a thread
//! computes are one event. The launcher joins the ranks' files into one `trace.json`.
//!
//! Time is microseconds since an origin every rank takes when leaving the same barrier at the
//! start of training, so the ranks' tracks line up to within the spread of the barrier's exits
//! (measured with a second barrier and written as metadata, `barrier_exit_spread_us`).

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// A value of an event's argument.
#[derive(Clone, Copy, Debug)]
pub(super) enum Val {
    Int(i64),
    Num(f64),
    Str(&'static str),
}

/// An event's arguments (at most four: no allocation per event).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Args {
    n: usize,
    kv: [(&'static str, Option<Val>); 4],
}

impl Args {
    pub fn with(mut self, key: &'static str, v: Val) -> Self {
        if self.n < self.kv.len() {
            self.kv[self.n] = (key, Some(v));
            self.n += 1;
        }
        self
    }

    pub fn int(self, key: &'static str, v: impl TryInto<i64>) -> Self {
        self.with(key, Val::Int(v.try_into().unwrap_or(i64::MAX)))
    }

    pub fn num(self, key: &'static str, v: f64) -> Self {
        self.with(key, Val::Num(v))
    }

    pub fn str(self, key: &'static str, v: &'static str) -> Self {
        self.with(key, Val::Str(v))
    }
}

/// One event: a span (`X`), an instant (`i`) or a counter (`C`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Event {
    name: &'static str,
    cat: &'static str,
    ph: char,
    /// Nanoseconds since the origin.
    ts: u64,
    dur: u64,
    tid: u32,
    args: Args,
    /// A run of chunks (its arguments are written from this).
    run: Option<ChunkRun>,
}

/// Consecutive chunks of one owner's iteration computed back to back by one thread: one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChunkRun {
    owner: usize,
    iter: u64,
    first: u32,
    count: u32,
    /// Nanoseconds of injected delay inside.
    delay: u64,
}

/// Chunks closer than this are one run.
const RUN_GAP_NS: u64 = 20_000;

/// A rank's tracer: the origin, the file, and the loop's own buffer.
pub(super) struct Tracer {
    origin: Instant,
    rank: usize,
    path: String,
    main: Mutex<Vec<Event>>,
    out: Mutex<BufWriter<File>>,
}

/// A started span, ended with [`Tracer::end`] or [`Tracer::end_into`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Span(pub(super) Instant);

impl Span {
    pub fn now() -> Self {
        Span(Instant::now())
    }
}

impl Tracer {
    /// Creates the rank's trace file at `path` and writes the process and thread names. An
    /// entry at `path` that is not a regular file (a link, a FIFO, a device, a directory) is
    /// refused, not written through.
    pub fn create(path: &Path, rank: usize, threads: usize) -> std::io::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if !m.is_file() => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "exists and is not a regular file (a link, a FIFO, a device or a directory): not written through",
                ))
            }
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut out = BufWriter::new(File::create(path)?);
        let mut m = |name: &str, tid: usize, args: &str| {
            writeln!(out, r#"{{"name":"{name}","ph":"M","pid":{rank},"tid":{tid},"args":{args}}}"#)
        };
        m("process_name", 0, &format!(r#"{{"name":"rank {rank}"}}"#))?;
        m("process_sort_index", 0, &format!(r#"{{"sort_index":{rank}}}"#))?;
        m("thread_name", 0, r#"{"name":"loop"}"#)?;
        m("thread_sort_index", 0, r#"{"sort_index":0}"#)?;
        for w in 0..threads {
            m("thread_name", w + 1, &format!(r#"{{"name":"compute {w}"}}"#))?;
            m("thread_sort_index", w + 1, &format!(r#"{{"sort_index":{}}}"#, w + 1))?;
        }
        Ok(Self {
            origin: Instant::now(),
            rank,
            path: path.display().to_string(),
            main: Mutex::new(Vec::new()),
            out: Mutex::new(out),
        })
    }

    /// Sets the origin: called by every rank as it leaves the same barrier.
    pub fn align(&mut self, origin: Instant) {
        self.origin = origin;
    }

    /// Writes the alignment's measured spread (metadata of the rank's process).
    pub fn write_alignment(&self, spread_us: f64) -> std::io::Result<()> {
        let mut out = self.out.lock().expect("trace file");
        writeln!(
            out,
            r#"{{"name":"clock_alignment","ph":"M","pid":{},"tid":0,"args":{{"method":"barrier","barrier_exit_spread_us":{spread_us:.3}}}}}"#,
            self.rank
        )
    }

    fn ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// A span from `start` to now on thread `tid`, into `buf`.
    pub fn end_into(
        &self,
        buf: &mut Vec<Event>,
        tid: u32,
        (name, cat): (&'static str, &'static str),
        start: Span,
        args: Args,
    ) {
        let (ts, end) = (self.ns(start.0), self.ns(Instant::now()));
        buf.push(Event { name, cat, ph: 'X', ts, dur: end.saturating_sub(ts), tid, args, run: None });
    }

    /// Chunks `chunks` of `owner`'s iteration `iter` (computed in one call), by thread `tid`
    /// from `start` to now with `delay` nanoseconds of injected delay in it: added to the
    /// thread's last event if that is the run of chunks they continue (same kind, owner and
    /// iteration, the next chunk, begun at most 20 us after), else a new event. Runs keep the
    /// trace small: a thread going through its queue is one event per iteration.
    pub fn chunk(
        &self,
        buf: &mut Vec<Event>,
        tid: u32,
        kind: &'static str,
        (owner, iter, chunks): (usize, u64, Range<u32>),
        start: Span,
        delay: u64,
    ) {
        let (ts, end) = (self.ns(start.0), self.ns(Instant::now()));
        let count = chunks.len() as u32;
        if let Some(last) = buf.last_mut() {
            if let Some(r) = last.run.as_mut() {
                let next = r.owner == owner && r.iter == iter && r.first + r.count == chunks.start;
                if last.name == kind && next && ts.saturating_sub(last.ts + last.dur) <= RUN_GAP_NS {
                    r.count += count;
                    r.delay += delay;
                    last.dur = end.saturating_sub(last.ts);
                    return;
                }
            }
        }
        let run = ChunkRun { owner, iter, first: chunks.start, count, delay };
        let dur = end.saturating_sub(ts);
        buf.push(Event {
            name: kind,
            cat: "compute",
            ph: 'X',
            ts,
            dur,
            tid,
            args: Args::default(),
            run: Some(run),
        });
    }

    /// An instant event now on thread `tid`, into `buf`.
    pub fn instant_into(
        &self,
        buf: &mut Vec<Event>,
        tid: u32,
        (name, cat): (&'static str, &'static str),
        args: Args,
    ) {
        buf.push(Event { name, cat, ph: 'i', ts: self.ns(Instant::now()), dur: 0, tid, args, run: None });
    }

    /// A span of the loop's.
    pub fn end(&self, name: &'static str, cat: &'static str, start: Span, args: Args) {
        let mut main = self.main.lock().expect("trace buffer");
        self.end_into(&mut main, 0, (name, cat), start, args);
    }

    /// An instant event of the loop's.
    pub fn instant(&self, name: &'static str, cat: &'static str, args: Args) {
        let mut main = self.main.lock().expect("trace buffer");
        self.instant_into(&mut main, 0, (name, cat), args);
    }

    /// A counter of the loop's (a track of its own in the viewer).
    pub fn counter(&self, name: &'static str, args: Args) {
        let mut main = self.main.lock().expect("trace buffer");
        main.push(Event {
            name,
            cat: "counter",
            ph: 'C',
            ts: self.ns(Instant::now()),
            dur: 0,
            tid: 0,
            args,
            run: None,
        });
    }

    /// Writes the loop's events and `more` (compute threads'), emptying both.
    pub fn write(&self, more: &mut [&mut Vec<Event>]) -> std::io::Result<()> {
        let mut out = self.out.lock().expect("trace file");
        let mut main = self.main.lock().expect("trace buffer");
        let mut line = String::with_capacity(256);
        for e in main.drain(..).chain(more.iter_mut().flat_map(|b| b.drain(..))) {
            line.clear();
            format(self.rank, &e, &mut line);
            out.write_all(line.as_bytes())?;
        }
        Ok(())
    }

    /// Writes what is buffered and flushes the file.
    pub fn finish(&self) -> std::io::Result<()> {
        self.write(&mut [])?;
        self.out.lock().expect("trace file").flush()
    }

    /// The file's path (for errors).
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// One event as a JSON line of process `rank`.
fn format(rank: usize, e: &Event, s: &mut String) {
    // By hand, digits included: this runs once per event on the rank's loop, and `write!` costs
    // several times as much.
    s.push_str(r#"{"name":""#);
    s.push_str(e.name);
    s.push_str(r#"","cat":""#);
    s.push_str(e.cat);
    s.push_str(r#"","ph":""#);
    s.push(e.ph);
    s.push_str(r#"","ts":"#);
    micros(s, e.ts);
    s.push_str(r#","pid":"#);
    digits(s, rank as u64);
    s.push_str(r#","tid":"#);
    digits(s, u64::from(e.tid));
    match e.ph {
        'X' => {
            s.push_str(r#","dur":"#);
            micros(s, e.dur);
        }
        // A thread-scoped instant.
        'i' => s.push_str(r#","s":"t""#),
        _ => {}
    }
    if let Some(r) = e.run {
        s.push_str(r#","args":{"owner":"#);
        digits(s, r.owner as u64);
        s.push_str(r#","iter":"#);
        digits(s, r.iter);
        s.push_str(r#","first":"#);
        digits(s, u64::from(r.first));
        s.push_str(r#","chunks":"#);
        digits(s, u64::from(r.count));
        s.push_str(r#","delay_us":"#);
        micros(s, r.delay);
        s.push('}');
    } else if e.args.n > 0 {
        s.push_str(r#","args":{"#);
        for (i, (k, v)) in e.args.kv[..e.args.n].iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push('"');
            s.push_str(k);
            s.push_str("\":");
            match v {
                Some(Val::Int(x)) => {
                    if *x < 0 {
                        s.push('-');
                    }
                    digits(s, x.unsigned_abs());
                }
                Some(Val::Num(x)) if x.is_finite() => {
                    let _ = write!(s, "{x}");
                }
                Some(Val::Num(_)) | None => s.push_str("null"),
                Some(Val::Str(x)) => {
                    s.push('"');
                    s.push_str(x);
                    s.push('"');
                }
            }
        }
        s.push('}');
    }
    s.push_str("}\n");
}

/// `v` in decimal.
fn digits(s: &mut String, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    s.extend(buf[i..].iter().map(|&d| char::from(d)));
}

/// `ns` nanoseconds as microseconds with three decimals.
fn micros(s: &mut String, ns: u64) {
    digits(s, ns / 1000);
    let f = ns % 1000;
    s.push('.');
    s.extend([f / 100, f / 10 % 10, f % 10].map(|d| char::from(b'0' + d as u8)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_as_json_numbers() {
        let mut s = String::new();
        for ns in [0, 7, 999, 1000, 1_234_567, u64::MAX] {
            s.clear();
            micros(&mut s, ns);
            let v: f64 = s.parse().expect("a number");
            assert!((v - ns as f64 / 1000.0).abs() <= 1e-3 * v.max(1.0), "{ns}: {s}");
        }
        let e = Event {
            name: "n",
            cat: "c",
            ph: 'i',
            ts: 1500,
            dur: 0,
            tid: 3,
            args: Args::default().int("neg", -42).int("zero", 0).num("x", 0.25).str("s", "t"),
            run: None,
        };
        s.clear();
        format(7, &e, &mut s);
        let v: serde_json::Value = serde_json::from_str(&s).expect("json");
        assert_eq!(v["ts"].as_f64(), Some(1.5));
        assert_eq!((v["pid"].as_u64(), v["tid"].as_u64()), (Some(7), Some(3)));
        assert_eq!((v["args"]["neg"].as_i64(), v["args"]["zero"].as_i64()), (Some(-42), Some(0)));
        assert_eq!((v["args"]["x"].as_f64(), v["args"]["s"].as_str()), (Some(0.25), Some("t")));
    }

    #[test]
    fn an_entry_that_is_not_a_regular_file_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let target = dir.path().join("target");
        std::fs::write(&target, "theirs").expect("write");
        let link = dir.path().join("rank-0.jsonl");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let sub = dir.path().join("rank-1.jsonl");
        std::fs::create_dir(&sub).expect("mkdir");
        for path in [&link, &sub] {
            let e = Tracer::create(path, 0, 1).err().expect("refused");
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        }
        assert_eq!(std::fs::read(&target).expect("read"), b"theirs");
        assert!(std::fs::symlink_metadata(&link).expect("link").file_type().is_symlink());
    }

    #[test]
    fn events_are_one_json_object_per_line_with_the_fields_viewers_need() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("t/rank-1.jsonl");
        let mut t = Tracer::create(&path, 1, 2).expect("create");
        t.align(Instant::now());
        let s = Span::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        t.end("pull", "comm", s, Args::default().int("iter", 3));
        t.instant("dropped", "scheme", Args::default().str("why", "late"));
        t.counter("threads", Args::default().int("active", 2));
        let mut thread = Vec::new();
        t.end_into(
            &mut thread,
            2,
            ("span", "compute"),
            Span::now(),
            Args::default().int("owner", 0).num("x", f64::NAN),
        );
        // Chunks 4, 5, 6 of rank 0's iteration 3 back to back: one run; then chunk 9 and chunks
        // 10 to 12 in one call: another.
        for c in [4..5, 5..6, 6..7, 9..10, 10..13] {
            t.chunk(&mut thread, 2, "own chunk", (0, 3, c), Span::now(), 10);
        }
        t.write(&mut [&mut thread]).expect("write");
        t.write_alignment(12.5).expect("meta");
        t.finish().expect("finish");
        assert!(thread.is_empty());
        let text = std::fs::read_to_string(&path).expect("read");
        let events: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect();
        assert!(events.iter().all(|e| e["pid"] == 1 && e["ph"].is_string() && e["name"].is_string()));
        let pull = events.iter().find(|e| e["name"] == "pull").expect("pull");
        assert!(pull["dur"].as_f64().expect("dur") >= 2000.0, "{pull}");
        assert_eq!(pull["args"]["iter"], 3);
        let span = events.iter().find(|e| e["name"] == "span").expect("span");
        assert_eq!(span["tid"], 2);
        assert!(span["args"]["x"].is_null());
        let runs: Vec<_> = events.iter().filter(|e| e["name"] == "own chunk").collect();
        assert_eq!(runs.len(), 2, "{runs:?}");
        assert_eq!(
            (runs[0]["args"]["first"].as_u64(), runs[0]["args"]["chunks"].as_u64()),
            (Some(4), Some(3))
        );
        assert_eq!(runs[0]["args"]["delay_us"].as_f64(), Some(0.03));
        assert_eq!(
            (runs[1]["args"]["first"].as_u64(), runs[1]["args"]["chunks"].as_u64()),
            (Some(9), Some(4))
        );
        assert_eq!(events.iter().filter(|e| e["name"] == "thread_name").count(), 3);
        assert!(events.iter().any(|e| e["name"] == "clock_alignment"));
    }
}
