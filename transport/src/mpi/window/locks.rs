//! The accumulate locks of a direct window's shards, and the writes that hold them.

use std::sync::atomic::{AtomicU32, Ordering};

use super::MpiWindow;
use crate::{Elem, SHARD_LINE};

impl<T: Elem> MpiWindow<T> {
    /// Applies a put or accumulate of `data` at global `start` of a direct window (`a`: its
    /// atomics). Float adds hold the lock of each shard they add to (`held`: the shard whose
    /// lock the caller holds, kept across the ranges of a batch) and add with a plain load and
    /// store, as the library's shared-memory component does: a compare-and-swap per element
    /// made a whole-vector accumulate ten times dearer and contended on the model's hot keys.
    #[inline(always)]
    pub(super) fn direct_write<'w>(
        &'w self,
        a: &[T::Atomic],
        start: usize,
        data: &[T],
        accumulate: bool,
        held: &mut Held<'w>,
    ) {
        let dst = &a[start..start + data.len()];
        if !accumulate {
            for (d, &v) in dst.iter().zip(data) {
                T::atomic_store(d, v);
            }
        } else if !T::LOCKED_ADD {
            for (d, &v) in dst.iter().zip(data) {
                add(d, v);
            }
        } else {
            let (mut at, end) = (start, start + data.len());
            while at < end {
                let shard = held.shard(self, at);
                let to = end.min(self.map.range(shard).end);
                for (d, &v) in a[at..to].iter().zip(&data[at - start..to - start]) {
                    add(d, v);
                }
                at = to;
            }
        }
    }

    /// The accumulate lock of `shard` of a direct window.
    fn lock_word(&self, shard: usize) -> &AtomicU32 {
        // SAFETY: `locks` (non-null in a direct window, the only caller) is the start of
        // `world_size` lines of the last rank's shared allocation, zeroed before the barrier
        // that ended the allocation, valid while the window is live (the reference borrows
        // `self`); a line is aligned for a u32, and every process accesses the word atomically.
        unsafe { &*self.locks.add(shard * SHARD_LINE).cast::<AtomicU32>() }
    }
}

/// Adds `v` to `d`, an element of a direct window: for element types whose adds hold their
/// shard's lock ([`Elem::LOCKED_ADD`], floats) a plain load and store, which the caller's lock
/// makes exclusive; an atomic add otherwise.
#[inline(always)]
pub(super) fn add<T: Elem>(d: &T::Atomic, v: T) {
    if T::LOCKED_ADD {
        T::atomic_store(d, T::atomic_load(d).add(v));
    } else {
        T::atomic_fetch_add(d, v);
    }
}

/// The accumulate lock a direct window's writes hold: of one shard at a time, released when
/// dropped.
pub(super) struct Held<'w> {
    word: Option<(usize, &'w AtomicU32)>,
}

impl<'w> Held<'w> {
    pub(super) fn none() -> Self {
        Self { word: None }
    }

    /// The shard of global element `at`, its lock held (the lock held before released first,
    /// if it is another shard's).
    pub(super) fn shard<T: Elem>(&mut self, w: &'w MpiWindow<T>, at: usize) -> usize {
        if let Some((shard, _)) = self.word {
            if w.map.range(shard).contains(&at) {
                return shard;
            }
        }
        self.release();
        let (shard, _) = w.map.owner(at).expect("in the window: checked by the caller");
        let word = w.lock_word(shard);
        let mut spins = 0u32;
        while word.compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // Its holder may be descheduled (ranks outnumbering cores).
                std::thread::yield_now();
            }
        }
        self.word = Some((shard, word));
        shard
    }

    /// Releases the lock held, if any.
    pub(super) fn release(&mut self) {
        if let Some((_, word)) = self.word.take() {
            word.store(0, Ordering::Release);
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.release();
    }
}
