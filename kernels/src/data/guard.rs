//! A dataset that shrinks while it is mapped: an error naming the file, not death by `SIGBUS`.
//!
//! Reading a page of a mapping beyond the end of its file raises `SIGBUS` (the file was
//! truncated, or rewritten in place by a tool that truncates first, while a job had it mapped).
//! Checking every read against the file's current length would cost a system call per chunk;
//! instead every open [`Dataset`](super::Dataset) registers its mapped range here, and a `SIGBUS`
//! handler ([`install`], called once by the binary) looks the faulting address up: inside a
//! dataset's range, it writes a message naming the file and the offset and ends the process with
//! exit code 1 (under MPI the launcher then ends the other ranks); anywhere else, it restores the
//! previous disposition and returns, so that the fault is delivered as before. Nothing is spent
//! while no fault happens.
//!
//! The registry is a fixed array of slots of atomics: the handler reads it without locks or
//! allocation (async-signal-safe). Datasets beyond [`SLOTS`] open at once go unregistered (a
//! fault in them is then the default `SIGBUS`).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Datasets registered at once.
pub const SLOTS: usize = 256;

struct Slot {
    /// Claimed by a registration.
    used: AtomicBool,
    /// First mapped byte's address; 0 while the slot is being filled or cleared.
    start: AtomicUsize,
    len: AtomicUsize,
    path: AtomicPtr<u8>,
    path_len: AtomicUsize,
    /// The file as it was when mapped: device, inode, length, modification time (ns).
    stat: [AtomicU64; 4],
}

impl Slot {
    const fn new() -> Self {
        Self {
            used: AtomicBool::new(false),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            path: AtomicPtr::new(std::ptr::null_mut()),
            path_len: AtomicUsize::new(0),
            stat: [const { AtomicU64::new(0) }; 4],
        }
    }
}

static REGISTRY: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];

/// A mapped range registered with the handler; unregistered on drop (drop it before unmapping).
#[derive(Debug)]
pub(crate) struct Registration {
    slot: Option<usize>,
    /// The path's bytes, which the slot points to while registered.
    _path: Box<[u8]>,
}

impl Registration {
    /// Registers `len` bytes mapped at `start` from the file `path`, which was `meta` when mapped.
    pub(crate) fn new(start: *const u8, len: usize, path: &Path, meta: Option<&std::fs::Metadata>) -> Self {
        let mut bytes = path.as_os_str().as_encoded_bytes().to_vec().into_boxed_slice();
        let slot = REGISTRY
            .iter()
            .position(|s| s.used.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok());
        if let Some(i) = slot {
            let s = &REGISTRY[i];
            s.len.store(len, Ordering::Relaxed);
            s.path.store(bytes.as_mut_ptr(), Ordering::Relaxed);
            s.path_len.store(bytes.len(), Ordering::Relaxed);
            for (a, v) in s.stat.iter().zip(meta.map_or([0; 4], fingerprint)) {
                a.store(v, Ordering::Relaxed);
            }
            s.start.store(start as usize, Ordering::Release);
        }
        Self { slot, _path: bytes }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            let s = &REGISTRY[i];
            s.start.store(0, Ordering::Release);
            s.path.store(std::ptr::null_mut(), Ordering::Relaxed);
            s.used.store(false, Ordering::Release);
        }
    }
}

/// Device, inode, length and modification time (ns) of a file.
fn fingerprint(m: &std::fs::Metadata) -> [u64; 4] {
    let mtime = (m.mtime() as u64).wrapping_mul(1_000_000_000).wrapping_add(m.mtime_nsec() as u64);
    [m.dev(), m.ino(), m.len(), mtime]
}

/// The mapped datasets whose file was modified in place since it was mapped (same device and
/// inode, another length or modification time), each with what changed. A file replaced by
/// another one (renamed over it) is not listed: the mapping still reads the file it mapped.
/// For a fault's report (a panic while reading data that changed under the run).
pub fn modified() -> Vec<String> {
    let mut found = Vec::new();
    for s in &REGISTRY {
        if s.start.load(Ordering::Acquire) == 0 {
            continue;
        }
        let (path, len) = (s.path.load(Ordering::Relaxed), s.path_len.load(Ordering::Relaxed));
        if path.is_null() {
            continue;
        }
        // SAFETY: a registered slot points at its registration's path bytes (see on_sigbus); a
        // registration being dropped concurrently is the only race, and this is a diagnostic
        // read on the way out of a failing process.
        let bytes = unsafe { std::slice::from_raw_parts(path, len) };
        // SAFETY: the bytes came from `as_encoded_bytes` of an OsStr.
        let p = Path::new(unsafe { std::ffi::OsStr::from_encoded_bytes_unchecked(bytes) });
        let then: Vec<u64> = s.stat.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        let Ok(now) = std::fs::metadata(p) else { continue };
        let now = fingerprint(&now);
        if then[..2] != now[..2] || then == now {
            continue;
        }
        let what = if then[2] != now[2] {
            format!("its length went from {} to {} bytes", then[2], now[2])
        } else {
            "its modification time changed".to_owned()
        };
        found.push(format!("{} ({what})", p.display()));
    }
    // A file mapped several times (by each local rank) is listed once.
    found.sort();
    found.dedup();
    found
}

/// The disposition before [`install`], restored for faults outside datasets.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Set by the first thread that reports a dataset fault: threads of several local ranks reading
/// the same truncated file fault at once, and their messages interleaved byte by byte.
static REPORTING: AtomicBool = AtomicBool::new(false);

/// Installs the `SIGBUS` handler (once per process; later calls do nothing).
pub fn install() -> std::io::Result<()> {
    if PREVIOUS.get().is_some() {
        return Ok(());
    }
    // SAFETY: an all-zero sigaction is a valid value (no handler, empty mask, no flags), filled
    // in below before use.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
        as libc::sighandler_t;
    action.sa_flags = libc::SA_SIGINFO;
    // SAFETY: as above.
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to initialized sigaction structs; the handler only makes
    // async-signal-safe calls (atomic loads, write, _exit, sigaction).
    if unsafe { libc::sigaction(libc::SIGBUS, &action, &mut previous) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let _ = PREVIOUS.set(previous);
    Ok(())
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler; si_addr is the
    // faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &REGISTRY {
        let start = s.start.load(Ordering::Acquire);
        let len = s.len.load(Ordering::Relaxed);
        if start == 0 || addr < start || addr - start >= len {
            continue;
        }
        if REPORTING.swap(true, Ordering::AcqRel) {
            // Another thread is writing the message and will end the process: wait for it.
            loop {
                // SAFETY: pause is async-signal-safe.
                unsafe { libc::pause() };
            }
        }
        let (path, path_len) = (s.path.load(Ordering::Relaxed), s.path_len.load(Ordering::Relaxed));
        let mut offset = [0u8; 20];
        let offset = decimal(addr - start, &mut offset);
        // One write where the message fits (it does unless the path is over 7 KiB), so that it
        // reaches a pipe (mpirun's, a test's) whole.
        let mut line = Line { fd: 2, buf: [0; 8192], len: 0 };
        line.push(b"peregrine: error: dataset ");
        if !path.is_null() {
            // SAFETY: the slot points at its registration's path bytes, which live until the
            // registration is dropped, and a registration is dropped only with its dataset, which
            // the faulting thread is reading.
            line.push(unsafe { std::slice::from_raw_parts(path, path_len) });
        }
        line.push(b" shrank while this run had it mapped (a read at byte ");
        line.push(offset);
        line.push(
            b" is now past its end): it was truncated or rewritten in place. A dataset must not \
              change while a job reads it: write the new one to another file and rename it into place\n",
        );
        line.flush();
        // SAFETY: _exit is async-signal-safe and ends the process at once.
        unsafe { libc::_exit(1) };
    }
    // Not a dataset's page: the fault is not ours. Restore the previous disposition and return;
    // the faulting instruction runs again and gets it.
    if let Some(previous) = PREVIOUS.get() {
        // SAFETY: `previous` is the disposition sigaction returned at install; sigaction is
        // async-signal-safe.
        unsafe { libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut()) };
    }
}

/// A message built on the stack (no allocation in a signal handler), written to `fd` when full
/// or flushed.
struct Line {
    fd: libc::c_int,
    buf: [u8; 8192],
    len: usize,
}

impl Line {
    fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.len == self.buf.len() {
                self.flush();
            }
            let n = bytes.len().min(self.buf.len() - self.len);
            self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
            self.len += n;
            bytes = &bytes[n..];
        }
    }

    fn flush(&mut self) {
        write_all(self.fd, &self.buf[..self.len]);
        self.len = 0;
    }
}

fn write_all(fd: libc::c_int, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: a valid buffer and length; write(2) is async-signal-safe.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// `v` in decimal, in `buf`'s tail (no allocation: called from the signal handler).
fn decimal(mut v: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_writes_every_digit() {
        let mut b = [0u8; 20];
        assert_eq!(decimal(0, &mut b), b"0");
        assert_eq!(decimal(1_234_567, &mut b), b"1234567");
        assert_eq!(decimal(usize::MAX, &mut b), usize::MAX.to_string().as_bytes());
    }

    #[test]
    fn a_line_keeps_what_is_pushed_in_order_across_its_buffer() {
        use std::os::fd::AsRawFd;
        let null = std::fs::File::create("/dev/null").expect("/dev/null");
        let mut l = Line { fd: null.as_raw_fd(), buf: [0; 8192], len: 0 };
        l.push(b"abc");
        l.push(&[b'x'; 100]);
        assert_eq!(&l.buf[..l.len], [&b"abc"[..], &[b'x'; 100]].concat().as_slice());
        // A push past the buffer writes what it holds and goes on from the start: the tail kept.
        l.push(&[b'y'; 8192]);
        assert_eq!(l.len, 103);
        assert!(l.buf[..l.len].iter().all(|&b| b == b'y'));
    }

    #[test]
    fn registrations_take_and_free_slots() {
        let data = [0u8; 64];
        let a = Registration::new(data.as_ptr(), 64, Path::new("a.pgd"), None);
        let b = Registration::new(data.as_ptr(), 64, Path::new("b.pgd"), None);
        let (ia, ib) = (a.slot.expect("a slot"), b.slot.expect("a slot"));
        assert_ne!(ia, ib);
        assert_eq!(REGISTRY[ia].start.load(Ordering::Acquire), data.as_ptr() as usize);
        drop(a);
        assert_eq!(REGISTRY[ia].start.load(Ordering::Acquire), 0);
        assert!(!REGISTRY[ia].used.load(Ordering::Acquire));
        drop(b);
    }
}
