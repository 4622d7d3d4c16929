//! Opening a model's data: its training and evaluation sets, checked to be of its kind and
//! shape, the training set optionally copied into memory with huge pages; and the errors a model
//! constructor reports ([`ModelError`], [`Built`]).

use peregrine_kernels::data::{Dataset, Kind};

/// Why a model cannot be built on its data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A dataset cannot be opened.
    #[error("{what}: {source}")]
    Open {
        /// Which set ("training set", "evaluation set").
        what: &'static str,
        /// What failed.
        source: peregrine_kernels::data::DataError,
    },
    /// A dataset holds another kind of data than the model needs.
    #[error("{what} {}: holds {holds} data, this model needs {needs} data", path.display())]
    Kind {
        /// Which set.
        what: &'static str,
        /// Its file.
        path: std::path::PathBuf,
        /// The kind it holds.
        holds: &'static str,
        /// The kind the model needs.
        needs: &'static str,
    },
    /// The evaluation set's shape does not match the training set's.
    #[error("evaluation set {}: {eval}, the training set {train}", path.display())]
    Shape {
        /// The evaluation set's file.
        path: std::path::PathBuf,
        /// Its shape.
        eval: String,
        /// The training set's.
        train: String,
    },
    /// The data or a setting does not fit the model.
    #[error("{0}")]
    Unfit(String),
}

/// A dataset opened for training, checked to be of `kind`.
pub(crate) fn open(path: &std::path::Path, kind: Kind, what: &'static str) -> Built<Dataset> {
    let d = Dataset::open(path).map_err(|source| ModelError::Open { what, source })?;
    if d.kind() != kind {
        return Err(ModelError::Kind { what, path: path.into(), holds: d.kind().name(), needs: kind.name() });
    }
    Ok(d)
}

/// A model's training set and its evaluation set (the training set when none is given), both
/// checked to be of the model's kind.
#[derive(Debug)]
pub(crate) struct Sets {
    pub(crate) train: Dataset,
    eval: Option<Dataset>,
}

/// Training sets of at most this many bytes (and at least [`MIN_COPY`]) are copied into memory
/// backed by transparent huge pages when a model opens them ([`Dataset::into_memory`]); 0, the
/// default: read through their file mappings. Set by the binary before it builds models
/// ([`copy_training_sets_up_to`]).
static TRAINING_COPY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Smallest training set worth the copy: below this the 4 KiB pages' TLB entries cover it.
pub const MIN_COPY: u64 = 8 << 20;

/// Copies training sets of up to `bytes` bytes (at least [`MIN_COPY`]) into memory with huge
/// pages from now on, in this process (0: none; `peregrine train --huge-pages`).
pub fn copy_training_sets_up_to(bytes: u64) {
    TRAINING_COPY.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

impl Sets {
    /// Opens `train` and, if given, `eval`; the training set copied into memory with huge
    /// pages if its size says so ([`copy_training_sets_up_to`]).
    pub(crate) fn open(train: &std::path::Path, eval: Option<&std::path::Path>, kind: Kind) -> Built<Self> {
        let mut train = open(train, kind, "training set")?;
        let most = TRAINING_COPY.load(std::sync::atomic::Ordering::Relaxed);
        if (MIN_COPY..=most).contains(&(train.bytes() as u64)) {
            train = train
                .into_memory(true)
                .map_err(|source| ModelError::Open { what: "training set", source })?;
        }
        let eval = eval.map(|p| open(p, kind, "evaluation set")).transpose()?;
        Ok(Self { train, eval })
    }

    /// Both sets replaced by copies in memory standardized by `scaling`
    /// ([`peregrine_kernels::data::standardize::standardized`]): the kernels read the
    /// standardized rows; the files are left as they are. The training set's copy asks for huge
    /// pages when it was copied into memory for them.
    pub(crate) fn standardize(
        &mut self,
        scaling: &peregrine_kernels::data::standardize::Scaling,
    ) -> Built<()> {
        use peregrine_kernels::data::standardize::standardized;
        let huge = !self.train.is_mapped();
        self.train = standardized(&self.train, scaling, huge)
            .map_err(|source| ModelError::Open { what: "training set", source })?;
        if let Some(e) = self.eval.as_mut() {
            *e = standardized(e, scaling, false)
                .map_err(|source| ModelError::Open { what: "evaluation set", source })?;
        }
        Ok(())
    }

    /// The given evaluation set, if any.
    pub(crate) fn given_eval(&self) -> Option<&Dataset> {
        self.eval.as_ref()
    }

    /// The set evaluations read.
    pub(crate) fn eval(&self) -> &Dataset {
        self.eval.as_ref().unwrap_or(&self.train)
    }
}

/// `(columns, classes)` of a dense training set, checked against its evaluation set.
pub(crate) fn dense_shape(sets: &Sets) -> Built<(usize, usize)> {
    let h = sets.train.header();
    let (cols, classes) = (h.cols as usize, h.classes as usize);
    if let Some(e) = sets.given_eval() {
        if (e.header().cols as usize, e.header().classes as usize) != (cols, classes) {
            return Err(ModelError::Shape {
                path: e.path().into(),
                eval: format!("is {} columns x {} classes", e.header().cols, e.header().classes),
                train: format!("{cols} x {classes}"),
            });
        }
    }
    Ok((cols, classes))
}

/// Checks that an evaluation set matches the training set's columns.
pub(crate) fn same_cols(train: &Dataset, eval: &Dataset) -> Built<()> {
    let (a, b) = (train.header().cols, eval.header().cols);
    if b > a {
        return Err(ModelError::Shape {
            path: eval.path().into(),
            eval: format!(
                "has {b} columns (features), more than the model's; convert both files with the same \
                 `peregrine data convert libsvm --features N`"
            ),
            train: format!("{} has {a}", train.path().display()),
        });
    }
    Ok(())
}

/// Errors a model constructor reports.
pub type Built<T> = Result<T, ModelError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_sets_in_the_size_range_are_copied_into_memory_and_read_the_same() {
        use peregrine_kernels::data::gen::{self, DenseSpec};
        let dir = tempfile::tempdir().expect("tmp");
        // 3,000 x 784 floats: 9.4 MB, past the 8 MiB below which no copy is made.
        let (big, small) = (dir.path().join("big.pgd"), dir.path().join("small.pgd"));
        gen::dense(&DenseSpec { rows: 3000, cols: 784, classes: 10, noise: 0.3, seed: 1 }, &big)
            .expect("gen");
        gen::dense(&DenseSpec { rows: 300, cols: 784, classes: 10, noise: 0.3, seed: 1 }, &small)
            .expect("gen");
        let open = |p: &std::path::Path| Sets::open(p, None, Kind::Dense).expect("open");
        let size = open(&big).train.bytes() as u64;
        assert!(size >= MIN_COPY && (open(&small).train.bytes() as u64) < MIN_COPY);
        // (The setting is the process's: other tests opening sets meanwhile may get copies, which
        // read the same.)
        for (most, big_copied) in [(0, false), (size - 1, false), (size, true), (u64::MAX, true)] {
            copy_training_sets_up_to(most);
            let (b, s) = (open(&big), open(&small));
            assert_eq!(!b.train.is_mapped(), big_copied, "up to {most}");
            assert!(s.train.is_mapped(), "a set under 8 MiB, up to {most}");
            let mapped = Dataset::open(&big).expect("open");
            let (x, y) = (b.train.dense().expect("dense"), mapped.dense().expect("dense"));
            assert!(x.features == y.features && x.labels == y.labels, "up to {most}: the rows read the same");
        }
        copy_training_sets_up_to(0);
    }
}
