//! A combining tree of one-sided counters: "has every rank arrived at `j`?" answered by one load
//! of one word, at a cost per rank of O(log N) atomics, instead of a read of every rank's word
//! (O(N) per poll, O(N^2) per iteration over the world).
//!
//! The ranks are the leaves; a node of level 0 counts the arrivals of up to [`FAN`] ranks, a
//! node of level `l + 1` the completions of up to [`FAN`] nodes of level `l`, up to one root.
//! A node's words live on the first rank of its subtree ([`Shape::host`]), so rank 0 holds the
//! root and no rank holds more than one node per level.
//!
//! A rank arriving at `j` adds one to its level-0 node's word for `j`; whoever's add completes a
//! node (the fetched value says so) adds one to the parent's, and so on: only the last arriver
//! of each node climbs, so an arrival is one atomic for most ranks and at most `levels` for one.
//! "Every rank arrived at `j`" is the root's word for `j` at its full count.
//!
//! Words are a ring of `slots` per node, reused lap after lap without a reset: a word counts
//! `children` arrivals per lap, so the `L`-th lap of slot `j % slots` is complete at
//! `children * (L + 1)`, and "complete" stays true once it is. This needs two things of the
//! callers, which the engine's clocks give (`crate::clocks`):
//! - each rank arrives at `j` once, in increasing `j`, each arrival (and climb) finished before
//!   its next: then the root completes `j` before `j + 1`;
//! - no rank arrives at `j + slots` before every rank has arrived at `j` (for clocks: ranks run
//!   at most `slots - 1` iterations ahead of the slowest, e.g. `slots = s + 2` under SSP(s)).

use std::ops::Range;

use peregrine_transport::{Result, ShardMap, Transport, Window};

/// Children per node: 16 (a node's arrivals from one node of 16 ranks are shared-memory
/// atomics; 4,096 ranks are three levels).
pub const FAN: usize = 16;

/// Slots a node needs where ranks run at most `staleness` iterations ahead of the slowest clock:
/// arrivals of ranks up to `staleness + 1` apart, one to spare. `None` (no tree: every rank's
/// word is read instead) without a bound, or with one so large (65,533 or more) that the ring
/// would not fit a window of reasonable size.
pub fn slots_for(staleness: Option<u64>) -> Option<usize> {
    staleness.filter(|&s| s < (1 << 16) - 3).map(|s| s as usize + 3)
}

/// The tree over a world of ranks: its levels and which rank holds which node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    world: usize,
    fan: usize,
    levels: usize,
}

impl Shape {
    /// The tree of fan-in `fan` (at least 2) over `world` ranks: as many levels as it takes for
    /// one node to cover every rank (one at least).
    pub fn new(world: usize, fan: usize) -> Self {
        let (world, fan) = (world.max(1), fan.max(2));
        let (mut levels, mut span) = (1, fan);
        while span < world {
            span = span.saturating_mul(fan);
            levels += 1;
        }
        Self { world, fan, levels }
    }

    /// Levels of nodes (the root's is `levels() - 1`).
    pub fn levels(&self) -> usize {
        self.levels
    }

    /// Ranks under one node of `level`.
    pub fn span(&self, level: usize) -> usize {
        self.fan.saturating_pow(level as u32 + 1)
    }

    /// The rank holding the node of `level` above `rank`: the first rank of its subtree.
    pub fn host(&self, rank: usize, level: usize) -> usize {
        let span = self.span(level);
        rank / span * span
    }

    /// Arrivals the node of `level` above `rank` counts per lap: its ranks (level 0) or its
    /// non-empty child subtrees.
    pub fn children(&self, rank: usize, level: usize) -> u64 {
        let first = self.host(rank, level);
        let ranks = (first + self.span(level)).min(self.world) - first;
        let below = if level == 0 { 1 } else { self.span(level - 1) };
        ranks.div_ceil(below) as u64
    }
}

/// Which of the incomplete children `open` a descent with `draw` enters at `level` (each equally
/// likely over draws; the engine's and the simulator's descents both pick here). `None`: none is
/// open.
pub fn pick(draw: u64, level: usize, mut open: impl Iterator<Item = usize> + Clone) -> Option<usize> {
    let n = open.clone().count() as u64;
    let k = crate::plan::mix(draw ^ ((level as u64) << 56)).checked_rem(n)?;
    open.nth(k as usize)
}

/// A combining tree of one-sided counters over the world (see the module's documentation).
#[derive(Debug)]
pub struct Tree {
    words: Window<u64>,
    shape: Shape,
    slots: usize,
    base: u64,
}

impl Tree {
    /// Collective: a tree of `slots` words a node, counting arrivals at `base`, `base + 1`, ...
    /// (arrivals before `base` count as complete). Every word starts at zero.
    pub fn new(t: &Transport, name: &str, slots: usize, base: u64) -> Result<Self> {
        let shape = Shape::new(t.world_size(), FAN);
        let slots = slots.max(1);
        // Every node's words, then `slots` more: who completed the root's (rank 0's only).
        let map = ShardMap::from_lens(vec![(shape.levels + 1) * slots; t.world_size()]);
        Ok(Self { words: t.alloc_window(name, &map)?, shape, slots, base })
    }

    /// The tree's shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The word of `j` in the node of `level` above `rank`, and the count that completes its lap.
    fn word(&self, rank: usize, level: usize, j: u64) -> (usize, u64) {
        let k = j - self.base;
        let host = self.shape.host(rank, level);
        let index = (host * (self.shape.levels + 1) + level) * self.slots + (k % self.slots as u64) as usize;
        (index, self.shape.children(rank, level) * (k / self.slots as u64 + 1))
    }

    /// Leaf `leaf` arrives at `j` (once, after its arrival at `j - 1` has returned; any rank
    /// may make the arrival for a leaf): adds one to the leaf's node and, for as long as its add
    /// completes a node, to the parent's. Returns the nodes it completed (`levels()`: the root,
    /// every leaf has arrived); it issued one atomic more than that, at most `levels()`.
    pub fn arrive(&self, leaf: usize, j: u64) -> Result<usize> {
        debug_assert!(j >= self.base, "arrival at {j} before the tree's first, {}", self.base);
        for level in 0..self.shape.levels {
            let (index, full) = self.word(leaf, level, j);
            if self.words.fetch_add(index, 1)? + 1 != full {
                return Ok(level);
            }
        }
        // The root: this leaf was the last, which whoever waited for it may want to know.
        let (index, lap) = self.last_word(j);
        self.words.swap(index, (lap << 32) | (leaf as u64 + 1))?;
        Ok(self.shape.levels)
    }

    /// The word naming the leaf that completed `j`'s root, and `j`'s lap.
    fn last_word(&self, j: u64) -> (usize, u64) {
        let k = j - self.base;
        (self.shape.levels * self.slots + (k % self.slots as u64) as usize, k / self.slots as u64)
    }

    /// The leaves under a node of level 0 not complete at `j`, found from the root down through
    /// an incomplete child at each level, the one [`pick`] draws from `draw` among them (looks
    /// with different draws spread over the incomplete nodes instead of crowding the first): one
    /// batch of at most [`FAN`] words per level below the root's, one more load for the root.
    /// `None` if `j` is complete (or became so during the descent).
    pub fn missing(&self, j: u64, draw: u64) -> Result<Option<Range<usize>>> {
        if self.complete(j)? {
            return Ok(None);
        }
        let mut host = 0;
        let (mut ranges, mut counts) = (Vec::with_capacity(FAN), Vec::with_capacity(FAN));
        for level in (1..self.shape.levels).rev() {
            // The children: nodes of `level - 1` under the node at `host`, `span` ranks apart.
            let (span, kids) = (self.shape.span(level - 1), self.shape.children(host, level) as usize);
            let kid = |i: usize| self.word(host + i * span, level - 1, j);
            ranges.clear();
            ranges.extend((0..kids).map(|i| kid(i).0..kid(i).0 + 1));
            counts.resize(kids, 0);
            self.words.load_batch(&ranges, &mut counts)?;
            match pick(draw, level, (0..kids).filter(|&i| counts[i] < kid(i).1)) {
                Some(i) => host += i * span,
                None => return Ok(None),
            }
        }
        Ok(Some(host..(host + self.shape.span(0)).min(self.shape.world)))
    }

    /// The leaf whose arrival completed `j` (the last of all), once it is complete: one load.
    pub fn last(&self, j: u64) -> Result<Option<usize>> {
        if j < self.base {
            return Ok(None);
        }
        let (index, lap) = self.last_word(j);
        let w = self.words.load(index)?;
        Ok((w >> 32 == lap && w as u32 > 0).then(|| (w as u32 - 1) as usize))
    }

    /// Whether every rank has arrived at `j`: one atomic load of the root's word.
    pub fn complete(&self, j: u64) -> Result<bool> {
        if j < self.base {
            return Ok(true);
        }
        let (index, full) = self.word(0, self.shape.levels - 1, j);
        Ok(self.words.load(index)? >= full)
    }

    /// Collective: frees the window.
    pub fn free(self) -> Result<()> {
        self.words.free()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_cover_every_rank_with_the_fewest_levels() {
        for (world, levels) in [(1, 1), (2, 1), (16, 1), (17, 2), (256, 2), (257, 3), (4096, 3), (4097, 4)] {
            let s = Shape::new(world, FAN);
            assert_eq!(s.levels(), levels, "{world} ranks");
            // The root, on rank 0, counts its children: together they are every rank.
            let root = s.levels() - 1;
            assert_eq!(s.host(world - 1, root), 0);
            let below = if root == 0 { 1 } else { s.span(root - 1) };
            assert_eq!(s.children(0, root), world.div_ceil(below) as u64, "{world}");
        }
        // 40 ranks, fan 4: level 0 nodes of 4 ranks (the last, ranks 36-39), level 1 of 16
        // (the last, ranks 32-39: 2 nodes), level 2 of 64 (the root: 3 nodes of level 1).
        let s = Shape::new(40, 4);
        assert_eq!(s.levels(), 3);
        assert_eq!((s.host(37, 0), s.children(37, 0)), (36, 4));
        assert_eq!((s.host(37, 1), s.children(37, 1)), (32, 2));
        assert_eq!((s.host(37, 2), s.children(37, 2)), (0, 3));
        assert_eq!((s.host(5, 1), s.children(5, 1)), (0, 4));
    }

    #[test]
    fn the_root_completes_once_every_rank_arrived_lap_after_lap() {
        for world in [1, 2, 3, 17, 33] {
            let out = peregrine_transport::run_local(world, |t| -> Result<Vec<usize>> {
                let tree = Tree::new(&t, "test tree", 3, 5)?;
                let mut completed = Vec::new();
                assert!(tree.complete(4)?, "before the first slot: complete");
                for j in 5..12u64 {
                    // Rank r arrives after every other has seen the slot incomplete.
                    for r in 0..world {
                        t.barrier()?;
                        assert!(!tree.complete(j)?, "{j} complete before rank {r} arrived");
                        t.barrier()?;
                        if t.rank() == r {
                            completed.push(tree.arrive(r, j)?);
                        }
                    }
                    t.barrier()?;
                    assert!(tree.complete(j)? && tree.complete(j - 1)?, "{j}");
                    assert_eq!(tree.last(j)?, Some(world - 1), "{j}: the last leaf to arrive");
                }
                t.barrier()?;
                tree.free()?;
                Ok(completed)
            })
            .expect("world");
            let shape = Shape::new(world, FAN);
            for (r, completed) in out.into_iter().enumerate() {
                let completed = completed.expect("rank");
                // The ranks arrive in order: a rank completes the nodes whose last rank it is,
                // the last rank of the world every node above it, the root included.
                let want = (0..shape.levels())
                    .take_while(|&l| r + 1 == (shape.host(r, l) + shape.span(l)).min(world))
                    .count();
                assert!(completed.iter().all(|&c| c == want), "rank {r} of {world}: {completed:?}");
                assert_eq!(want == shape.levels(), r == world - 1, "rank {r} of {world}");
            }
        }
    }

    #[test]
    fn slots_hold_every_rank_the_bound_lets_run_ahead() {
        assert_eq!(
            [Some(0), Some(3), None, Some(65_532), Some(65_533), Some(u64::MAX)].map(slots_for),
            [Some(3), Some(6), None, Some(65_535), None, None]
        );
    }

    #[test]
    fn every_descent_ends_at_a_leaf_node_not_complete_and_draws_spread_them() {
        // 40 ranks: leaf nodes 0-15, 16-31, 32-39 under a root; then 300 ranks, three levels.
        // Each rank descends with 8 draws: every descent ends at a leaf node with a late rank,
        // and over a world's descents at each of them.
        for (world, late, want) in [
            (40, vec![37], vec![32]),
            (40, vec![37, 3], vec![0, 32]),
            (40, vec![], vec![]),
            (300, vec![299], vec![288]),
            (300, vec![299, 130], vec![128, 288]),
            (300, vec![299, 130, 131, 20], vec![16, 128, 288]),
            (1, vec![0], vec![0]),
        ] {
            let got = peregrine_transport::run_local(world, |t| -> Result<Vec<Option<Range<usize>>>> {
                let tree = Tree::new(&t, "test tree", 3, 0)?;
                for j in 0..4u64 {
                    // Everyone arrives at every slot but the last, where the late ranks do not.
                    if j < 3 || !late.contains(&t.rank()) {
                        tree.arrive(t.rank(), j)?;
                    }
                    t.barrier()?;
                }
                let draws = (0..8).map(|d| crate::plan::mix(t.rank() as u64 * 8 + d));
                let missing = draws.map(|d| tree.missing(3, d)).collect::<Result<Vec<_>>>()?;
                assert_eq!(tree.missing(2, 0)?, None);
                t.barrier()?;
                tree.free()?;
                Ok(missing)
            })
            .expect("world");
            // The leaf nodes' first ranks (each leaf node holds 16 ranks, the last fewer).
            let ends = got.into_iter().flat_map(|m| m.expect("rank")).flatten();
            let mut seen: Vec<usize> =
                ends.inspect(|r| assert_eq!(r.end, (r.start + 16).min(world))).map(|r| r.start).collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen, want, "{world} ranks, late {late:?}");
        }
    }

    #[test]
    fn concurrent_arrivals_complete_each_slot_exactly_once_per_lap() {
        // 32 ranks arrive at 40 slots as fast as they can, never more than `slots - 1` ahead
        // of the slowest: before arriving at `j` a rank waits until `j - 3` is complete.
        let world = 32;
        let results = peregrine_transport::run_local(world, |t| -> Result<u64> {
            let tree = Tree::new(&t, "test tree", 4, 0)?;
            let mut roots = 0;
            for j in 0..40u64 {
                if j >= 3 {
                    while !tree.complete(j - 3)? {
                        std::thread::yield_now();
                    }
                }
                let completed = tree.arrive(t.rank(), j)?;
                if completed == tree.shape().levels() {
                    assert!(tree.complete(j)?, "{j}: the root's last arrival did not complete it");
                    roots += 1;
                }
            }
            while !tree.complete(39)? {
                std::thread::yield_now();
            }
            t.barrier()?;
            tree.free()?;
            Ok(roots)
        })
        .expect("world");
        // Each slot's root was completed by exactly one rank (the one whose add filled it).
        let roots: u64 = results.into_iter().map(|r| r.expect("rank")).sum();
        assert_eq!(roots, 40);
    }
}
