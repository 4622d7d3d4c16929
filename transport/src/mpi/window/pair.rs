//! A window and its state window stepped together in one pass over scattered ranges, where both
//! are direct ([`crate::Window::step_with_state`]).

use std::sync::atomic::{fence, Ordering};

use super::batch::{has_prefetchw, prefetch_to_write, AHEAD};
use super::locks::{add, Held};
use super::MpiWindow;
use crate::{Elem, ErrorKind, Result};

/// Elements a block gathers before it steps and adds them back: the values, their state and
/// its change of 256 elements with two state slots are 5 KiB, in the first-level cache.
const BLOCK: usize = 256;

/// The buffers of one block: the gathered values (then their change), their state, its change,
/// and the pieces they came from (`(start, len)` in the window).
struct Block<T> {
    c: Vec<T>,
    st: Vec<T>,
    ds: Vec<T>,
    pieces: Vec<(usize, usize)>,
}

impl<T: Elem> MpiWindow<T> {
    /// Whether this window and `state` are both direct and `state`'s shards `k` times this
    /// window's: `k`, or `None`.
    pub(crate) fn pairs_with(&self, state: &Self) -> Option<usize> {
        let parts = self.map.parts();
        let k = state.map.total().checked_div(self.map.total())?;
        (self.direct
            && state.direct
            && k > 0
            && state.map.parts() == parts
            && (0..parts).all(|r| state.map.len_of(r) == k * self.map.len_of(r)))
        .then_some(k)
    }

    /// See [`crate::Window::step_with_state`]; the caller checked `keys` (ascending, each key's
    /// first element inside the window) and that the windows pair ([`Self::pairs_with`]).
    pub(crate) fn step_with_state(
        &self,
        state: &Self,
        width: usize,
        keys: &[u32],
        values: &mut [T],
        f: &mut impl FnMut(&mut [T], &[T], &mut [T]),
    ) -> Result<()> {
        let (Some(a), Some(s), Some(k)) = (self.direct(), state.direct(), self.pairs_with(state)) else {
            let (rank, window, other) = (self.rank(), self.name.clone(), state.name.clone());
            return Err(ErrorKind::NotDirect { rank, op: "step_with_state", window, other }.into());
        };
        let len = self.map.total();
        fence(Ordering::Acquire);
        // Keys a block holds: at least one, however wide.
        let per_block = (BLOCK / width.max(1)).max(1);
        let mut b = Block {
            c: Vec::with_capacity(per_block * width),
            st: Vec::with_capacity(per_block * width * k),
            ds: vec![T::default(); per_block * width * k],
            pieces: Vec::with_capacity(per_block),
        };
        let mut held = (Held::none(), Held::none());
        let owned = has_prefetchw();
        // The bounds of the shard the block's keys lie in (empty at first).
        let (mut lo, mut hi) = (1, 0);
        // Each rank starts at the shard after its own and wraps around, as accumulates do, so
        // that ranks pushing at once take the shards' locks in turn.
        let from = self.map.range((self.rank() + 1) % self.map.parts()).start;
        let split = keys.partition_point(|&key| (key as usize) * width < from);
        let (low, high) = keys.split_at(split);
        for part in [high, low] {
            for (i, &key) in part.iter().enumerate() {
                if let Some(&ahead) = part.get(i + AHEAD) {
                    prefetch_to_write(a, ahead as usize * width, owned);
                    prefetch_to_write(s, ahead as usize * width * k, owned);
                }
                let at = key as usize * width;
                let n = width.min(len - at);
                // A key inside one shard (shards hold whole keys where the window is laid out
                // by keys; elsewhere a key across a boundary goes in pieces).
                let mut piece = at;
                while piece < at + n {
                    if !(lo <= piece && piece < hi) || b.pieces.len() == per_block {
                        self.settle(state, (a, s), &mut b, f, &mut held);
                        let (shard, _) = self.map.owner(piece).expect("inside the window: checked");
                        (lo, hi) = (self.map.range(shard).start, self.map.range(shard).end);
                    }
                    let m = (at + n).min(hi) - piece;
                    if m == 1 && k == 1 {
                        // Sparse LR's keys under a one-slot optimizer: no copy of a slice of one.
                        b.c.push(std::mem::take(&mut values[piece]));
                        b.st.push(T::atomic_load(&s[piece]));
                    } else {
                        let v = &mut values[piece..piece + m];
                        b.c.extend_from_slice(v);
                        v.fill(T::default());
                        b.st.extend(s[piece * k..(piece + m) * k].iter().map(T::atomic_load));
                    }
                    b.pieces.push((piece, m));
                    piece += m;
                }
            }
        }
        self.settle(state, (a, s), &mut b, f, &mut held);
        fence(Ordering::Release);
        Ok(())
    }

    /// Steps a gathered block (`f`), adds its changes to both windows (`a`, `s`: their atomics)
    /// under the locks of its shard in each (`held`), released after it (so that ranks pushing
    /// to one shard at once interleave block by block; holding them over 8 blocks of a shard
    /// was no faster), and empties it. A rank waits for a lock while holding none, or for the
    /// shard's state lock while holding its window lock (which no one else can hold then); the
    /// windows' other writers hold one lock at a time: no cycle.
    #[inline(always)]
    fn settle<'w>(
        &'w self,
        state: &'w Self,
        (a, s): (&[T::Atomic], &[T::Atomic]),
        b: &mut Block<T>,
        f: &mut impl FnMut(&mut [T], &[T], &mut [T]),
        (held_w, held_s): &mut (Held<'w>, Held<'w>),
    ) {
        let Some(&(first, _)) = b.pieces.first() else { return };
        let (n, k) = (b.c.len(), b.st.len() / b.c.len());
        let ds = &mut b.ds[..n * k];
        f(&mut b.c, &b.st, ds);
        held_w.shard(self, first);
        held_s.shard(state, first * k);
        let mut off = 0;
        for &(at, len) in &b.pieces {
            for (d, &v) in a[at..at + len].iter().zip(&b.c[off..off + len]) {
                add(d, v);
            }
            for (d, &v) in s[at * k..(at + len) * k].iter().zip(&ds[off * k..(off + len) * k]) {
                add(d, v);
            }
            off += len;
        }
        held_s.release();
        held_w.release();
        b.c.clear();
        b.st.clear();
        b.pieces.clear();
    }
}
