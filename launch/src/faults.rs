//! Faults turned into errors that name what and where: a panic in any thread, a dataset that
//! shrinks while mapped, a dataset whose bytes contradict its header, a write past the file size
//! limit.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use peregrine_kernels::data::{combine_crcs, shard, Dataset};
use peregrine_transport::{ReduceOp, Transport};

use crate::error::AppError;

/// Exit code of a process ended by a panic (Rust's own).
pub const EXIT_PANIC: i32 = 101;

/// Installs the process-wide handlers: a panic in any thread (a rank's loop, a compute thread,
/// a watchdog) prints the panic, then a line naming the rank and thread, and ends the whole
/// job: `MPI_Abort` under MPI, the process otherwise (local ranks share it). A panicking thread
/// would otherwise leave its peers waiting for chunks or clocks that never come. And the
/// `SIGBUS` guard of mapped datasets, and `SIGXFSZ` ignored: a write past the file size limit
/// (`ulimit -f`, a batch system's) then fails as a full disk does, with an error naming the file,
/// and its temporary file is removed, instead of the signal ending the process mid-write.
pub fn install() -> Result<(), AppError> {
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler code; it runs on the
    // main thread at start, before any other thread exists.
    if unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) } == libc::SIG_ERR {
        return Err(AppError::Io {
            what: "ignoring SIGXFSZ".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if output_closed(info) {
            // The reader of the output went away (`peregrine ... | head`): not a bug. The job
            // ends quietly, with the status of a Unix tool that SIGPIPE ended.
            end_job(EXIT_PIPE);
        }
        // Our line first, in one write, and the default hook's message and backtrace after it:
        // symbolizing a backtrace can take seconds, and under MPICH the launcher once ended the
        // process (a peer had aborted) while it was still printing one, before this line.
        let thread = std::thread::current();
        let who = who(
            thread.name().unwrap_or("unnamed"),
            peregrine_transport::process_rank(),
            peregrine_core::pool::standing_in_for(),
        );
        let modified = peregrine_kernels::data::guard::modified();
        if modified.is_empty() {
            crate::say(format_args!(
                "error: {who} panicked: this is a bug in Peregrine (please report it with the \
                 panic message that follows); ending the job"
            ));
        } else {
            crate::say(format_args!(
                "error: {who} failed while this run's datasets were modified in place under it: \
                 {}. A dataset must not change while a job reads it: write the new one to another file \
                 and rename it into place; ending the job",
                modified.join(", ")
            ));
        }
        default(info);
        end_job(EXIT_PANIC);
    }));
    peregrine_kernels::data::guard::install()
        .map_err(|source| AppError::Io { what: "installing the SIGBUS handler".into(), source })
}

/// Exit code of a process whose standard output or error was closed by its reader (the shells' 128 +
/// SIGPIPE: Rust ignores the signal, so a print fails instead and panics).
pub const EXIT_PIPE: i32 = 128 + libc::SIGPIPE;

/// Whether a panic is a print to standard output or error that failed because its reader closed
/// it.
fn output_closed(info: &std::panic::PanicHookInfo<'_>) -> bool {
    let p = info.payload();
    let msg = p.downcast_ref::<String>().map(String::as_str).or_else(|| p.downcast_ref::<&str>().copied());
    msg.is_some_and(closed_output_message)
}

/// Whether `msg` is the panic of a print whose reader closed the pipe (the standard library's
/// words: "failed printing to stdout: Broken pipe (os error 32)").
fn closed_output_message(msg: &str) -> bool {
    let print = msg.starts_with("failed printing to stdout") || msg.starts_with("failed printing to stderr");
    print && msg.ends_with(&format!("(os error {})", libc::EPIPE))
}

/// How long `MPI_Abort` may take before the process ends without it.
const ABORT_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Ends the whole job with `code`: `MPI_Abort` under MPI, then the process. MPI_Abort may itself
/// hang (MPICH, a peer inside MPI_Finalize): the process ends within ABORT_GRACE whatever it
/// does, and the launcher then ends the others.
fn end_job(code: i32) -> ! {
    std::thread::spawn(move || {
        std::thread::sleep(ABORT_GRACE);
        exit_now(code);
    });
    peregrine_transport::abort_world(code);
    exit_now(code);
}

fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` ends the process without running exit handlers, which could wait for the
    // threads that wait for the panicked one; every file that matters is written aside and
    // renamed into place, so nothing is left half-written.
    unsafe { libc::_exit(code) }
}

/// "rank R, compute thread W (pgr-sRwW)" from a thread's name: local ranks run as threads
/// `rank-R` with compute threads `pgr-sRwW` (R the rank's slot); under MPI the process's rank
/// decides. A rank's loop thread (`rank-R`, or `main` under MPI) that ran its one compute
/// thread's job itself (`standing_in`, see `peregrine_core::pool`) is named as that compute
/// thread, on the loop thread.
fn who(name: &str, mpi_rank: Option<usize>, standing_in: Option<usize>) -> String {
    let (rank, mut what) = if let Some(r) = name.strip_prefix("rank-") {
        (r.parse().ok(), "its loop thread".to_owned())
    } else if let Some((slot, w)) = name.strip_prefix("pgr-s").and_then(|s| s.split_once('w')) {
        (slot.parse().ok(), format!("compute thread {w}"))
    } else if name == "main" {
        (None, "the main thread".to_owned())
    } else {
        (None, "thread".to_owned())
    };
    if let (Some(w), true) = (standing_in, name.starts_with("rank-") || name == "main") {
        what = format!("compute thread {w}, run on its loop thread");
    }
    match mpi_rank.or(rank) {
        Some(r) => format!("rank {r}, {what} ({name})"),
        None => format!("{what} ({name})"),
    }
}

/// Collective: checks, before training reads them, the datasets every rank will read. Each
/// rank checks the structure of its own shard of rows ([`Dataset::check_rows`]) and the
/// checksum of its share of the bytes; the shares' checksums are combined into the whole
/// file's. Every row any rank reads (its own, or chunks taken over from a peer) lies in some
/// rank's shard, so the whole file is checked once, at the cost of reading it once over all
/// ranks. A rank that finds a fault names it; the others report which rank found it. A rank
/// asked to stop (`stop`: SIGTERM, SIGUSR1) leaves its share unfinished within a step of
/// [`CHECK_STEP`] bytes, and every rank then ends with [`AppError::StoppedBeforeStart`]. Returns
/// the seconds it took on this rank.
pub fn check_datasets(t: &Transport, paths: &[&Path], stop: &AtomicBool) -> Result<f64, AppError> {
    let started = Instant::now();
    let (rank, world) = (t.rank(), t.world_size());
    for path in paths {
        let ds = Dataset::open(path)?;
        let share = check_share(&ds, rank, world, stop);
        let mut words = vec![0u64; 3 * world + 1];
        words[3 * rank] = u64::from(share.rows.is_err());
        words[3 * rank + 1] = u64::from(share.crc.0);
        words[3 * rank + 2] = share.crc.1;
        words[3 * world] = u64::from(share.stopped);
        t.allreduce(&mut words, ReduceOp::Sum)?;
        if words[3 * world] > 0 {
            return Err(AppError::StoppedBeforeStart {
                during: format!("while checking {}", path.display()),
            });
        }
        // Every rank learns of a fault in the allreduce: each exits with its own message.
        share.rows.map_err(|e| {
            AppError::Agreed(Box::new(AppError::Data {
                what: format!("rank {rank}"),
                detail: format!(
                    "{e}: the dataset is corrupt (checked before training; `peregrine data info --verify {}` \
                     checks the whole file)",
                    path.display()
                ),
            }))
        })?;
        if let Some(r) = (0..world).find(|&r| words[3 * r] != 0) {
            return Err(AppError::Elsewhere {
                rank: r,
                what: format!("{}: rank {r} found the dataset corrupt", path.display()),
            });
        }
        let parts: Vec<(u32, u64)> =
            (0..world).map(|r| (words[3 * r + 1] as u32, words[3 * r + 2])).collect();
        ds.check_crc(combine_crcs(&parts)).map_err(|e| AppError::Agreed(Box::new(e.into())))?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Bytes of a dataset a rank checks between two looks at its stop flag: a few tens of
/// milliseconds of reading, so that a signal is answered at once, in steps few enough to cost
/// nothing.
pub const CHECK_STEP: u64 = 64 << 20;

/// What a rank found in its share of a dataset's checks.
struct Share {
    /// The structure of its rows.
    rows: Result<(), peregrine_kernels::data::DataError>,
    /// The checksum of its share of the bytes, and the share's length.
    crc: (u32, u64),
    /// Asked to stop before the share was done (the rest is then not valid).
    stopped: bool,
}

/// Rank `rank`'s share of the checks of `ds` over `world` ranks, in steps of about
/// [`CHECK_STEP`] bytes, a look at `stop` before each: its shard of rows cut into as many
/// sub-ranges, its part of the checksum into as many sub-parts (part `rank * k + i` of `world *
/// k` equal parts: they tile part `rank` of `world` exactly), combined in order.
fn check_share(ds: &Dataset, rank: usize, world: usize, stop: &AtomicBool) -> Share {
    let steps = (ds.bytes() as u64).div_ceil(world as u64 * CHECK_STEP).max(1) as usize;
    let rows = shard(ds.rows(), rank, world);
    let mut crcs = Vec::with_capacity(steps);
    let mut share = Share { rows: Ok(()), crc: (0, 0), stopped: false };
    for i in 0..steps {
        if stop.load(Ordering::Relaxed) {
            share.stopped = true;
            return share;
        }
        if share.rows.is_ok() {
            let part = shard(rows.len(), i, steps);
            share.rows = ds.check_rows(rows.start + part.start..rows.start + part.end);
        }
        crcs.push(ds.crc_part(rank * steps + i, world * steps));
    }
    share.crc = (combine_crcs(&crcs), crcs.iter().map(|c| c.1).sum());
    share
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_print_to_a_closed_pipe_ends_the_job_quietly() {
        let closed =
            |stream: &str| format!("failed printing to {stream}: Broken pipe (os error {})", libc::EPIPE);
        assert!(closed_output_message(&closed("stdout")));
        assert!(closed_output_message(&closed("stderr")));
        assert!(!closed_output_message("failed printing to stdout: No space left on device (os error 28)"));
        assert!(!closed_output_message("index out of bounds: the len is 3 but the index is 32"));
        assert!(!closed_output_message(&format!("a chunk failed (os error {})", libc::EPIPE)));
    }

    #[test]
    fn threads_are_named_with_their_rank() {
        assert_eq!(who("pgr-s1w3", None, None), "rank 1, compute thread 3 (pgr-s1w3)");
        assert_eq!(who("rank-2", None, None), "rank 2, its loop thread (rank-2)");
        assert_eq!(who("pgr-s0w0", Some(5), None), "rank 5, compute thread 0 (pgr-s0w0)");
        assert_eq!(who("main", Some(1), None), "rank 1, the main thread (main)");
        assert_eq!(who("main", None, None), "the main thread (main)");
        assert_eq!(who("pgr-watch", None, None), "thread (pgr-watch)");
        assert_eq!(who("rank-2", None, Some(0)), "rank 2, compute thread 0, run on its loop thread (rank-2)");
        assert_eq!(who("main", Some(1), Some(0)), "rank 1, compute thread 0, run on its loop thread (main)");
        assert_eq!(who("pgr-s0w1", Some(1), Some(0)), "rank 1, compute thread 1 (pgr-s0w1)");
    }
}
