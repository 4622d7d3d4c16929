//! Outputs: one rule for every file and directory a command writes at a path the user names.
//!
//! Before any work, a command checks each output it will write ([`check`], [`check_dir`],
//! [`check_outside_run`]) and refuses, with a usage error (exit 2) naming the flag and the path,
//! an output that
//! - is an input of the same command: the same file (device and inode, so also through another
//!   spelling of its path or a hard link), or the same path once resolved when one of them does
//!   not exist yet; or a file that `peregrine train` writes in a run directory the command reads;
//! - exists and is not a regular file: a character or block device (`/dev/null`), a FIFO, a
//!   socket, a directory (a command that takes `-` for standard output handles `-` itself);
//! - is a symbolic link: no link is followed silently; the message says where it points, so that
//!   the user can give that path if it is meant.
//!
//! A refused command has written nothing. Files are then written through [`AtomicFile`]: a
//! temporary file of a unique name beside the target, created only where no file has that name,
//! renamed onto the target when complete and removed on every other path (an error, unwinding).

use std::fs::{File, Metadata};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::AppError;

fn usage(message: String) -> AppError {
    AppError::Usage(message)
}

/// Refuses `path` as the output file of `flag` if it is a symbolic link, exists and is not a
/// regular file, or is one of `inputs` (`(flag, path)` of each file the command reads, and of
/// its other outputs).
pub fn check(flag: &str, path: &Path, inputs: &[(&str, &Path)]) -> Result<(), AppError> {
    if let Some(m) = existing(flag, path)? {
        if !m.is_file() {
            let hint = if m.is_dir() { "give a file's path" } else { "give a regular file's path" };
            return Err(usage(format!(
                "{flag} {} exists and is {}, not a regular file: refusing to replace it; {hint}",
                path.display(),
                kind(&m)
            )));
        }
    }
    for &(input_flag, input) in inputs {
        if same_file(path, input) {
            return Err(usage(format!(
                "{flag} {} is the same file as {input_flag} {}: an output must be a file of its own \
                 (writing it would destroy the other); give another path",
                path.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

/// Refuses `path` as the output directory of `flag` if it is a symbolic link or exists and is
/// not a directory (an existing directory is fine).
pub fn check_dir(flag: &str, path: &Path) -> Result<(), AppError> {
    match existing(flag, path)? {
        Some(m) if !m.is_dir() => Err(usage(format!(
            "{flag} {} exists and is {}, not a directory; give a directory's path",
            path.display(),
            kind(&m)
        ))),
        _ => Ok(()),
    }
}

/// Refuses `path` as the output file of `flag` if it is one of the files (or lies in one of the
/// folders) that `peregrine train` writes in `run_dir`, a run directory the command reads
/// (given by `run_flag`): whether or not that file exists now.
pub fn check_outside_run(flag: &str, path: &Path, run_flag: &str, run_dir: &Path) -> Result<(), AppError> {
    let Ok(run) = run_dir.canonicalize() else { return Ok(()) };
    let target = resolve(path);
    let Some(Component::Normal(first)) = target.strip_prefix(&run).ok().and_then(|r| r.components().next())
    else {
        return Ok(());
    };
    let first = first.to_string_lossy();
    if crate::run_dir::is_run_entry(&first) {
        return Err(usage(format!(
            "{flag} {} is {} of the run directory {run_flag} {}, which `peregrine train` writes and \
             this command reads; give a path outside it, or another name",
            path.display(),
            if target == run.join(first.as_ref()) { "a file" } else { "in a folder" },
            run_dir.display()
        )));
    }
    Ok(())
}

/// The entry at `path` itself (a link not followed), or `None` if there is none; an error if it
/// is a symbolic link.
fn existing(flag: &str, path: &Path) -> Result<Option<Metadata>, AppError> {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(AppError::Io { what: format!("{flag} {}", path.display()), source }),
    };
    if m.file_type().is_symlink() {
        let to = match std::fs::read_link(path) {
            Ok(to) if to.is_relative() => path.parent().unwrap_or(Path::new("")).join(to),
            Ok(to) => to,
            Err(source) => {
                return Err(AppError::Io {
                    what: format!("{flag} {}: reading the link", path.display()),
                    source,
                })
            }
        };
        return Err(usage(format!(
            "{flag} {} is a symbolic link to {}; outputs follow no links: give that path if it is meant",
            path.display(),
            to.display()
        )));
    }
    Ok(Some(m))
}

/// What an entry is, in words.
fn kind(m: &Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

/// Whether `a` and `b` name the same file: the same device and inode when both exist (links
/// followed), else the same path once resolved.
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        (Err(_), Err(_)) => resolve(a) == resolve(b),
        _ => false,
    }
}

/// `path` made absolute with every link of its existing part resolved; the part that does not
/// exist yet appended as written.
fn resolve(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
            resolve(parent).join(name)
        }
        _ => std::env::current_dir().map_or_else(|_| path.to_owned(), |d| d.join(path)),
    }
}

/// Temporary files made by this process so far: with the process id, a name no other writer
/// takes.
static TEMPS: AtomicU64 = AtomicU64::new(0);

/// A file written under a unique temporary name beside its target and renamed onto it by
/// [`commit`](Self::commit); dropped uncommitted, the temporary file is removed. The temporary
/// name keeps the target's extension (`pred.csv` -> `pred.tmp-<pid>-<n>.csv`), for writers that
/// pick a format by it.
#[derive(Debug)]
pub struct AtomicFile {
    file: Option<File>,
    temp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl AtomicFile {
    /// Creates the temporary file for `target` (the target itself untouched until
    /// [`commit`](Self::commit)); refuses a target that is a symbolic link or exists and is not
    /// a regular file.
    pub fn create(target: &Path) -> Result<Self, AppError> {
        check("output", target, &[])?;
        let name =
            target.file_name().ok_or_else(|| usage(format!("output {} names no file", target.display())))?;
        let name = Path::new(name);
        let stem = name.file_stem().unwrap_or(name.as_os_str()).to_string_lossy();
        let ext = name.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
        loop {
            let n = TEMPS.fetch_add(1, Ordering::Relaxed);
            let temp = target.with_file_name(format!("{stem}.tmp-{}-{n}{ext}", std::process::id()));
            match File::options().write(true).create_new(true).open(&temp) {
                Ok(file) => {
                    return Ok(Self { file: Some(file), temp, target: target.to_owned(), committed: false })
                }
                // Left by an earlier process of the same id: never opened, another name taken.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(source) => {
                    return Err(AppError::Io { what: format!("creating {}", temp.display()), source })
                }
            }
        }
    }

    /// The temporary file's path, for writers that open a path themselves (they replace the
    /// empty file this process made there).
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// Closes the temporary file and renames it onto the target (removed if that fails).
    pub fn commit(mut self) -> Result<(), AppError> {
        drop(self.file.take());
        std::fs::rename(&self.temp, &self.target).map_err(|source| AppError::Io {
            what: format!("renaming {} to {}", self.temp.display(), self.target.display()),
            source,
        })?;
        self.committed = true;
        Ok(())
    }

    fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("the temporary file is open until commit")
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file().flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        drop(self.file.take());
        if !self.committed {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Writes `bytes` to `path` through an [`AtomicFile`] (its folder created if missing), so that
/// `path` is never half-written and no temporary file stays behind.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), AppError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|source| AppError::Io { what: format!("creating {}", dir.display()), source })?;
    }
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes)
        .map_err(|source| AppError::Io { what: format!("writing {}", file.temp_path().display()), source })?;
    file.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(r: Result<(), AppError>) -> String {
        match r {
            Err(AppError::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn a_new_or_regular_file_that_is_no_input_is_fine() {
        let d = tempfile::tempdir().expect("tmp");
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::write(&a, "a").expect("write");
        check("--out", &b, &[("--in", &a)]).expect("new file");
        std::fs::write(&b, "b").expect("write");
        check("--out", &b, &[("--in", &a)]).expect("regular file");
        check_dir("--dir", d.path()).expect("existing directory");
        check_dir("--dir", &d.path().join("new")).expect("new directory");
    }

    #[test]
    fn an_input_is_refused_by_any_spelling_or_hard_link() {
        let d = tempfile::tempdir().expect("tmp");
        let a = d.path().join("a.csv");
        std::fs::write(&a, "a").expect("write");
        std::fs::create_dir(d.path().join("sub")).expect("mkdir");
        let spelled = d.path().join("sub/../a.csv");
        let m = message(check("OUTPUT", &spelled, &[("INPUT", &a)]));
        assert!(m.contains("OUTPUT") && m.contains("INPUT") && m.contains("a.csv"), "{m}");
        let linked = d.path().join("hard.csv");
        std::fs::hard_link(&a, &linked).expect("link");
        message(check("OUTPUT", &linked, &[("INPUT", &a)]));
        // Two outputs of one command that do not exist yet, by different spellings.
        let (x, y) = (d.path().join("x.pgd"), d.path().join("sub/../x.pgd"));
        message(check("--test", &y, &[("--train", &x)]));
        assert_eq!(std::fs::read(&a).expect("read"), b"a");
    }

    #[test]
    fn devices_fifos_directories_and_links_are_refused() {
        let d = tempfile::tempdir().expect("tmp");
        for (path, says) in [(Path::new("/dev/null"), "a character device"), (d.path(), "a directory")] {
            let m = message(check("--out", path, &[]));
            assert!(m.contains(says) && m.contains(&path.display().to_string()), "{m}");
        }
        let fifo = d.path().join("fifo");
        let status = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
        assert!(status.success());
        assert!(message(check("--out", &fifo, &[])).contains("FIFO"));
        assert!(message(check_dir("--out", &fifo)).contains("not a directory"));
        let link = d.path().join("link");
        std::os::unix::fs::symlink("target.csv", &link).expect("symlink");
        let m = message(check("--out", &link, &[]));
        assert!(
            m.contains("symbolic link to") && m.contains(&d.path().join("target.csv").display().to_string()),
            "{m}"
        );
        std::os::unix::fs::symlink(d.path(), d.path().join("dirlink")).expect("symlink");
        assert!(message(check_dir("--out", &d.path().join("dirlink"))).contains("symbolic link"));
        assert!(message(check_dir("--out", Path::new("/dev/null"))).contains("not a directory"));
    }

    #[test]
    fn a_run_directory_keeps_its_files() {
        let d = tempfile::tempdir().expect("tmp");
        let run = d.path().join("run");
        std::fs::create_dir_all(run.join("metrics")).expect("mkdir");
        for name in ["model.safetensors", "summary.json", "checkpoint.safetensors", "metrics/rank-0.jsonl"] {
            let m = message(check_outside_run("--out", &run.join(name), "--model", &run));
            assert!(m.contains(name) && m.contains("--model"), "{m}");
        }
        check_outside_run("--out", &run.join("predictions.csv"), "--model", &run).expect("another name");
        check_outside_run("--out", &d.path().join("summary.json"), "--model", &run).expect("outside");
        // Another spelling of the run directory.
        let m =
            message(check_outside_run("--out", &d.path().join("run/../run/config.toml"), "--model", &run));
        assert!(m.contains("config.toml"), "{m}");
    }

    #[test]
    fn an_atomic_file_appears_whole_on_commit_and_leaves_nothing_otherwise() {
        let d = tempfile::tempdir().expect("tmp");
        let target = d.path().join("out.csv");
        std::fs::write(&target, "old").expect("write");
        let mut f = AtomicFile::create(&target).expect("create");
        assert!(f.temp_path().display().to_string().ends_with(".csv"));
        f.write_all(b"new").expect("write");
        assert_eq!(std::fs::read(&target).expect("read"), b"old");
        f.commit().expect("commit");
        assert_eq!(std::fs::read(&target).expect("read"), b"new");
        let mut f = AtomicFile::create(&target).expect("create");
        f.write_all(b"dropped").expect("write");
        drop(f);
        assert_eq!(std::fs::read(&target).expect("read"), b"new");
        let names: Vec<_> =
            std::fs::read_dir(d.path()).expect("ls").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names, ["out.csv"]);
    }

    #[test]
    fn a_failed_rename_leaves_no_temporary_file() {
        let d = tempfile::tempdir().expect("tmp");
        let target = d.path().join("dir");
        let f = AtomicFile::create(&target).expect("create");
        // The target becomes a non-empty directory before the rename: the rename fails.
        std::fs::create_dir_all(target.join("x")).expect("mkdir");
        assert!(matches!(f.commit(), Err(AppError::Io { .. })));
        let names: Vec<_> =
            std::fs::read_dir(d.path()).expect("ls").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names, ["dir"]);
    }

    #[test]
    fn a_temporary_name_already_taken_is_never_opened() {
        let d = tempfile::tempdir().expect("tmp");
        let target = d.path().join("t.json");
        let next = TEMPS.load(Ordering::Relaxed);
        // Names this process may take next, already there (a stranger's files).
        for n in next..next + 64 {
            std::fs::write(d.path().join(format!("t.tmp-{}-{n}.json", std::process::id())), "theirs")
                .expect("write");
        }
        write_atomically(&target, b"ours").expect("write");
        assert_eq!(std::fs::read(&target).expect("read"), b"ours");
        for n in next..next + 64 {
            let p = d.path().join(format!("t.tmp-{}-{n}.json", std::process::id()));
            assert_eq!(std::fs::read(p).expect("still there"), b"theirs");
        }
    }
}
