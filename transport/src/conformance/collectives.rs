//! The collectives case: `allreduce` and `broadcast` agree on every rank.

use super::{ensure, Failure, Outcome, Params};
use crate::{ReduceOp, Transport};

/// `allreduce` (sum, min, max on each type) and `broadcast` from every root.
pub(super) fn collectives(t: &Transport, _: &Params) -> Outcome {
    let (r, n) = (t.rank() as u64, t.world_size() as u64);
    let mut v = [r, 10 + r, 1];
    t.allreduce(&mut v, ReduceOp::Sum)?;
    ensure!(t, v == [n * (n - 1) / 2, 10 * n + n * (n - 1) / 2, n], "u64 sum: got {v:?}");
    let mut v = [r as f64 * 0.5, -(r as f64)];
    t.allreduce(&mut v, ReduceOp::Min)?;
    ensure!(t, v == [0.0, -((n - 1) as f64)], "f64 min: got {v:?}");
    let mut v = [r as f32, 3.0];
    t.allreduce(&mut v, ReduceOp::Max)?;
    ensure!(t, v == [(n - 1) as f32, 3.0], "f32 max: got {v:?}");
    for root in 0..t.world_size() {
        let mut b = [r * 7 + 1, 42, r];
        t.broadcast(&mut b, root)?;
        let root = root as u64;
        ensure!(t, b == [root * 7 + 1, 42, root], "broadcast from {root}: got {b:?}");
    }
    Ok(())
}
