//! A run directory's lock, and the files a training run writes there.
//!
//! Rank 0 holds an exclusive `flock` on `<run-dir>/.lock` for the run's life: a second run into
//! the same directory is refused at once, naming the holder (its host, process and start, which
//! the holder writes into the file). The kernel releases the lock with the process, however it
//! ends, so a killed run leaves no stale lock. The file itself stays: removing a lock file that
//! another process may already have opened would let two runs each lock a different file.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::AppError;

/// The lock file's name in a run directory.
pub const LOCK_FILE: &str = ".lock";

/// Files a training run writes in its run directory (and their temporary names while being
/// written), removed by `--force` and before a run starts afresh there.
const RUN_FILES: &[&str] = &[
    "config.toml",
    "meta.json",
    "summary.json",
    "model.safetensors",
    "trace.json",
    "checkpoint.safetensors",
    "checkpoint.prev.safetensors",
];

/// Whether a file name in one of [`RUN_DIRS`] is the run's.
type Ours = fn(&str) -> bool;

/// Directories a run writes, with the files it writes in them (`rank-<n>.jsonl`: one a rank,
/// `*.npy` and `meta.json`: the `--npy` export).
const RUN_DIRS: &[(&str, Ours)] = &[
    ("metrics", |n| is_rank_file(n, ".jsonl")),
    ("trace-parts", |n| is_rank_file(n, ".jsonl")),
    ("model", |n| n.ends_with(".npy") || n == "meta.json"),
];

/// `rank-<digits><suffix>`.
fn is_rank_file(name: &str, suffix: &str) -> bool {
    name.strip_prefix("rank-")
        .and_then(|n| n.strip_suffix(suffix))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `name` is one of [`RUN_FILES`] or a temporary file of one (`NAME.tmp`, `NAME.tmp.*`,
/// and `STEM.tmp-*.EXT`, what [`crate::output::AtomicFile`] writes).
fn is_run_file(name: &str) -> bool {
    RUN_FILES.iter().any(|f| {
        let (stem, ext) = f.rsplit_once('.').unwrap_or((f, ""));
        name == *f
            || name.strip_prefix(f).is_some_and(|t| t.starts_with(".tmp"))
            || name.strip_prefix(stem).and_then(|t| t.strip_prefix(".tmp-")).is_some_and(|t| {
                t.strip_suffix(ext).is_some_and(|t| t.ends_with('.') && !t[..t.len() - 1].contains('.'))
            })
    })
}

/// Whether `name`, an entry of a run directory, is one a run writes (a file of [`RUN_FILES`], a
/// folder of [`RUN_DIRS`], a checkpoint of any command: `checkpoint.*`).
pub fn is_run_entry(name: &str) -> bool {
    is_run_file(name) || RUN_DIRS.iter().any(|(d, _)| *d == name) || name.starts_with("checkpoint")
}

/// The run directory's lock, held while this value lives.
#[derive(Debug)]
pub struct Lock {
    _file: File,
}

impl Lock {
    /// Takes the lock of `dir` (creating the directory if needed), or says who holds it.
    pub fn take(dir: &Path) -> Result<Lock, AppError> {
        let io = |what: String| move |source| AppError::Io { what, source };
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let path = dir.join(LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(0o644)
            .open(&path)
            .map_err(io(format!("opening the run directory's lock {}", path.display())))?;
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(AppError::Io { what: format!("locking {}", path.display()), source: e });
            }
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Err(AppError::Usage(format!(
                "{} is in use by another run ({}); wait for it to end, or give another --run-dir",
                dir.display(),
                holder(&text)
            )));
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let text = format!("pid={} host={} started={now}\n", std::process::id(), host.trim());
        // The holder's description is a courtesy to the next run; the lock holds without it.
        let _ = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| file.write_all(text.as_bytes()));
        Ok(Lock { _file: file })
    }
}

/// The holder as its lock file describes it, in words.
fn holder(text: &str) -> String {
    let field =
        |k: &str| text.split_whitespace().find_map(|f| f.strip_prefix(k).and_then(|v| v.strip_prefix('=')));
    match (field("pid"), field("host")) {
        (Some(pid), Some(host)) => {
            let since = field("started").and_then(|s| s.parse::<u64>().ok()).map(|s| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(s, |d| d.as_secs());
                format!(", started {} s ago", now.saturating_sub(s))
            });
            format!("process {pid} on {host}{}", since.unwrap_or_default())
        }
        _ => "a process that has just started".into(),
    }
}

/// Removes what a training run wrote in `dir` (and only that: files of other names stay): the
/// files it returns. For `--force`, and for a run that starts afresh where an earlier one
/// stopped before its first checkpoint (whose metrics, of more ranks perhaps, would otherwise
/// stay beside the new run's).
pub fn clear(dir: &Path) -> Result<Vec<PathBuf>, AppError> {
    let mut removed = Vec::new();
    let remove = |p: PathBuf, removed: &mut Vec<PathBuf>| match std::fs::remove_file(&p) {
        Ok(()) => {
            removed.push(p);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(AppError::Io { what: format!("removing {}", p.display()), source: e }),
    };
    for name in names(dir)? {
        if is_run_file(&name) && !dir.join(&name).is_dir() {
            remove(dir.join(name), &mut removed)?;
        }
    }
    for (sub, ours) in RUN_DIRS {
        let sub = dir.join(sub);
        if !sub.is_dir() || sub.is_symlink() {
            continue;
        }
        for name in names(&sub)? {
            if ours(&name) {
                remove(sub.join(name), &mut removed)?;
            }
        }
        // Only if nothing else is in it.
        let _ = std::fs::remove_dir(&sub);
    }
    Ok(removed)
}

/// The names in `dir` (none if it does not exist).
fn names(dir: &Path) -> Result<Vec<String>, AppError> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries.flatten().filter_map(|e| e.file_name().into_string().ok()).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(AppError::Io { what: format!("reading {}", dir.display()), source: e }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_freed_with_the_first() {
        let d = tempfile::tempdir().expect("tempdir");
        let dir = d.path().join("run");
        let first = Lock::take(&dir).expect("first");
        let e = Lock::take(&dir).expect_err("second").to_string();
        assert!(e.contains("is in use by another run (process "), "{e}");
        assert!(e.contains(&format!("process {} on ", std::process::id())), "{e}");
        drop(first);
        Lock::take(&dir).expect("free again");
    }

    #[test]
    fn a_lock_file_that_is_a_symlink_is_not_followed() {
        let d = tempfile::tempdir().expect("tempdir");
        let target = d.path().join("precious");
        std::fs::write(&target, b"keep").expect("write");
        std::os::unix::fs::symlink(&target, d.path().join(LOCK_FILE)).expect("symlink");
        assert!(Lock::take(d.path()).is_err());
        assert_eq!(std::fs::read(&target).expect("read"), b"keep");
    }

    #[test]
    fn clearing_removes_the_runs_files_only() {
        let d = tempfile::tempdir().expect("tempdir");
        let dir = d.path();
        for f in [
            "config.toml",
            "summary.json",
            "model.safetensors",
            "checkpoint.safetensors",
            "checkpoint.prev.safetensors",
            "checkpoint.safetensors.tmp",
            "trace.json",
            "mine.txt",
            "config.toml.orig",
            "metrics/rank-0.jsonl",
            "metrics/rank-3.jsonl",
            "metrics/notes.md",
            "model/params.npy",
            "model/meta.json",
            "trace-parts/rank-1.jsonl",
        ] {
            let p = dir.join(f);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, b"x").expect("write");
        }
        let removed = clear(dir).expect("clear");
        assert_eq!(removed.len(), 12, "{removed:?}");
        for kept in ["mine.txt", "config.toml.orig", "metrics/notes.md"] {
            assert!(dir.join(kept).exists(), "{kept}");
        }
        assert!(!dir.join("model").exists() && !dir.join("trace-parts").exists());
    }

    #[test]
    fn run_files_and_their_temporaries_are_recognised() {
        for ours in [
            "summary.json",
            "summary.json.tmp",
            "checkpoint.safetensors.tmp",
            "summary.tmp-42-0.json",
            "model.tmp-42-3.safetensors",
            "checkpoint.prev.tmp-1-0.safetensors",
        ] {
            assert!(is_run_file(ours), "{ours}");
        }
        for theirs in
            ["summary.json.bak", "data.pgd", "config.tomlx", ".lock", "summary.tmp-1.x.json", "mine.json"]
        {
            assert!(!is_run_file(theirs), "{theirs}");
        }
        assert!(is_run_entry("metrics") && is_run_entry("checkpoint.json") && !is_run_entry("notes"));
        assert!(is_rank_file("rank-12.jsonl", ".jsonl"));
        assert!(!is_rank_file("rank-.jsonl", ".jsonl") && !is_rank_file("rank-1a.jsonl", ".jsonl"));
    }
}
