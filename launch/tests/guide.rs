//! The guide's quick paths, run as a user would type them: every chapter of the book's Guide part
//! (docs/book/src/SUMMARY.md, between `# Guide` and the next part) has a code block whose info
//! string is `sh,quick-path`: commands a user can paste as they are. Each such block runs as one `bash -euo pipefail` script in a
//! fresh directory that holds the repository's `tests/` and `configs/` (what the commands name) and
//! has this build's `peregrine` on `PATH`; every command must succeed.
//!
//! Tags after `quick-path`: `mpi` blocks run in the MPI build only (`--features mpi`, where
//! `mpirun` is there); `ci` blocks are commands of `scripts/` that the test script runs itself
//! (checked here to appear in `scripts/test.sh`, not run again; `scripts/test.sh` is the test
//! script itself).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/cli_common.rs"]
mod common;
use common::scratch;

/// Guide chapters without a quick path, and why.
const NO_QUICK_PATH: &[(&str, &str)] = &[
    ("faults.md", "its commands are the failures it describes"),
    ("predictors.md", "a benchmark of several minutes (scripts/experiment.sh predictors)"),
    ("building.md", "cargo builds, which the test script runs"),
];

/// How long one quick path may take before the test fails (a hang is a failure, not a wait).
const LIMIT: Duration = Duration::from_secs(300);

struct Block {
    chapter: String,
    line: usize,
    tags: Vec<String>,
    body: String,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The Guide part's chapter files, in the order SUMMARY.md lists them.
fn guide_chapters(root: &Path) -> Vec<String> {
    let summary = std::fs::read_to_string(root.join("docs/book/src/SUMMARY.md")).expect("SUMMARY.md");
    let mut inside = false;
    let mut chapters = Vec::new();
    for line in summary.lines() {
        if let Some(part) = line.strip_prefix("# ") {
            inside = part.trim() == "Guide";
            continue;
        }
        if inside {
            if let Some(file) = line.split("](").nth(1).and_then(|rest| rest.split(')').next()) {
                chapters.push(file.to_owned());
            }
        }
    }
    chapters
}

/// The fenced code blocks of `text` whose info string carries `quick-path`.
fn quick_paths(chapter: &str, text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        match (&mut open, line.trim_start().strip_prefix("```")) {
            (None, Some(info)) => {
                let tags: Vec<String> = info.split(',').map(|t| t.trim().to_owned()).collect();
                let block = Block { chapter: chapter.to_owned(), line: i + 1, tags, body: String::new() };
                open = Some(block);
            }
            (Some(_), Some(_)) => {
                let block = open.take().expect("an open block");
                if block.tags.iter().any(|t| t == "quick-path") {
                    blocks.push(block);
                }
            }
            (Some(block), None) => {
                block.body.push_str(line);
                block.body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{chapter}: a code block is never closed");
    blocks
}

fn every_quick_path() -> Vec<Block> {
    let root = root();
    let mut all = Vec::new();
    let mut missing = Vec::new();
    for chapter in guide_chapters(&root) {
        let text = std::fs::read_to_string(root.join("docs/book/src").join(&chapter)).expect("a chapter");
        let blocks = quick_paths(&chapter, &text);
        let exempt = NO_QUICK_PATH.iter().any(|(c, _)| *c == chapter);
        if blocks.is_empty() != exempt {
            missing.push(chapter);
        }
        all.extend(blocks);
    }
    assert!(
        missing.is_empty(),
        "every Guide chapter has a quick path (```sh,quick-path), but for those exempt in \
         NO_QUICK_PATH, which have none: {missing:?}"
    );
    all
}

/// Runs `block` in a fresh directory; the reason when it fails.
fn run(block: &Block) -> Result<(), String> {
    let root = root();
    let dir = scratch("guide");
    for shared in ["tests", "configs"] {
        std::os::unix::fs::symlink(root.join(shared), dir.path().join(shared)).expect("link");
    }
    let bin = dir.path().join(".bin");
    std::fs::create_dir(&bin).expect("bin dir");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_peregrine"), bin.join("peregrine")).expect("link");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let log = dir.path().join(".log");
    let out = std::fs::File::create(&log).expect("log");
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block.body])
        .current_dir(dir.path())
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        // Its own process group, so that a block past its limit ends with every process it started.
        .process_group(0)
        .spawn()
        .expect("bash");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if start.elapsed() > LIMIT {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let tail: String =
        output.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    match status {
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(format!("{}:{}: {s}\n{tail}", block.chapter, block.line)),
        None => Err(format!("{}:{}: still running after {LIMIT:?}\n{tail}", block.chapter, block.line)),
    }
}

/// `ci` blocks: each command is one the test script runs (its words, after `bash `, start a line
/// of scripts/test.sh).
fn check_in_test_script(block: &Block) -> Result<(), String> {
    let script = std::fs::read_to_string(root().join("scripts/test.sh")).expect("scripts/test.sh");
    let runs: Vec<String> = script
        .lines()
        .map(|l| l.trim().trim_start_matches("bash ").trim_start_matches("./").to_owned())
        .collect();
    for command in block.body.lines().map(|l| l.split('#').next().unwrap_or("").trim()) {
        let command = command.trim_start_matches("./");
        if command.is_empty() || command == "scripts/test.sh" {
            continue;
        }
        if !runs.iter().any(|r| r.starts_with(command)) {
            return Err(format!(
                "{}:{}: `{command}` is not run by scripts/test.sh",
                block.chapter, block.line
            ));
        }
    }
    Ok(())
}

#[test]
fn every_command_of_the_guides_quick_paths_succeeds() {
    let mpi_build = cfg!(feature = "mpi");
    let mut failures = Vec::new();
    let mut ran = 0;
    for block in every_quick_path() {
        let tagged = |t: &str| block.tags.iter().any(|x| x == t);
        let result = if tagged("ci") {
            check_in_test_script(&block)
        } else if tagged("mpi") && !mpi_build {
            continue;
        } else {
            ran += 1;
            run(&block)
        };
        if let Err(e) = result {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "quick paths that failed:\n\n{}", failures.join("\n\n"));
    assert!(ran >= 10, "only {ran} quick paths ran");
}

#[test]
fn a_quick_path_block_is_found_with_its_tags_and_body() {
    let text = "# T\n\n```sh,quick-path,mpi\nmpirun -n 2 peregrine conformance\n```\n\n```sh\nno\n```\n";
    let blocks = quick_paths("t.md", text);
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].line, 3);
    assert_eq!(blocks[0].tags, ["sh", "quick-path", "mpi"]);
    assert_eq!(blocks[0].body, "mpirun -n 2 peregrine conformance\n");
}
