//! Training checkpoints in a run directory: `checkpoint.safetensors` (the newest) and
//! `checkpoint.prev.safetensors` (the one before).
//!
//! A checkpoint is a safetensors file: tensors `params` and `state` (the parameter and optimizer
//! state windows as they were, f32) and `scheme` (what the ranks' policies learned, f64; see
//! `Snapshot::scheme`), and metadata: `format = peregrine-checkpoint`, `iteration`,
//! `train_seconds`, `evals` (JSON), `config` (the resolved configuration, to refuse resuming
//! another run), `param_order` (the model's [`Export::param_order`], where it has one: to refuse
//! a vector ordered otherwise, by another version) and `crc32` (of the tensors' bytes). Writing
//! goes to a temporary file, synced, then the newest is renamed to the previous and the
//! temporary file to the newest, and the directory is synced: a crash leaves a whole newest or a
//! whole previous checkpoint. Reading checks the header, the sizes and the checksum, and falls
//! back to the previous checkpoint when the newest is damaged.
//!
//! [`Export::param_order`]: peregrine_core::model::Export::param_order

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use peregrine_core::engine::{EvalPoint, Snapshot};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

/// The `format` metadata value.
const FORMAT: &str = "peregrine-checkpoint";

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
        let (newest, tmp) = (self.newest(), self.dir.join("checkpoint.safetensors.tmp"));
        let err = |what: &str, p: &Path| {
            let p = p.display().to_string();
            let what = what.to_owned();
            move |e: std::io::Error| format!("{what} {p}: {e}")
        };
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp).map_err(err("creating", &tmp))?;
            f.write_all(&data).map_err(err("writing", &tmp))?;
            f.sync_all().map_err(err("syncing", &tmp))?;
        }
        if newest.exists() {
            std::fs::rename(&newest, self.previous()).map_err(err("renaming", &newest))?;
        }
        std::fs::rename(&tmp, &newest).map_err(err("renaming", &tmp))?;
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

/// The checksum of the tensors' bytes.
fn crc(params: &[u8], state: &[u8], scheme: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(params);
    h.update(state);
    h.update(scheme);
    h.finalize()
}

fn encode(s: &Snapshot, config: &str, order: &str) -> Result<Vec<u8>, String> {
    let (p, st): (&[u8], &[u8]) = (bytemuck::cast_slice(&s.params), bytemuck::cast_slice(&s.state));
    let sc: &[u8] = bytemuck::cast_slice(&s.scheme);
    let mut meta = HashMap::new();
    meta.insert("format".to_owned(), FORMAT.to_owned());
    meta.insert("iteration".into(), s.iteration.to_string());
    meta.insert("train_seconds".into(), s.train_seconds.to_string());
    meta.insert("evals".into(), serde_json::to_string(&s.evals).map_err(|e| e.to_string())?);
    meta.insert("config".into(), config.to_owned());
    if !order.is_empty() {
        meta.insert("param_order".into(), order.to_owned());
    }
    meta.insert("crc32".into(), format!("{:08x}", crc(p, st, sc)));
    let views = [
        ("params", TensorView::new(Dtype::F32, vec![s.params.len()], p).map_err(|e| e.to_string())?),
        ("state", TensorView::new(Dtype::F32, vec![s.state.len()], st).map_err(|e| e.to_string())?),
        ("scheme", TensorView::new(Dtype::F64, vec![s.scheme.len()], sc).map_err(|e| e.to_string())?),
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
    let get = |k: &str| meta.get(k).ok_or_else(|| format!("damaged (no `{k}`)"));
    let tensor = |name: &str| -> Result<Vec<f32>, String> {
        let t = st.tensor(name).map_err(|e| format!("damaged ({e})"))?;
        if t.dtype() != Dtype::F32 {
            return Err(format!("damaged (tensor {name} is {:?})", t.dtype()));
        }
        Ok(crate::model_file::f32s(t.data()))
    };
    let (params, state) = (tensor("params")?, tensor("state")?);
    // Written by every version since policies keep state; absent before: nothing learned.
    let scheme: Vec<f64> = match st.tensor("scheme") {
        Ok(t) if t.dtype() == Dtype::F64 => {
            t.data().chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default())).collect()
        }
        Ok(t) => return Err(format!("damaged (tensor scheme is {:?})", t.dtype())),
        Err(_) => Vec::new(),
    };
    let sum = crc(bytemuck::cast_slice(&params), bytemuck::cast_slice(&state), bytemuck::cast_slice(&scheme));
    if get("crc32")? != &format!("{sum:08x}") {
        return Err(format!("damaged (checksum {sum:08x}, the file says {})", get("crc32")?));
    }
    let bad = |k: &str| format!("damaged (`{k}` is not valid)");
    let evals: Vec<EvalPoint> = serde_json::from_str(get("evals")?).map_err(|_| bad("evals"))?;
    let snapshot = Snapshot {
        iteration: get("iteration")?.parse().map_err(|_| bad("iteration"))?,
        train_seconds: get("train_seconds")?.parse().map_err(|_| bad("train_seconds"))?,
        evals,
        params,
        state,
        weights: Vec::new(),
        scheme,
    };
    let order = meta.get("param_order").cloned().unwrap_or_default();
    Ok((snapshot, get("config")?.clone(), order))
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
}
