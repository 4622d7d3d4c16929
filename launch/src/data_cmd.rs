//! `peregrine data ...`: convert text datasets to Peregrine's format, describe one, generate one.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, Subcommand};
use peregrine_kernels::data::{bow, csv, gen, idx, libsvm, npy, ratings, Converted, Dataset};

use crate::error::AppError;
use crate::output::{self, AtomicFile};

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Convert LIBSVM/SVMlight, CSV, NumPy arrays, MNIST IDX, ratings or bag-of-words text
    /// (gzipped or not) to a dataset file.
    #[command(subcommand)]
    Convert(ConvertCommand),
    /// Describe a dataset file from its header (O(1)); --verify also checks its checksum and every
    /// index (O(size)), and counts the positive labels and the standardized features.
    Info {
        /// The dataset file.
        file: PathBuf,
        /// Check the data checksum and every index, label and value; count the positive labels
        /// (sparse) and the features centred and scaled (standardized).
        #[arg(long)]
        verify: bool,
    },
    /// Generate a seeded synthetic dataset holding the model that generated it.
    #[command(subcommand)]
    Gen(GenCommand),
    /// Standardize features: shift and scale each by the mean and standard deviation of a
    /// training file, or apply the scaling recorded in an already standardized file (--like) to
    /// another, e.g. the test set. The output records the scaling.
    ///
    /// Dense data: every feature centred and scaled to unit variance. Sparse data keeps its
    /// zeros: features every row stores are centred and scaled, the others only scaled (by their
    /// standard deviation counting absent entries as zeros). Statistics in double precision,
    /// population deviation (as scikit-learn's StandardScaler); a feature with no spread keeps
    /// its scale.
    #[command(after_help = "Examples:\n  \
        peregrine data standardize train.pgd train.std.pgd\n  \
        peregrine data standardize test.pgd test.std.pgd --like train.std.pgd")]
    Standardize {
        /// The dataset file (sparse or dense).
        input: PathBuf,
        /// Output dataset: a new or regular file, not a link or an input (written aside,
        /// then renamed).
        output: PathBuf,
        /// Apply the scaling recorded in this standardized file instead of computing one from
        /// INPUT.
        #[arg(long, value_name = "FILE")]
        like: Option<PathBuf>,
    },
    /// Split a dataset at random into a training and a test file (both shuffled), e.g. the
    /// 90/10 split of MovieLens used for matrix factorization.
    Split {
        /// The dataset file.
        input: PathBuf,
        /// Training output: a new or regular file, not a link or an input (written aside,
        /// then renamed).
        #[arg(long, value_name = "FILE")]
        train: PathBuf,
        /// Test output: a new or regular file, not a link, an input or --train.
        #[arg(long, value_name = "FILE")]
        test: PathBuf,
        /// Fraction of the rows in the test set.
        #[arg(long, default_value_t = 0.1, value_name = "F")]
        test_fraction: f64,
        /// Seed of the shuffle.
        #[arg(long, default_value_t = 1, value_name = "N")]
        seed: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConvertCommand {
    /// LIBSVM/SVMlight text (`label index:value ...`, 1-based increasing indices, labels -1/+1 or
    /// 0/1) to a sparse binary-labelled dataset.
    Libsvm {
        /// Input text (gzip detected from the content).
        input: PathBuf,
        /// Output dataset: a new or regular file, not a link or an input (written aside,
        /// then renamed).
        output: PathBuf,
        /// Feature count (default: the largest index); an index beyond it is an error.
        #[arg(long, value_name = "N")]
        features: Option<u64>,
    },
    /// UCI bag-of-words `docword.*.txt` (header lines D, W, NNZ, then `docID wordID count`, IDs
    /// 1-based, sorted by document) to a sparse dataset of word counts for `--model lda`.
    Docword {
        /// Input text (gzip detected from the content).
        input: PathBuf,
        /// Output dataset: a new or regular file, not a link or an input (written aside,
        /// then renamed).
        output: PathBuf,
        /// Vocabulary size (default: the header's W); a word ID beyond it is an error.
        #[arg(long, value_name = "W")]
        vocabulary: Option<u64>,
    },
    /// LDA-C (Blei's lda-c: one document per line, `N id:count ...`, IDs 0-based) to a sparse
    /// dataset of word counts for `--model lda`.
    Ldac {
        /// Input text (gzip detected from the content).
        input: PathBuf,
        /// Output dataset: a new or regular file, not a link or an input (written aside,
        /// then renamed).
        output: PathBuf,
        /// Vocabulary size (default: the largest ID + 1); an ID at or beyond it is an error.
        #[arg(long, value_name = "W")]
        vocabulary: Option<u64>,
    },
    /// MNIST-style IDX (images idx3-ubyte + labels idx1-ubyte, gzipped or not) to a dense
    /// multiclass dataset, pixels scaled to [0, 1].
    Idx {
        /// Images file.
        #[arg(long)]
        images: PathBuf,
        /// Labels file.
        #[arg(long)]
        labels: PathBuf,
        /// Output dataset: a new or regular file, not a link or an input (written aside,
        /// then renamed).
        output: PathBuf,
    },
    /// CSV text (gzipped or not) to a dense multiclass dataset (softmax, MLP): one column the
    /// label, every other a number; a header line detected (a non-numeric field), quoted fields
    /// read; labels that are whole numbers 0..C are the classes, others are numbered in sorted
    /// order (numbers by value, names as text; at most 65,536 classes). A missing value is an
    /// error naming line and column.
    Csv {
        /// Input text.
        input: PathBuf,
        /// Output dataset: a new or regular file, not a link or an input (written aside,
        /// then renamed).
        output: PathBuf,
        /// The label column: a header name, or a number from 1 [default: the column called
        /// label, target, class or y, else the last].
        #[arg(long, value_name = "NAME|N")]
        label: Option<String>,
        /// Whether the first line is a header.
        #[arg(long, value_enum, default_value = "auto")]
        header: HeaderArg,
        /// Field delimiter (one character; `tab` for a tab).
        #[arg(long, default_value = ",", value_name = "C")]
        delimiter: String,
        /// Write a sparse binary-labelled dataset (logistic regression; zeros not stored): two
        /// classes, the second (1, or the later name in sorted order) positive.
        #[arg(long)]
        sparse: bool,
    },
    /// NumPy arrays (`numpy.save`) to a dense multiclass dataset (softmax, MLP): features of shape
    /// (rows, features) and labels of shape (rows,), whole numbers 0..C; bool, int, uint,
    /// float32 or float64, C or Fortran order. A NaN feature is an error naming its row and
    /// column.
    Npy {
        /// Features array (.npy).
        #[arg(long, value_name = "FILE")]
        features: PathBuf,
        /// Labels array (.npy).
        #[arg(long, value_name = "FILE")]
        labels: PathBuf,
        /// Output dataset: a new or regular file, not a link or an input (written aside,
        /// then renamed).
        output: PathBuf,
        /// Write a sparse binary-labelled dataset (logistic regression; zeros not stored): labels
        /// 0 and 1.
        #[arg(long)]
        sparse: bool,
    },
    /// Ratings text (`user item rating [timestamp]`; tab, space, comma or `::` separated; an
    /// optional header line; e.g. MovieLens) to a ratings dataset.
    Ratings {
        /// Input text.
        input: PathBuf,
        /// Output dataset: a new or regular file, not a link or an input (written aside,
        /// then renamed).
        output: PathBuf,
    },
}

/// `--header` of `data convert csv`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum HeaderArg {
    /// A header if a field of the first line other than the label's is not a number.
    Auto,
    /// The first line is a header.
    Yes,
    /// The first line is data.
    No,
}

#[derive(Debug, Args)]
pub struct Common {
    /// Seed: the same seed gives the same file.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Debug, Subcommand)]
pub enum GenCommand {
    /// Sparse binary-labelled rows with power-law feature frequencies (logistic regression).
    Sparse {
        /// Output dataset: a new or regular file, not a link (written aside, then renamed).
        output: PathBuf,
        /// Rows.
        #[arg(long, default_value_t = 100_000)]
        rows: u64,
        /// Features.
        #[arg(long, default_value_t = 100_000)]
        features: u64,
        /// Mean nonzeros per row.
        #[arg(long, default_value_t = 20)]
        nnz_per_row: u32,
        /// Zipf exponent of feature frequencies (0: uniform).
        #[arg(long, default_value_t = 1.1)]
        zipf: f64,
        #[command(flatten)]
        common: Common,
    },
    /// Dense multiclass rows from a known linear model (softmax regression, MLP).
    Dense {
        /// Output dataset: a new or regular file, not a link (written aside, then renamed).
        output: PathBuf,
        /// Rows.
        #[arg(long, default_value_t = 60_000)]
        rows: u64,
        /// Features.
        #[arg(long, default_value_t = 784)]
        features: u64,
        /// Classes.
        #[arg(long, default_value_t = 10)]
        classes: u32,
        /// Standard deviation of the label noise.
        #[arg(long, default_value_t = 0.1)]
        noise: f64,
        #[command(flatten)]
        common: Common,
    },
    /// One-hot (user, item) pairs with like/dislike labels (logistic regression on a long tail
    /// of rare ids, as a recommender's): features 0..users are the users, then the items; each
    /// row one of each, drawn from power laws; label 1 with probability sigmoid(w_user + w_item +
    /// N(0, noise)), the true weights N(0, 1) kept in the file.
    Onehot {
        /// Output dataset: a new or regular file, not a link (written aside, then renamed).
        output: PathBuf,
        /// Rows.
        #[arg(long, default_value_t = 100_000)]
        rows: u64,
        /// Users.
        #[arg(long, default_value_t = 1_000)]
        users: u64,
        /// Items.
        #[arg(long, default_value_t = 2_000)]
        items: u64,
        /// Zipf exponent of user and item frequencies (0: uniform).
        #[arg(long, default_value_t = 1.0)]
        zipf: f64,
        /// Standard deviation of the noise added to each row's logit.
        #[arg(long, default_value_t = 1.0)]
        noise: f64,
        #[command(flatten)]
        common: Common,
    },
    /// Ratings from a known low-rank matrix (matrix factorization).
    Ratings {
        /// Output dataset: a new or regular file, not a link (written aside, then renamed).
        output: PathBuf,
        /// Ratings.
        #[arg(long, default_value_t = 1_000_000)]
        ratings: u64,
        /// Users.
        #[arg(long, default_value_t = 10_000)]
        users: u64,
        /// Items.
        #[arg(long, default_value_t = 5_000)]
        items: u64,
        /// Rank of the true factors.
        #[arg(long, default_value_t = 10)]
        rank: u32,
        /// Standard deviation of the rating noise.
        #[arg(long, default_value_t = 0.1)]
        noise: f64,
        #[command(flatten)]
        common: Common,
    },
}

fn done(what: &str, out: &Path, c: Converted, start: Instant) {
    let secs = start.elapsed().as_secs_f64();
    let rate = if c.input_bytes > 0 {
        format!(", {:.0} MB/s of text", c.input_bytes as f64 / secs / 1e6)
    } else {
        String::new()
    };
    println!(
        "{what} {}: {} rows, {} columns, {} values in {secs:.2} s{rate}",
        out.display(),
        c.rows,
        c.cols,
        c.nnz
    );
}

/// Runs a dense converter into `output`, or, if `sparse`, into a temporary file of a unique name
/// (never one that was there) then rewritten at `output` as a sparse binary-labelled dataset (the
/// temporary file removed either way).
fn dense_or_sparse<T>(
    input: &Path,
    output: &Path,
    sparse: bool,
    convert: impl FnOnce(&Path) -> Result<T, peregrine_kernels::data::DataError>,
) -> Result<T, AppError> {
    if !sparse {
        return Ok(convert(output)?);
    }
    // Never committed: the dense file is removed when `dense` drops.
    let dense = AtomicFile::create(output)?;
    let tmp = dense.temp_path();
    let c = convert(tmp)?;
    peregrine_kernels::data::sparsify::sparsify(tmp, output).map_err(|e| match e {
        // Name the input, not the intermediate file.
        peregrine_kernels::data::DataError::Format { detail, .. } => {
            peregrine_kernels::data::DataError::Format { path: input.into(), detail }
        }
        e => e,
    })?;
    Ok(c)
}

/// Refuses, before any work, an output that is an input of the same command, a symbolic link or
/// an existing entry other than a regular file (see [`output`]).
fn check_outputs(cmd: &DataCommand) -> Result<(), AppError> {
    let out = "OUTPUT";
    match cmd {
        DataCommand::Convert(c) => match c {
            ConvertCommand::Libsvm { input, output, .. }
            | ConvertCommand::Docword { input, output, .. }
            | ConvertCommand::Ldac { input, output, .. }
            | ConvertCommand::Csv { input, output, .. }
            | ConvertCommand::Ratings { input, output } => output::check(out, output, &[("INPUT", input)]),
            ConvertCommand::Idx { images, labels, output } => {
                output::check(out, output, &[("--images", images), ("--labels", labels)])
            }
            ConvertCommand::Npy { features, labels, output, .. } => {
                output::check(out, output, &[("--features", features), ("--labels", labels)])
            }
        },
        DataCommand::Info { .. } => Ok(()),
        DataCommand::Gen(g) => match g {
            GenCommand::Sparse { output, .. }
            | GenCommand::Dense { output, .. }
            | GenCommand::Onehot { output, .. }
            | GenCommand::Ratings { output, .. } => output::check(out, output, &[]),
        },
        DataCommand::Standardize { input, output, like } => {
            let mut inputs = vec![("INPUT", input.as_path())];
            inputs.extend(like.as_deref().map(|l| ("--like", l)));
            output::check(out, output, &inputs)
        }
        DataCommand::Split { input, train, test, .. } => {
            output::check("--train", train, &[("INPUT", input)])?;
            output::check("--test", test, &[("INPUT", input), ("--train", train)])
        }
    }
}

pub fn run(cmd: DataCommand) -> Result<(), AppError> {
    let start = Instant::now();
    check_outputs(&cmd)?;
    match cmd {
        DataCommand::Convert(c) => match c {
            ConvertCommand::Libsvm { input, output, features } => {
                let c = libsvm::convert(&input, &output, features)?;
                done("wrote", &output, c, start);
            }
            ConvertCommand::Docword { input, output, vocabulary } => {
                let c = bow::convert(&input, &output, bow::Format::Docword, vocabulary)?;
                done("wrote", &output, c, start);
            }
            ConvertCommand::Ldac { input, output, vocabulary } => {
                let c = bow::convert(&input, &output, bow::Format::Ldac, vocabulary)?;
                done("wrote", &output, c, start);
            }
            ConvertCommand::Idx { images, labels, output } => {
                let c = idx::convert(&images, &labels, &output)?;
                done("wrote", &output, c, start);
            }
            ConvertCommand::Csv { input, output, label, header, delimiter, sparse } => {
                let delimiter = match delimiter.as_str() {
                    "tab" | "\\t" => b'\t',
                    d if d.len() == 1 && d.is_ascii() => d.as_bytes()[0],
                    d => {
                        return Err(AppError::Usage(format!(
                            "--delimiter must be one character or `tab`, got `{d}`"
                        )))
                    }
                };
                let label = match label {
                    None => csv::LabelColumn::Auto,
                    Some(l) => match l.parse::<usize>() {
                        Ok(0) => return Err(AppError::Usage("--label numbers columns from 1, got 0".into())),
                        Ok(n) => csv::LabelColumn::Number(n),
                        Err(_) => csv::LabelColumn::Name(l),
                    },
                };
                let header = match header {
                    HeaderArg::Auto => csv::Header::Auto,
                    HeaderArg::Yes => csv::Header::Yes,
                    HeaderArg::No => csv::Header::No,
                };
                let c = dense_or_sparse(&input, &output, sparse, |out| {
                    csv::convert(&input, out, &csv::CsvOptions { delimiter, header, label })
                })?;
                let name = c.label.1.as_ref().map(|n| format!(" (`{n}`)")).unwrap_or_default();
                println!(
                    "wrote {}{}: {} rows, {} feature columns in {:.2} s; label column {}{name}; classes {}",
                    output.display(),
                    if sparse { " (sparse, class 1 positive)" } else { "" },
                    c.rows,
                    c.cols,
                    start.elapsed().as_secs_f64(),
                    c.label.0,
                    class_list(&c.classes)
                );
            }
            ConvertCommand::Npy { features, labels, output, sparse } => {
                let c =
                    dense_or_sparse(&labels, &output, sparse, |out| npy::convert(&features, &labels, out))?;
                println!(
                    "wrote {}{}: {} rows, {} feature columns ({}), {} classes ({} labels) in {:.2} s",
                    output.display(),
                    if sparse { " (sparse)" } else { "" },
                    c.rows,
                    c.cols,
                    c.dtypes.0,
                    c.classes,
                    c.dtypes.1,
                    start.elapsed().as_secs_f64()
                );
            }
            ConvertCommand::Ratings { input, output } => {
                let c = ratings::convert(&input, &output)?;
                done("wrote", &output, c, start);
            }
        },
        DataCommand::Split { input, train, test, test_fraction, seed } => {
            let s = peregrine_kernels::data::split::split(&input, &train, &test, test_fraction, seed)?;
            println!(
                "wrote {} ({} rows) and {} ({} rows) in {:.2} s",
                train.display(),
                s.train,
                test.display(),
                s.test,
                start.elapsed().as_secs_f64()
            );
        }
        DataCommand::Standardize { input, output, like } => {
            use peregrine_kernels::data::standardize::{apply, Scaling};
            let cols = Dataset::open(&input)?.header().cols;
            let what = format!("{}: its {cols} features (header field `cols`)", input.display());
            crate::limits::fits(Scaling::memory(cols), &what, "a file of fewer features")?;
            let (scaling, from) = match &like {
                Some(l) => (Scaling::recorded(&Dataset::open(l)?)?, l),
                None => (Scaling::fit(&Dataset::open(&input)?)?, &input),
            };
            let c = apply(&input, &scaling, &output)?;
            let centred = scaling.shift.iter().filter(|&&v| v != 0.0).count();
            println!(
                "wrote {}: {} rows, {} features ({centred} centred) standardized by the statistics of {} in {:.2} s",
                output.display(),
                c.rows,
                c.cols,
                from.display(),
                start.elapsed().as_secs_f64()
            );
        }
        DataCommand::Info { file, verify } => {
            let ds = Dataset::open(&file)?;
            println!("{}", ds.summary(verify));
            if verify {
                ds.verify()?;
                println!("  verified: checksum and every index, label and value are valid");
            }
        }
        DataCommand::Gen(g) => match g {
            GenCommand::Sparse { output, rows, features, nnz_per_row, zipf, common } => {
                let spec = gen::SparseSpec { rows, cols: features, nnz_per_row, zipf, seed: common.seed };
                let what = format!("--rows {rows} and --features {features}");
                crate::limits::fits(spec.memory(), &what, "generate fewer rows or features")?;
                let c = gen::sparse(&spec, &output)?;
                done("generated", &output, c, start);
            }
            GenCommand::Dense { output, rows, features, classes, noise, common } => {
                let spec = gen::DenseSpec { rows, cols: features, classes, noise, seed: common.seed };
                let what = format!("--rows {rows}, --features {features} and --classes {classes}");
                crate::limits::fits(spec.memory(), &what, "generate fewer rows, features or classes")?;
                let c = gen::dense(&spec, &output)?;
                done("generated", &output, c, start);
            }
            GenCommand::Onehot { output, rows, users, items, zipf, noise, common } => {
                let spec = gen::OnehotSpec { rows, users, items, zipf, noise, seed: common.seed };
                let what = format!("--users {users} and --items {items}");
                crate::limits::fits(spec.memory(), &what, "generate fewer users or items")?;
                let c = gen::onehot(&spec, &output)?;
                done("generated", &output, c, start);
            }
            GenCommand::Ratings { output, ratings, users, items, rank, noise, common } => {
                let spec = gen::RatingsSpec { rows: ratings, users, items, rank, noise, seed: common.seed };
                let what = format!("--users {users}, --items {items} and --rank {rank}");
                crate::limits::fits(spec.memory(), &what, "generate fewer users or items, or a lower rank")?;
                let c = gen::ratings(&spec, &output)?;
                done("generated", &output, c, start);
            }
        },
    }
    Ok(())
}

/// The classes a CSV conversion found, ``0=`a`, 1=`b`, ...``: every one up to
/// [`LISTED_CLASSES`], else the first five, how many more, and the last two.
fn class_list(classes: &[String]) -> String {
    let show = |(i, y): (usize, &String)| format!("{i}=`{y}`");
    if classes.len() <= LISTED_CLASSES {
        return classes.iter().enumerate().map(show).collect::<Vec<_>>().join(", ");
    }
    let head: Vec<String> = classes.iter().enumerate().take(5).map(show).collect();
    let tail: Vec<String> = classes.iter().enumerate().skip(classes.len() - 2).map(show).collect();
    format!("{}, ... {} more ..., {}", head.join(", "), classes.len() - 7, tail.join(", "))
}

/// Classes listed in full after a CSV conversion.
const LISTED_CLASSES: usize = 20;
