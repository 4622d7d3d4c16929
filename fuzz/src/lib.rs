//! What the fuzz targets share: inputs written to files, since every parser reads a file as the
//! command does (a dataset is memory-mapped, a text file may be gzipped).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// This process's scratch directory: `$TMPDIR/peregrine-fuzz-<pid>` (scripts/fuzz.sh points
/// TMPDIR at a directory it removes afterwards).
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("peregrine-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("creating the scratch directory");
        d
    })
}

/// Writes `bytes` to the scratch file `name` and returns its path.
pub fn file(name: &str, bytes: &[u8]) -> PathBuf {
    let p = scratch().join(name);
    std::fs::write(&p, bytes).expect("writing a scratch file");
    p
}

/// Splits an input in two at the position its first two bytes give (for commands that read two
/// files: images and labels, features and labels).
pub fn two(data: &[u8]) -> (&[u8], &[u8]) {
    if data.len() < 2 {
        return (data, &[]);
    }
    let (head, rest) = data.split_at(2);
    let at = usize::from(u16::from_le_bytes([head[0], head[1]])) % (rest.len() + 1);
    rest.split_at(at)
}

/// The output file of a conversion (removed before each run: a converter that fails must leave
/// nothing, which the targets check).
pub fn output() -> PathBuf {
    let p = scratch().join("out.pgd");
    let _ = std::fs::remove_file(&p);
    p
}

/// After a conversion: a file written must open and verify, one not written must not exist.
pub fn check_output<T, E: std::fmt::Display>(result: Result<T, E>, out: &Path) {
    match result {
        Ok(_) => {
            let ds = peregrine_kernels::data::Dataset::open(out).expect("a converted file opens");
            ds.verify().expect("a converted file verifies");
        }
        Err(_) => assert!(!out.exists(), "a failed conversion left {}", out.display()),
    }
}
