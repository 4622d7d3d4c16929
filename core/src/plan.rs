//! Which rows each rank computes in each iteration, known to every rank without communication.
//!
//! Iteration `t` processes one global mini-batch: the rows of block `b` of epoch `e = t / I`
//! (`I` blocks of `batch` consecutive rows per epoch, the last one shorter), where the blocks of
//! an epoch are visited in a seeded order (an affine permutation of `0..I`, different per epoch).
//! The block is cut into chunks of `chunk` rows (the last shorter) and rank `r` of `N` owns part
//! `r` of the chunks (split as evenly as possible). Because batches and chunks are defined
//! globally, the same seed gives the same chunks for 1, 2 or 4 ranks (what makes BSP runs
//! comparable across world sizes, also for models whose update depends on how rows are grouped,
//! like MF's SGD within a chunk), and a rank that takes over another rank's chunk can compute its
//! rows from `(rank, t, chunk)` alone. Every rank reads rows of the whole dataset over an epoch (it is memory-mapped: a
//! node's ranks share its pages).

use std::ops::Range;

/// Why a plan cannot be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// No training rows.
    #[error("the training set has no rows")]
    NoRows,
    /// A count is zero.
    #[error("batch ({batch}), ranks ({world}) and chunk ({chunk}) must be at least 1")]
    Zero {
        /// Batch rows.
        batch: usize,
        /// Ranks.
        world: usize,
        /// Chunk rows.
        chunk: usize,
    },
    /// A batch's chunks do not fit one queue (schemes that size shares, like LB-BSP, may give one
    /// rank all of them).
    #[error(
        "a batch of {batch} rows is {chunks} chunks of {chunk}; at most {} fit a rank's queue: raise the chunk size",
        crate::words::MAX_CHUNKS
    )]
    TooManyChunks {
        /// Batch rows.
        batch: usize,
        /// Chunks of a batch.
        chunks: usize,
        /// Chunk rows.
        chunk: usize,
    },
}

/// The batch plan of a run.
#[derive(Clone, Debug)]
pub struct Plan {
    rows: usize,
    batch: usize,
    world: usize,
    chunk: usize,
    seed: u64,
}

impl Plan {
    /// A plan over `rows` training rows, global batches of `batch` rows (capped at `rows`),
    /// `world` ranks and chunks of `chunk` rows.
    ///
    /// # Errors
    /// If a count is zero or a batch has more chunks than one rank's queue holds.
    pub fn new(rows: usize, batch: usize, world: usize, chunk: usize, seed: u64) -> Result<Self, PlanError> {
        if rows == 0 {
            return Err(PlanError::NoRows);
        }
        if batch == 0 || world == 0 || chunk == 0 {
            return Err(PlanError::Zero { batch, world, chunk });
        }
        let batch = batch.min(rows);
        let chunks = batch.div_ceil(chunk);
        if chunks > crate::words::MAX_CHUNKS as usize {
            return Err(PlanError::TooManyChunks { batch, chunks, chunk });
        }
        Ok(Self { rows, batch, world, chunk, seed })
    }

    /// Training rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Global batch rows (at most [`rows`](Self::rows)).
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Rows per chunk.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// Iterations per epoch.
    pub fn iters_per_epoch(&self) -> u64 {
        self.rows.div_ceil(self.batch) as u64
    }

    /// The epoch (pass over the rows, 0 the first) iteration `t` is in.
    pub fn epoch(&self, t: u64) -> u64 {
        t / self.iters_per_epoch()
    }

    /// The rows of iteration `t`'s global batch.
    pub fn batch_rows(&self, t: u64) -> Range<usize> {
        let blocks = self.iters_per_epoch();
        let (epoch, i) = (self.epoch(t), t % blocks);
        let b = permute(i, blocks, self.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15)) as usize;
        let start = b * self.batch;
        start..(start + self.batch).min(self.rows)
    }

    /// The batch's chunks (global numbering) that rank `rank` owns in iteration `t`.
    pub fn part(&self, t: u64, rank: usize) -> Range<usize> {
        split(self.batch_rows(t).len().div_ceil(self.chunk), rank, self.world)
    }

    /// Chunks rank `rank` owns in iteration `t`.
    pub fn chunks(&self, t: u64, rank: usize) -> u32 {
        self.part(t, rank).len() as u32
    }

    /// The rows of rank `rank`'s chunk `c` (counted from 0 within the rank) in iteration `t`.
    pub fn chunk_rows(&self, t: u64, rank: usize, c: u32) -> Range<usize> {
        self.global_chunk_rows(t, self.part(t, rank).start + c as usize)
    }

    /// Ranks that a full batch gives no chunk of their own: a batch cut into fewer chunks than
    /// there are ranks leaves the last ranks with nothing to compute but what they take over.
    pub fn idle_ranks(&self) -> usize {
        self.world.saturating_sub(self.batch.div_ceil(self.chunk))
    }

    /// Chunks in iteration `t`'s batch.
    pub fn batch_chunks(&self, t: u64) -> usize {
        self.batch_rows(t).len().div_ceil(self.chunk)
    }

    /// The rows of the batch's chunk `g` (numbered over the whole batch) in iteration `t`.
    pub fn global_chunk_rows(&self, t: u64, g: usize) -> Range<usize> {
        let b = self.batch_rows(t);
        let s = (b.start + g * self.chunk).min(b.end);
        s..(s + self.chunk).min(b.end)
    }
}

/// Part `rank` of `len` items split over `world` as evenly as possible.
pub fn split(len: usize, rank: usize, world: usize) -> Range<usize> {
    let (q, r) = (len / world, len % world);
    let start = rank * q + rank.min(r);
    start..start + q + usize::from(rank < r)
}

/// SplitMix64: a seeded, stateless 64-bit mix.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded bijection of `0..n`: `i -> (a i + b) mod n` with `a` coprime to `n`.
fn permute(i: u64, n: u64, seed: u64) -> u64 {
    if n <= 1 {
        return 0;
    }
    let h = mix(seed);
    let mut a = (h % n).max(1);
    while gcd(a, n) != 1 {
        a = a % (n - 1) + 1;
    }
    let b = mix(h) % n;
    ((u128::from(a) * u128::from(i) + u128::from(b)) % u128::from(n)) as u64
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranks_without_a_chunk_of_their_own() {
        let idle =
            |batch, world, chunk| Plan::new(10_000, batch, world, chunk, 1).expect("plan").idle_ranks();
        assert_eq!(idle(128, 4, 64), 2, "2 chunks for 4 ranks");
        assert_eq!(idle(128, 4, 32), 0);
        assert_eq!(idle(130, 4, 64), 1, "a partial chunk is a chunk");
        assert_eq!(idle(3, 4, 1), 1, "a batch smaller than the world");
        assert_eq!(idle(20_000, 4, 64), 0, "the batch capped at the rows");
    }

    proptest! {
        #[test]
        fn permute_is_a_bijection(n in 1u64..300, seed: u64) {
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let p = permute(i, n, seed) as usize;
                prop_assert!(!seen[p]);
                seen[p] = true;
            }
        }

        #[test]
        fn an_epoch_covers_every_row_once(rows in 1usize..500, batch in 1usize..100, world in 1usize..5,
                                         chunk in 1usize..9, seed: u64, epoch in 0u64..3) {
            let p = Plan::new(rows, batch, world, chunk, seed).expect("plan");
            let mut count = vec![0u32; rows];
            let ipe = p.iters_per_epoch();
            for t in epoch * ipe..(epoch + 1) * ipe {
                for r in 0..world {
                    for c in 0..p.chunks(t, r) {
                        let cr = p.chunk_rows(t, r, c);
                        prop_assert!(!cr.is_empty() && cr.len() <= chunk);
                        for i in cr { count[i] += 1; }
                    }
                }
            }
            prop_assert!(count.iter().all(|&c| c == 1));
        }

        #[test]
        fn chunks_do_not_depend_on_the_world(rows in 1usize..500, batch in 1usize..100, seed: u64,
                                             t in 0u64..50, world in 2usize..6) {
            let a = Plan::new(rows, batch, 1, 7, seed).expect("plan");
            let b = Plan::new(rows, batch, world, 7, seed).expect("plan");
            prop_assert_eq!(a.batch_rows(t), b.batch_rows(t));
            let one: Vec<_> = (0..a.chunks(t, 0)).map(|c| a.chunk_rows(t, 0, c)).collect();
            let many: Vec<_> =
                (0..world).flat_map(|r| (0..b.chunks(t, r)).map(move |c| (r, c))).map(|(r, c)| b.chunk_rows(t, r, c)).collect();
            prop_assert_eq!(one, many);
        }
    }

    #[test]
    fn bad_plans_are_errors() {
        assert!(Plan::new(0, 1, 1, 1, 0).is_err());
        assert!(Plan::new(10, 0, 1, 1, 0).is_err());
        assert!(Plan::new(10, 1, 1, 0, 0).is_err());
        assert!(Plan::new(1 << 26, 1 << 26, 1, 1, 0).is_err());
        assert_eq!(Plan::new(10, 100, 2, 3, 0).expect("plan").batch(), 10);
    }
}
