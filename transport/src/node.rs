//! Ranks of one node: where each node's ranks sit in the world ([`NodeLayout`]), memory every
//! rank of a node maps ([`NodeShared`]), and a barrier over a node's ranks
//! ([`NodeShared::sync`]).
//!
//! What a node is: under MPI the processes that `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`
//! groups (the launcher's placement); in the local backend, blocks of `per_node` consecutive
//! threads ([`crate::run_local_in_nodes`]: one process is one node, split to test what several
//! nodes do). A layout exists only where every node's ranks are consecutive world ranks (mpirun's
//! and srun's default block placement); a round-robin placement has none, and what needs one
//! falls back to treating every rank alone.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Elem, Result};

/// How the world's ranks fill nodes: node `n` holds the consecutive ranks `ranks(n)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLayout {
    /// The first rank of each node, in order, then the world size.
    bounds: Vec<usize>,
    /// This rank's node.
    node: usize,
    /// This rank.
    rank: usize,
}

impl NodeLayout {
    /// Nodes of `per_node` ranks each (the last may have fewer), seen by `rank`.
    pub fn blocks(world: usize, per_node: usize, rank: usize) -> Self {
        let per_node = per_node.max(1);
        let mut bounds: Vec<usize> = (0..world).step_by(per_node).collect();
        bounds.push(world);
        Self { node: rank / per_node, bounds, rank }
    }

    /// From each rank's node leader (the node's lowest rank, `leaders[r]` for rank `r`), seen by
    /// `rank`; `None` if some node's ranks are not consecutive.
    pub fn from_leaders(leaders: &[usize], rank: usize) -> Option<Self> {
        let mut bounds = Vec::new();
        for (r, &l) in leaders.iter().enumerate() {
            if l == r {
                bounds.push(r);
            } else if r == 0 || leaders[r - 1] != l {
                return None;
            }
        }
        if bounds.first() != Some(&0) {
            return None;
        }
        bounds.push(leaders.len());
        let node = bounds.partition_point(|&b| b <= rank) - 1;
        Some(Self { bounds, node, rank })
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.bounds.len() - 1
    }

    /// This rank's node.
    pub fn node(&self) -> usize {
        self.node
    }

    /// The ranks of node `n`.
    pub fn ranks(&self, n: usize) -> Range<usize> {
        self.bounds[n]..self.bounds[n + 1]
    }

    /// The node of `rank`.
    pub fn node_of(&self, rank: usize) -> usize {
        self.bounds.partition_point(|&b| b <= rank).saturating_sub(1).min(self.nodes() - 1)
    }

    /// This rank's index among its node's ranks.
    pub fn local(&self) -> usize {
        self.rank - self.bounds[self.node]
    }

    /// Ranks on this rank's node.
    pub fn local_size(&self) -> usize {
        self.ranks(self.node).len()
    }

    /// Whether some node holds more than one rank.
    pub fn shares_nodes(&self) -> bool {
        self.bounds.windows(2).any(|b| b[1] - b[0] > 1)
    }
}

/// Memory every rank of a node maps, `len` elements of `T` (zeroed), allocated collectively by
/// the whole world ([`crate::Transport::alloc_node_shared`]), one block per node, with a barrier
/// over the node's ranks.
///
/// Its reads and writes are plain loads and stores ([`as_ptr`](Self::as_ptr)); who may touch
/// what when is the caller's protocol, ordered by the barrier: everything a rank of the node
/// wrote before it [`arrive`](Self::arrive)s is visible to every rank of the node once
/// [`arrived`](Self::arrived) says all have. The barrier is a counter in the node's memory
/// (an atomic add to arrive, loads to poll), so a rank may poll it between other work, and
/// leave it unfinished when the job ends (nothing is left pending in a library).
#[derive(Debug)]
pub struct NodeShared<T: Elem> {
    pub(crate) inner: NodeInner<T>,
    /// Barriers this rank entered.
    pub(crate) entered: AtomicU64,
    /// Ranks on the node.
    pub(crate) ranks: u64,
}

#[derive(Debug)]
pub(crate) enum NodeInner<T: Elem> {
    Local(crate::local::LocalNode<T>),
    #[cfg(feature = "mpi")]
    Mpi(crate::mpi::MpiNode<T>),
}

impl<T: Elem> NodeShared<T> {
    pub(crate) fn new(inner: NodeInner<T>, ranks: usize) -> Self {
        Self { inner, entered: AtomicU64::new(0), ranks: ranks as u64 }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        match &self.inner {
            NodeInner::Local(n) => n.len(),
            #[cfg(feature = "mpi")]
            NodeInner::Mpi(n) => n.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first element; the block is `len` elements from there, the same memory for every rank
    /// of the node. Reading or writing through it is the caller's to order (the barrier): no
    /// rank may write an element while another reads or writes it.
    pub fn as_ptr(&self) -> *mut T {
        match &self.inner {
            NodeInner::Local(n) => n.as_ptr(),
            #[cfg(feature = "mpi")]
            NodeInner::Mpi(n) => n.as_ptr(),
        }
    }

    /// The node's barrier count.
    fn counter(&self) -> &AtomicU64 {
        match &self.inner {
            NodeInner::Local(n) => n.counter(),
            #[cfg(feature = "mpi")]
            NodeInner::Mpi(n) => n.counter(),
        }
    }

    /// Enters the node's next barrier, this rank's writes to the block before it published;
    /// returns the barrier's ticket for [`arrived`](Self::arrived). Every rank of the node enters
    /// the same barriers in the same order.
    pub fn arrive(&self) -> u64 {
        let k = self.entered.fetch_add(1, Ordering::Relaxed) + 1;
        self.counter().fetch_add(1, Ordering::AcqRel);
        k * self.ranks
    }

    /// Whether every rank of the node has entered the barrier of `ticket` (then the writes they
    /// published are visible here). A rank of the node that left the world makes it an error
    /// (local backend; under MPI the job ends with the rank).
    pub fn arrived(&self, ticket: u64) -> Result<bool> {
        if self.counter().load(Ordering::Acquire) >= ticket {
            return Ok(true);
        }
        match &self.inner {
            NodeInner::Local(n) => match n.check_peers() {
                Ok(()) => Ok(false),
                // A peer that entered the barrier after the count was read above, then left the
                // world, completed it: its leaving is recorded under the lock `check_peers`
                // takes, after its arrival, so the count read again now shows the arrival.
                Err(_) if self.counter().load(Ordering::Acquire) >= ticket => Ok(true),
                Err(e) => Err(e),
            },
            #[cfg(feature = "mpi")]
            NodeInner::Mpi(_) => Ok(false),
        }
    }

    /// The node barrier, waited for here (yielding the core, then sleeping, while it lasts).
    pub fn sync(&self) -> Result<()> {
        let ticket = self.arrive();
        let mut polls = 0u32;
        while !self.arrived(ticket)? {
            polls += 1;
            if polls < 64 {
                std::hint::spin_loop();
            } else if polls < 1024 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_of_ranks() {
        let l = NodeLayout::blocks(5, 2, 4);
        assert_eq!((l.nodes(), l.node(), l.local(), l.local_size()), (3, 2, 0, 1));
        assert_eq!(l.ranks(1), 2..4);
        assert_eq!((0..5).map(|r| l.node_of(r)).collect::<Vec<_>>(), [0, 0, 1, 1, 2]);
        assert!(l.shares_nodes());
        assert!(!NodeLayout::blocks(3, 1, 0).shares_nodes());
    }

    #[test]
    fn node_blocks_are_shared_within_a_node_and_ordered_by_its_barrier() {
        // 5 ranks in nodes of 2, 2 and 1: each rank writes its rank into its node's block at its
        // local index, 20 rounds; after the barrier it reads its node's ranks' values.
        let out = crate::run_local_in_nodes(5, 2, |t| -> Result<Vec<u64>> {
            let layout = t.node_layout().expect("layout");
            let block = t.alloc_node_shared::<u64>("test", 2)?.expect("block");
            let mut seen = Vec::new();
            for round in 0..20u64 {
                // SAFETY: this rank's own element, read by others only after the barrier.
                unsafe { *block.as_ptr().add(layout.local()) = 100 * round + t.rank() as u64 };
                block.sync()?;
                // SAFETY: written before the barrier; nobody writes until the next one (below).
                seen = (0..layout.local_size()).map(|l| unsafe { *block.as_ptr().add(l) }).collect();
                assert!(seen.iter().all(|v| v / 100 == round), "rank {} round {round}: {seen:?}", t.rank());
                block.sync()?;
            }
            Ok(seen)
        })
        .expect("world");
        let seen: Vec<Vec<u64>> = out.into_iter().map(|r| r.expect("rank")).collect();
        assert_eq!(
            seen,
            [vec![1900, 1901], vec![1900, 1901], vec![1902, 1903], vec![1902, 1903], vec![1904]]
        );
    }

    #[test]
    fn a_node_barrier_whose_peer_left_is_an_error() {
        let out = crate::run_local_in_nodes(2, 2, |t| -> Result<()> {
            let block = t.alloc_node_shared::<f32>("test", 1)?.expect("block");
            if t.rank() == 1 {
                return Ok(());
            }
            block.sync()
        })
        .expect("world");
        let e = out[0].as_ref().expect_err("rank 0 waits for a rank that left");
        assert!(matches!(e.kind(), crate::ErrorKind::PeerExited { peer: 1, .. }), "{e}");
    }

    #[test]
    fn layout_from_leaders() {
        let l = NodeLayout::from_leaders(&[0, 0, 0, 3, 3, 5], 4).expect("consecutive");
        assert_eq!((l.nodes(), l.node(), l.local(), l.local_size()), (3, 1, 1, 2));
        assert_eq!(l.ranks(2), 5..6);
        // Round robin: node 0 holds ranks 0 and 2.
        assert_eq!(NodeLayout::from_leaders(&[0, 1, 0, 1], 0), None);
        assert_eq!(NodeLayout::from_leaders(&[1, 1], 0), None);
    }
}
