//! The bad-use case: wrong ranges, buffers, ranks and disagreeing ranks are typed errors on every
//! rank, and the world stays usable after them.

use super::{ensure, kind, Failure, Outcome, Params};
use crate::{ErrorKind, ReduceOp, ShardMap, Transport, Window};

/// Bad use is a typed error on every rank, never UB or a hang, and the world stays usable.
pub(super) fn bad_use(t: &Transport, _: &Params) -> Outcome {
    let n = t.world_size();
    let w: Window<f32> = t.alloc_window("small", &ShardMap::balanced(10, n))?;
    let mut buf = [0.0f32; 4];
    ensure!(
        t,
        matches!(kind(w.get(8, &mut buf)), Some(ErrorKind::OutOfRange { start: 8, end: 12, len: 10, .. })),
        "get past the end was not OutOfRange"
    );
    ensure!(
        t,
        matches!(kind(w.put(usize::MAX, &buf)), Some(ErrorKind::OutOfRange { .. })),
        "put at usize::MAX was not OutOfRange"
    );
    ensure!(
        t,
        matches!(kind(w.accumulate(7, &buf)), Some(ErrorKind::OutOfRange { .. })),
        "accumulate past the end was not OutOfRange"
    );
    ensure!(
        t,
        matches!(kind(w.fetch_add(10, 1.0)), Some(ErrorKind::OutOfRange { .. })),
        "fetch_add at len was not OutOfRange"
    );
    #[allow(clippy::reversed_empty_ranges, clippy::single_range_in_vec_init)]
    let backwards = [5..3];
    ensure!(
        t,
        matches!(kind(w.get_batch(&backwards, &mut [])), Some(ErrorKind::OutOfRange { .. })),
        "a backwards range was not OutOfRange"
    );
    ensure!(
        t,
        matches!(
            kind(w.get_batch(&[0..2, 3..5], &mut buf[..3])),
            Some(ErrorKind::LengthMismatch { expected: 4, got: 3, .. })
        ),
        "short batch buffer was not LengthMismatch"
    );
    let words: Window<u64> = t.alloc_window("small words", &ShardMap::balanced(10, n))?;
    let mut out = [0u64; 4];
    ensure!(
        t,
        matches!(kind(words.load_range(8, &mut out)), Some(ErrorKind::OutOfRange { end: 12, .. })),
        "load_batch past the end was not OutOfRange"
    );
    ensure!(
        t,
        matches!(
            kind(words.load_batch(&[0..2, 3..5], &mut out[..3])),
            Some(ErrorKind::LengthMismatch { expected: 4, got: 3, .. })
        ),
        "short load_batch buffer was not LengthMismatch"
    );
    words.free()?;
    ensure!(
        t,
        matches!(kind(w.flush(n)), Some(ErrorKind::NoSuchRank { .. })),
        "flush of rank {n} was not NoSuchRank"
    );
    ensure!(
        t,
        matches!(kind(t.broadcast(&mut [0u64], n)), Some(ErrorKind::NoSuchRank { .. })),
        "broadcast from rank {n} was not NoSuchRank"
    );
    // Ranks that disagree about a window's size: every rank gets the error, nobody hangs.
    let total = if t.rank() == 0 { 10 } else { 11 };
    let r = t.alloc_window::<f64>("disagreeing", &ShardMap::balanced(total, n));
    if n > 1 {
        ensure!(
            t,
            matches!(kind(r), Some(ErrorKind::WindowMismatch { .. })),
            "windows of different sizes across ranks were accepted"
        );
    }
    // ... or about its element type.
    let map = ShardMap::balanced(8, n);
    if n > 1 {
        let ok = if t.rank() == 0 {
            matches!(kind(t.alloc_window::<u64>("typed", &map)), Some(ErrorKind::WindowMismatch { .. }))
        } else {
            matches!(kind(t.alloc_window::<f64>("typed", &map)), Some(ErrorKind::WindowMismatch { .. }))
        };
        ensure!(t, ok, "windows of different element types across ranks were accepted");
        // ... or about the length of an allreduce.
        let mut v = vec![1u64; 1 + usize::from(t.rank() == 0)];
        ensure!(
            t,
            matches!(kind(t.allreduce(&mut v, ReduceOp::Sum)), Some(ErrorKind::CollectiveMismatch { .. })),
            "allreduce of different lengths was accepted"
        );
    }
    // A shard map for a different world size.
    ensure!(
        t,
        matches!(
            kind(t.alloc_window::<u64>("wrong parts", &ShardMap::balanced(8, n + 1))),
            Some(ErrorKind::ShardCount { .. })
        ),
        "a map with {} shards was accepted in a world of {n}",
        n + 1
    );
    // The world still works.
    w.put(0, &[1.5])?;
    w.flush_all()?;
    t.barrier()?;
    let mut x = [0.0f32];
    w.get(0, &mut x)?;
    ensure!(t, x[0] == 1.5, "after the errors, element 0 is {}", x[0]);
    t.barrier()?;
    w.free()?;
    Ok(())
}
