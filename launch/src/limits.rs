//! What the machine can give a command: the memory available to this process, from the
//! kernel's estimate and the limits set on the process, before anything large is allocated.
//! A training run's own estimate is `train::footprint`.

use std::path::Path;

use crate::error::AppError;

/// `MemAvailable` from `/proc/meminfo`, in bytes.
pub(crate) fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes this machine can give a command, and where the figure comes from: `MemAvailable`, or
/// less where the process's control group (a Slurm job's, a container's) or its own limits
/// (`ulimit -v`, `ulimit -d`) leave less.
pub(crate) fn available() -> Option<(u64, &'static str)> {
    [
        mem_available().map(|m| (m, "MemAvailable in /proc/meminfo")),
        cgroup_limit().map(|c| (c, "the memory limit of this process's control group")),
        rlimit_left().map(|l| (l, "what this process's ulimit -v or -d leaves")),
    ]
    .into_iter()
    .flatten()
    .min_by_key(|&(bytes, _)| bytes)
}

/// What the process's own limits leave it (`ulimit -v`: address space, `ulimit -d`: data): the
/// least of each limit less what is in use (`VmSize`, `VmData`).
fn rlimit_left() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let used = |key: &str| -> u64 {
        let kb =
            status.lines().find_map(|l| l.strip_prefix(key)?.split_whitespace().next()?.parse::<u64>().ok());
        kb.unwrap_or(0) * 1024
    };
    [(libc::RLIMIT_AS, "VmSize:"), (libc::RLIMIT_DATA, "VmData:")]
        .into_iter()
        .filter_map(|(resource, key)| {
            let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: getrlimit writes only the struct it is given, which outlives the call.
            let read = unsafe { libc::getrlimit(resource, &mut limit) } == 0;
            (read && limit.rlim_cur != libc::RLIM_INFINITY).then(|| limit.rlim_cur.saturating_sub(used(key)))
        })
        .min()
}

/// The memory limit of the process's control group, if it has one: cgroup v2 `memory.max` of
/// its group and every group above it (the least), else v1 `memory.limit_in_bytes`.
fn cgroup_limit() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: &Path| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(path) = groups.lines().find_map(|l| l.strip_prefix("0::")) {
        let mut dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
        let mut least: Option<u64> = None;
        loop {
            if let Some(v) = read(&dir.join("memory.max")) {
                least = Some(least.map_or(v, |l| l.min(v)));
            }
            if dir == Path::new("/sys/fs/cgroup") || !dir.pop() {
                break;
            }
        }
        if least.is_some() {
            return least;
        }
    }
    // v1: no limit reads as a number near 2^63.
    read(Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes")).filter(|&v| v < 1 << 62)
}

/// `bytes` in words: `1.5 GB`, `980 MB`.
pub(crate) fn size(bytes: u128) -> String {
    match bytes {
        b if b >= 10u128.pow(15) => format!("{:.1} PB", b as f64 / 1e15),
        b if b >= 10u128.pow(12) => format!("{:.1} TB", b as f64 / 1e12),
        b if b >= 10u128.pow(9) => format!("{:.1} GB", b as f64 / 1e9),
        b => format!("{:.0} MB", b as f64 / 1e6),
    }
}

/// A usage error unless `need` bytes fit what the machine has: `what` names the flags that
/// ask for them, `fix` what would ask for less.
pub(crate) fn fits(need: u128, what: &str, fix: &str) -> Result<(), AppError> {
    match available() {
        Some((avail, source)) if need > u128::from(avail) => Err(AppError::Usage(format!(
            "{what} need about {} of memory, and this machine has {} available ({source}): {fix}",
            size(need),
            size(u128::from(avail))
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_available_is_known_here() {
        let (bytes, source) = available().expect("Linux says");
        assert!(bytes > 0 && !source.is_empty());
        assert!(fits(1, "one byte", "").is_ok());
        let e = fits(u128::MAX, "--flag 3", "a smaller --flag").expect_err("refused").to_string();
        assert!(e.starts_with("--flag 3 need about") && e.contains(" available ("), "{e}");
        assert!(e.ends_with("): a smaller --flag"), "{e}");
        assert_eq!(
            (size(980_000_000), size(1_500_000_000), size(2 * 10u128.pow(13))),
            ("980 MB".into(), "1.5 GB".into(), "20.0 TB".into())
        );
    }
}
