//! Training checkpoints in a run directory: `checkpoint.safetensors` (the newest) and
//! `checkpoint.prev.safetensors` (the one before).
//!
//! A checkpoint is a safetensors file: tensors `params` and `state` (the parameter and optimizer
//! state windows as they were, f32), `scheme` (what the ranks' policies learned, f64; see
//! `Snapshot::scheme`) and `best` (the weights of the best evaluation so far, f32, empty when
//! none is kept: `Snapshot::best`; early stopping's count of evaluations without improvement is
//! read from `evals`), and metadata: `format = peregrine-checkpoint`, `iteration`,
//! `train_seconds`, `evals` (JSON), `config` (the resolved configuration, to refuse resuming
//! another run), `param_order` (the model's [`Export::param_order`], where it has one: to refuse
//! a vector ordered otherwise, by another version) and `checksum` (CRC-32 of every other metadata
//! entry and every tensor, see [`checksum`]). Writing goes to a temporary file, synced, then the
//! newest is renamed to the previous and the temporary file to the newest, and the directory is
//! synced: a crash leaves a whole newest or a whole previous checkpoint, and a failed write (a
//! full disk) leaves no temporary file. Reading checks the header, the checksum and then every
//! value's range (the iteration within the run's, seconds finite and not negative, evaluations
//! in order and within the iterations, parameters and optimizer state finite), and falls back to
//! the previous checkpoint when the newest is damaged.
//!
//! Checkpoints of earlier versions, whose checksum (`crc32`) covered the tensors only, are
//! refused with a message to resume them with that version or start afresh: their iteration,
//! seconds and configuration cannot be told intact, and a checkpoint lives only as long as its
//! run.
//!
//! [`Export::param_order`]: peregrine_core::model::Export::param_order

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use peregrine_core::engine::{EvalPoint, Snapshot};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

/// The `format` metadata value.
const FORMAT: &str = "peregrine-checkpoint";

/// The metadata key of the checksum of everything else ([`checksum`]).
const CHECKSUM: &str = "checksum";

/// The metadata key of the checksum that earlier versions wrote, of the tensors only.
const TENSORS_ONLY_CHECKSUM: &str = "crc32";

/// The checkpoints of one run directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// A checkpoint read back.
#[derive(Debug)]
pub struct Loaded {
    /// The state.
    pub snapshot: Snapshot,
    /// The configuration it was taken under.
    pub config: String,
    /// The order of its parameter vector (empty: each block in its own order).
    pub order: String,
    /// The file it came from.
    pub path: PathBuf,
    /// Why the newest checkpoint was passed over, if it was.
    pub fallback: Option<String>,
}

impl Store {
    /// The checkpoints in `dir`.
    pub fn new(dir: &Path) -> Self {
        Self { dir: dir.to_owned() }
    }

    /// The newest checkpoint's path.
    pub fn newest(&self) -> PathBuf {
        self.dir.join("checkpoint.safetensors")
    }

    /// The previous checkpoint's path.
    pub fn previous(&self) -> PathBuf {
        self.dir.join("checkpoint.prev.safetensors")
    }

    /// Whether any checkpoint file is there.
    pub fn exists(&self) -> bool {
        self.newest().exists() || self.previous().exists()
    }

    /// Writes `s` taken under configuration `config`, its parameters in `order`, as the newest
    /// checkpoint, keeping the newest so far as the previous one.
    pub fn save(&self, s: &Snapshot, config: &str, order: &str) -> Result<(), String> {
        let data = encode(s, config, order)?;
        let tmp = self.temporary();
        let written = self.replace_newest(&tmp, &data);
        if written.is_err() {
            // A full disk, a file size limit: what was written of the new checkpoint goes; the
            // newest (or, once renamed, the previous) stands.
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// The temporary file a checkpoint is written to before it becomes the newest.
    fn temporary(&self) -> PathBuf {
        self.dir.join("checkpoint.safetensors.tmp")
    }

    /// Writes `data` to `tmp`, synced, then makes the newest the previous and `tmp` the newest.
    fn replace_newest(&self, tmp: &Path, data: &[u8]) -> Result<(), String> {
        let newest = self.newest();
        let err = |what: &str, p: &Path| {
            let p = p.display().to_string();
            let what = what.to_owned();
            move |e: std::io::Error| format!("{what} {p}: {e}")
        };
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            // The run directory is locked by this run: the name is its own, but a link planted
            // there is not followed.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(tmp)
                .map_err(err("creating", tmp))?;
            f.write_all(data).map_err(err("writing", tmp))?;
            f.sync_all().map_err(err("syncing", tmp))?;
        }
        if newest.exists() {
            std::fs::rename(&newest, self.previous()).map_err(err("renaming", &newest))?;
        }
        std::fs::rename(tmp, &newest).map_err(err("renaming", tmp))?;
        std::fs::File::open(&self.dir).and_then(|d| d.sync_all()).map_err(err("syncing", &self.dir))
    }

    /// The newest whole checkpoint, the previous one if the newest is damaged; `None` if there
    /// is none; an error naming both files if neither can be read.
    pub fn load(&self) -> Result<Option<Loaded>, String> {
        if !self.exists() {
            return Ok(None);
        }
        let newest = read(&self.newest());
        match newest {
            Ok((snapshot, config, order)) => {
                Ok(Some(Loaded { snapshot, config, order, path: self.newest(), fallback: None }))
            }
            Err(why) => match read(&self.previous()) {
                Ok((snapshot, config, order)) => Ok(Some(Loaded {
                    snapshot,
                    config,
                    order,
                    path: self.previous(),
                    fallback: Some(format!("{}: {why}", self.newest().display())),
                })),
                Err(prev) => {
                    Err(format!("{}: {why}; {}: {prev}", self.newest().display(), self.previous().display()))
                }
            },
        }
    }
}

/// The checksum of a checkpoint: CRC-32 of every metadata entry but the checksum itself, in key
/// order, then of the tensors' bytes (`params`, `state`, `scheme`, then `best`; a checkpoint of
/// a version without `best` has three), each key, value and tensor preceded by its length in
/// bytes (u64, little-endian), so that no field can pass for another.
fn checksum(meta: &HashMap<String, String>, tensors: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    let mut keys: Vec<&String> = meta.keys().filter(|k| *k != CHECKSUM).collect();
    keys.sort();
    for k in keys {
        field(k.as_bytes());
        field(meta[k].as_bytes());
    }
    for &t in tensors {
        field(t);
    }
    h.finalize()
}

fn encode(s: &Snapshot, config: &str, order: &str) -> Result<Vec<u8>, String> {
    let (p, st): (&[u8], &[u8]) = (bytemuck::cast_slice(&s.params), bytemuck::cast_slice(&s.state));
    let sc: &[u8] = bytemuck::cast_slice(&s.scheme);
    let best: &[u8] = bytemuck::cast_slice(&s.best);
    let mut meta = HashMap::new();
    meta.insert("format".to_owned(), FORMAT.to_owned());
    meta.insert("iteration".into(), s.iteration.to_string());
    meta.insert("train_seconds".into(), s.train_seconds.to_string());
    meta.insert("evals".into(), serde_json::to_string(&s.evals).map_err(|e| e.to_string())?);
    meta.insert("config".into(), config.to_owned());
    if !order.is_empty() {
        meta.insert("param_order".into(), order.to_owned());
    }
    let sum = checksum(&meta, &[p, st, sc, best]);
    meta.insert(CHECKSUM.into(), format!("{sum:08x}"));
    let views = [
        ("params", TensorView::new(Dtype::F32, vec![s.params.len()], p).map_err(|e| e.to_string())?),
        ("state", TensorView::new(Dtype::F32, vec![s.state.len()], st).map_err(|e| e.to_string())?),
        ("scheme", TensorView::new(Dtype::F64, vec![s.scheme.len()], sc).map_err(|e| e.to_string())?),
        ("best", TensorView::new(Dtype::F32, vec![s.best.len()], best).map_err(|e| e.to_string())?),
    ];
    safetensors::serialize(views, Some(meta)).map_err(|e| e.to_string())
}

/// A checkpoint file's state, configuration and parameter order, or what is wrong with it.
fn read(path: &Path) -> Result<(Snapshot, String, String), String> {
    let data = std::fs::read(path).map_err(|e| e.to_string())?;
    let st = SafeTensors::deserialize(&data).map_err(|e| format!("damaged ({e})"))?;
    let (_, header) = SafeTensors::read_metadata(&data).map_err(|e| format!("damaged ({e})"))?;
    let meta = header.metadata().clone().unwrap_or_default();
    if meta.get("format").map(String::as_str) != Some(FORMAT) {
        return Err("not a Peregrine checkpoint".into());
    }
    let Some(said) = meta.get(CHECKSUM) else {
        return Err(if meta.contains_key(TENSORS_ONLY_CHECKSUM) {
            "written by an earlier version of Peregrine, whose checksum does not cover the iteration, the \
             seconds or the configuration: resume it with that version, or start afresh"
                .into()
        } else {
            format!("damaged (no `{CHECKSUM}`)")
        });
    };
    let bytes = |name: &str, dtype: Dtype| -> Result<&[u8], String> {
        match st.tensor(name) {
            Ok(t) if t.dtype() == dtype => Ok(t.data()),
            Ok(t) => Err(format!("damaged (tensor {name} is {:?})", t.dtype())),
            Err(e) => Err(format!("damaged ({e})")),
        }
    };
    let (p, s, sc) =
        (bytes("params", Dtype::F32)?, bytes("state", Dtype::F32)?, bytes("scheme", Dtype::F64)?);
    // A checkpoint of a version before `best` has none (and its checksum covers three tensors).
    let best = match st.tensor("best") {
        Err(safetensors::SafeTensorError::TensorNotFound(_)) => None,
        _ => Some(bytes("best", Dtype::F32)?),
    };
    let sum = checksum(&meta, &[p, s, sc].into_iter().chain(best).collect::<Vec<_>>());
    if said != &format!("{sum:08x}") {
        return Err(format!("damaged (checksum {sum:08x}, the file says {said})"));
    }
    let get = |k: &str| meta.get(k).ok_or_else(|| format!("damaged (no `{k}`)"));
    let bad = |k: &str| format!("damaged (`{k}` is not valid)");
    let config = get("config")?.clone();
    let iteration: u64 = get("iteration")?.parse().map_err(|_| bad("iteration"))?;
    let train_seconds: f64 = get("train_seconds")?.parse().map_err(|_| bad("train_seconds"))?;
    let evals: Vec<EvalPoint> = serde_json::from_str(get("evals")?).map_err(|_| bad("evals"))?;
    check_ranges(iteration, train_seconds, &evals, &config)?;
    let params = finite("params", crate::model_file::f32s(p))?;
    let state = finite("state", crate::model_file::f32s(s))?;
    let scheme = sc.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default())).collect();
    let best = finite("best", best.map(crate::model_file::f32s).unwrap_or_default())?;
    if !(best.is_empty() || best.len() == params.len()) {
        return Err(format!(
            "damaged (tensor `best` holds {} values, `params` {})",
            best.len(),
            params.len()
        ));
    }
    let snapshot =
        Snapshot { iteration, train_seconds, evals, params, state, weights: Vec::new(), best, scheme };
    let order = meta.get("param_order").cloned().unwrap_or_default();
    Ok((snapshot, config, order))
}

/// Whether a checkpoint's figures are in range: its iteration within the `iterations` of its
/// configuration, its training seconds finite and not negative, its evaluations in order, none
/// past the iteration, their times finite and not negative.
fn check_ranges(iteration: u64, train_seconds: f64, evals: &[EvalPoint], config: &str) -> Result<(), String> {
    let iterations = config
        .parse::<toml::Table>()
        .ok()
        .and_then(|c| c.get("iterations").and_then(toml::Value::as_integer))
        .and_then(|n| u64::try_from(n).ok());
    if let Some(n) = iterations.filter(|&n| iteration > n) {
        return Err(format!("damaged (`iteration` {iteration} is past the run's {n} iterations)"));
    }
    if !(train_seconds.is_finite() && train_seconds >= 0.0) {
        return Err(format!("damaged (`train_seconds` {train_seconds} is not a duration)"));
    }
    let mut last = 0;
    for (i, e) in evals.iter().enumerate() {
        if e.iter < last || e.iter > iteration {
            return Err(format!(
                "damaged (evaluation {i} at iteration {}: out of order, or past the checkpoint's {iteration})",
                e.iter
            ));
        }
        if !(e.time.is_finite() && e.time >= 0.0) {
            return Err(format!("damaged (evaluation {i} at {} seconds)", e.time));
        }
        last = e.iter;
    }
    Ok(())
}

/// `values` of tensor `name`, or an error naming the first that is not a finite number.
fn finite(name: &str, values: Vec<f32>) -> Result<Vec<f32>, String> {
    match crate::model_file::first_not_finite(&values) {
        Some(i) => Err(format!(
            "tensor `{name}` holds {} at index {i} (of {}): not a state to resume from",
            values[i],
            values.len()
        )),
        None => Ok(values),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(iteration: u64) -> Snapshot {
        Snapshot {
            iteration,
            params: (0..100).map(|i| i as f32 * 0.5 + iteration as f32).collect(),
            state: (0..200).map(|i| i as f32).collect(),
            weights: Vec::new(),
            evals: vec![EvalPoint {
                iter: 10,
                time: 0.5,
                loss: 0.7,
                metric: 0.6,
                train_loss: Some(0.71),
                consensus: None,
            }],
            best: (0..100).map(|i| i as f32 * 0.25).collect(),
            train_seconds: 1.25,
            scheme: vec![2.0, 3.0, 2.0, 0.25, 1e300, 1.0, 7.5, 0.0],
        }
    }

    #[test]
    fn a_checkpoint_reads_back_as_written_and_the_previous_is_kept() {
        let t = tempfile::tempdir().expect("tmp");
        let s = Store::new(t.path());
        assert!(s.load().expect("none").is_none());
        s.save(&snapshot(10), "model = \"lr\"", "").expect("save");
        s.save(&snapshot(20), "model = \"lr\"", "weights in x out").expect("save");
        let l = s.load().expect("load").expect("some");
        assert_eq!(l.snapshot, snapshot(20));
        assert_eq!(l.config, "model = \"lr\"");
        assert_eq!(l.order, "weights in x out");
        assert!(l.fallback.is_none());
        let previous = read(&s.previous()).expect("previous");
        assert_eq!((previous.0, previous.2), (snapshot(10), String::new()));
        assert!(!t.path().join("checkpoint.safetensors.tmp").exists());
    }

    #[test]
    fn a_checkpoint_cut_or_changed_at_any_byte_is_detected_and_the_previous_used() {
        let t = tempfile::tempdir().expect("tmp");
        let s = Store::new(t.path());
        s.save(&snapshot(10), "c", "").expect("save");
        s.save(&snapshot(20), "c", "").expect("save");
        let whole = std::fs::read(s.newest()).expect("read");
        for cut in 0..whole.len() {
            std::fs::write(s.newest(), &whole[..cut]).expect("write");
            let l = s.load().expect("the previous").expect("some");
            assert_eq!(l.snapshot.iteration, 10, "cut at {cut}");
            assert!(l.fallback.is_some(), "cut at {cut}");
        }
        // A flipped byte in the data, past the header.
        let mut bad = whole.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        std::fs::write(s.newest(), &bad).expect("write");
        let l = s.load().expect("the previous").expect("some");
        assert_eq!(l.snapshot.iteration, 10);
        assert!(l.fallback.as_deref().is_some_and(|f| f.contains("checksum")), "{:?}", l.fallback);
        // Both damaged: an error naming both.
        std::fs::write(s.previous(), b"junk").expect("write");
        let e = s.load().expect_err("both damaged");
        assert!(e.contains("checkpoint.safetensors") && e.contains("checkpoint.prev.safetensors"), "{e}");
    }

    /// The newest checkpoint of `s` rewritten with `edit` applied to its metadata and
    /// parameters; with `reseal`, its checksum recomputed (figures written wrong, not damaged on
    /// the way).
    fn rewrite(s: &Store, reseal: bool, edit: impl FnOnce(&mut HashMap<String, String>, &mut Vec<f32>)) {
        let bytes = std::fs::read(s.newest()).expect("read");
        let st = SafeTensors::deserialize(&bytes).expect("safetensors");
        let (_, header) = SafeTensors::read_metadata(&bytes).expect("header");
        let mut meta = header.metadata().clone().expect("metadata");
        let mut params = crate::model_file::f32s(st.tensor("params").expect("params").data());
        edit(&mut meta, &mut params);
        let (state, scheme) = (st.tensor("state").expect("state"), st.tensor("scheme").expect("scheme"));
        let best = st.tensor("best").expect("best");
        let p: &[u8] = bytemuck::cast_slice(&params);
        if reseal {
            let sum = checksum(&meta, &[p, state.data(), scheme.data(), best.data()]);
            meta.insert(CHECKSUM.into(), format!("{sum:08x}"));
        }
        let views = [
            ("params", TensorView::new(Dtype::F32, vec![params.len()], p).expect("params")),
            ("state", state),
            ("scheme", scheme),
            ("best", best),
        ];
        std::fs::write(s.newest(), safetensors::serialize(views, Some(meta)).expect("serialize"))
            .expect("write");
    }

    /// Two checkpoints of a run of 50 iterations, at 10 and 20.
    fn two(t: &tempfile::TempDir) -> Store {
        let s = Store::new(t.path());
        s.save(&snapshot(10), "iterations = 50", "").expect("save");
        s.save(&snapshot(20), "iterations = 50", "").expect("save");
        s
    }

    /// Why the newest checkpoint was passed over (the previous is whole).
    fn passed_over(s: &Store) -> String {
        let l = s.load().expect("the previous").expect("some");
        assert_eq!(l.snapshot.iteration, 10);
        l.fallback.expect("the newest passed over")
    }

    #[test]
    fn metadata_changed_after_writing_fails_the_checksum() {
        // Rewritten as it was: whole.
        let t = tempfile::tempdir().expect("tmp");
        let s = two(&t);
        rewrite(&s, false, |_, _| {});
        let l = s.load().expect("load").expect("some");
        assert_eq!((l.snapshot, l.fallback), (snapshot(20), None));
        let edits = [
            ("iteration", "30"),
            ("train_seconds", "-1e10"),
            ("evals", "[]"),
            ("config", "iterations = 5000"),
            ("param_order", "weights in x out"),
        ];
        for (key, value) in edits {
            let t = tempfile::tempdir().expect("tmp");
            let s = two(&t);
            rewrite(&s, false, |m, _| {
                m.insert(key.into(), value.into());
            });
            let why = passed_over(&s);
            assert!(why.contains("checksum"), "{key}: {why}");
        }
    }

    #[test]
    fn figures_out_of_range_are_refused_under_a_valid_checksum() {
        type Edit = fn(&mut HashMap<String, String>, &mut Vec<f32>);
        let cases: [(Edit, &str); 7] = [
            (|m, _| drop(m.insert("iteration".into(), "51".into())), "past the run's 50 iterations"),
            (|m, _| drop(m.insert("train_seconds".into(), "-1e10".into())), "`train_seconds` -10000000000"),
            (|m, _| drop(m.insert("train_seconds".into(), "inf".into())), "`train_seconds` inf"),
            (|m, _| drop(m.insert("train_seconds".into(), "NaN".into())), "`train_seconds` NaN"),
            (
                |m, _| drop(m.insert("evals".into(), m["evals"].replace("\"iter\":10", "\"iter\":21"))),
                "evaluation 0 at iteration 21",
            ),
            (
                |m, _| drop(m.insert("evals".into(), m["evals"].replace("0.5", "-0.5"))),
                "evaluation 0 at -0.5",
            ),
            (|_, p| p[3] = f32::NAN, "tensor `params` holds NaN at index 3 (of 100)"),
        ];
        for (edit, expected) in cases {
            let t = tempfile::tempdir().expect("tmp");
            let s = two(&t);
            rewrite(&s, true, edit);
            let why = passed_over(&s);
            assert!(why.contains(expected) && why.contains("checkpoint.safetensors"), "{why}");
        }
        // Infinite optimizer state too.
        let t = tempfile::tempdir().expect("tmp");
        let s = Store::new(t.path());
        let mut bad = snapshot(20);
        bad.state[7] = f32::NEG_INFINITY;
        s.save(&bad, "c", "").expect("save");
        let e = s.load().expect_err("nothing to fall back on");
        assert!(e.contains("tensor `state` holds -inf at index 7 (of 200)"), "{e}");
    }

    /// The newest checkpoint of `s` rewritten without its `best` tensor; with `reseal`, its
    /// checksum recomputed over the other three (as a version before `best` wrote it).
    fn without_best(s: &Store, reseal: bool) {
        let bytes = std::fs::read(s.newest()).expect("read");
        let st = SafeTensors::deserialize(&bytes).expect("safetensors");
        let (_, header) = SafeTensors::read_metadata(&bytes).expect("header");
        let mut meta = header.metadata().clone().expect("metadata");
        let views: Vec<(&str, TensorView<'_>)> =
            ["params", "state", "scheme"].into_iter().map(|n| (n, st.tensor(n).expect(n))).collect();
        if reseal {
            let data: Vec<&[u8]> = views.iter().map(|(_, v)| v.data()).collect();
            meta.insert(CHECKSUM.into(), format!("{:08x}", checksum(&meta, &data)));
        }
        std::fs::write(s.newest(), safetensors::serialize(views, Some(meta)).expect("serialize"))
            .expect("write");
    }

    #[test]
    fn the_best_model_is_covered_by_the_checksum_and_a_checkpoint_without_one_reads_as_none() {
        // Dropped from a checkpoint that had it: the checksum says so.
        let t = tempfile::tempdir().expect("tmp");
        let s = two(&t);
        without_best(&s, false);
        assert!(passed_over(&s).contains("checksum"));
        // A checkpoint of a version before `best`: read, with no best model.
        let t = tempfile::tempdir().expect("tmp");
        let s = two(&t);
        without_best(&s, true);
        let l = s.load().expect("load").expect("some");
        assert_eq!(l.fallback, None);
        assert_eq!(l.snapshot, Snapshot { best: Vec::new(), ..snapshot(20) });
        // Not finite, or not the model's length: refused.
        for (edit, expected) in [
            (
                (|b: &mut Vec<f32>| b[5] = f32::INFINITY) as fn(&mut Vec<f32>),
                "tensor `best` holds inf at index 5",
            ),
            (|b: &mut Vec<f32>| b.truncate(99), "tensor `best` holds 99 values, `params` 100"),
        ] {
            let t = tempfile::tempdir().expect("tmp");
            let s = Store::new(t.path());
            let mut bad = snapshot(20);
            edit(&mut bad.best);
            s.save(&bad, "c", "").expect("save");
            let e = s.load().expect_err("nothing to fall back on");
            assert!(e.contains(expected), "{e}");
        }
    }

    #[test]
    fn a_checkpoint_whose_checksum_covers_only_its_tensors_is_refused() {
        let t = tempfile::tempdir().expect("tmp");
        let s = Store::new(t.path());
        s.save(&snapshot(10), "c", "").expect("save");
        // As earlier versions wrote it: `crc32` of the tensors, the metadata outside it.
        rewrite(&s, false, |m, _| {
            m.remove(CHECKSUM);
            m.insert(TENSORS_ONLY_CHECKSUM.into(), "0badf00d".into());
        });
        let e = s.load().expect_err("refused");
        assert!(e.contains("earlier version of Peregrine") && e.contains("start afresh"), "{e}");
    }
}
