//! What things cost in the simulated world: communication by an alpha-beta model per operation,
//! compute per chunk from a model (constant, a measured distribution, or replayed per rank and
//! iteration).

use std::fmt;
use std::str::FromStr;

use super::events::Nanos;
use crate::plan::mix;

/// One kind of link: what one operation costs over it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Seconds from issuing a read (get) to its data: paid once per batch of pipelined reads or
    /// writes (one flush).
    pub latency: f64,
    /// Seconds of one atomic operation (fetch-and-op, compare-and-swap, atomic load) waited for
    /// on its own: a round trip.
    pub atomic: f64,
    /// Seconds one more operation adds when issued back to back behind others before one
    /// completion (LogP's gap: a batch reading a word of every rank costs `atomic + (n - 1) *
    /// gap`, not `n * atomic`).
    pub gap: f64,
    /// Bytes per second over the link. Between nodes it is the node's network card's, shared
    /// by the node's ranks (under a synchronous scheme they all pull and push at about the same
    /// time): each of `k` ranks on a node moves its bytes at `bandwidth / k`. Within a node,
    /// one rank's.
    pub bandwidth: f64,
}

/// The simulated network: links within a node and between nodes, and how ranks fill nodes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Network {
    /// Between ranks of one node.
    pub intra: Link,
    /// Between ranks of different nodes.
    pub inter: Link,
    /// Ranks per node (rank `r` is on node `r / ranks_per_node`).
    pub ranks_per_node: usize,
}

/// What one rank's communication costs in an iteration when the ranks of a node share one copy
/// of the parameters and combine their updates on the node ([`Network::combine`]). The order is
/// pull, node barrier, compute, push copy, node barrier, push sum; each barrier holds every rank
/// of the node until the last one arrives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CombineCosts {
    /// The rank's stripe fetched from every other node (one latency of the link between nodes,
    /// the stripe's bytes over its bandwidth) and its own shard copied into the node's copy.
    pub pull: Nanos,
    /// The rank's whole update copied into its slot of the node's shared buffer.
    pub push_copy: Nanos,
    /// After the node barrier: the rank's stripe summed over the node's slots (the whole update's
    /// bytes read), shard by shard, each shard's sum written to the rank holding it on another
    /// node as soon as it is summed (the sends overlap the sums of the next shards).
    pub push_sum: Nanos,
    /// One node barrier once the last rank of the node arrived: one atomic round trip within
    /// the node.
    pub barrier: Nanos,
}

/// Named link figures (`--intra`, `--inter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// The local backend (ranks as threads) on the development machine: `peregrine bench rma
    /// --ranks 2`, 2-core Zen 3, 2026-11-23 (8 B get/atomic ~0.05 us, large accumulate ~3.6 GB/s).
    Local,
    /// OpenMPI's shared-memory one-sided component on one node: the README's `mpirun -n 2
    /// peregrine bench rma` table (8 B get 0.025 us, fetch_add 0.025 us, 1 MiB get 17 GB/s).
    Shm,
    /// InfiniBand HDR (200 Gb/s) with RDMA one-sided operations (OpenMPI + UCX): typical
    /// published OSU figures (osu_get_latency ~1.5 us, osu_fop_latency ~2.5 us, osu_get_bw
    /// ~23 GB/s); not measured here.
    Ib,
    /// 25 Gb Ethernet, one-sided operations over TCP (emulated by messages, `osc=pt2pt` or UCX
    /// over TCP): ~25 us latency, ~40 us per atomic round trip, ~2.8 GB/s; typical figures, not
    /// measured here.
    Ethernet,
}

impl Preset {
    /// The link.
    pub fn link(self) -> Link {
        match self {
            Self::Local => Link { latency: 0.05e-6, atomic: 0.05e-6, gap: 0.01e-6, bandwidth: 3.6e9 },
            Self::Shm => Link { latency: 0.025e-6, atomic: 0.025e-6, gap: 0.02e-6, bandwidth: 17e9 },
            Self::Ib => Link { latency: 1.5e-6, atomic: 2.5e-6, gap: 0.25e-6, bandwidth: 23e9 },
            Self::Ethernet => Link { latency: 25e-6, atomic: 40e-6, gap: 2e-6, bandwidth: 2.8e9 },
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Local => "local",
            Self::Shm => "shm",
            Self::Ib => "ib",
            Self::Ethernet => "ethernet",
        })
    }
}

impl FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "local" => Ok(Self::Local),
            "shm" => Ok(Self::Shm),
            "ib" | "infiniband" => Ok(Self::Ib),
            "ethernet" | "eth" | "tcp" => Ok(Self::Ethernet),
            _ => Err(format!("unknown link `{s}`: expected local, shm, ib or ethernet")),
        }
    }
}

impl Default for Network {
    /// One rank per node (a rank's threads fill its node), nodes joined by InfiniBand.
    fn default() -> Self {
        Self { intra: Preset::Shm.link(), inter: Preset::Ib.link(), ranks_per_node: 1 }
    }
}

/// Seconds to nanoseconds, rounded (costs are summed as integers, so sums are exact); negative
/// or NaN is 0, and past `u64::MAX` nanoseconds (585 years) is `u64::MAX`, which ends a
/// simulation at its horizon ([`super::HORIZON`]).
pub fn nanos(seconds: f64) -> Nanos {
    (seconds.max(0.0) * 1e9).round() as Nanos
}

impl Network {
    /// The node of `rank`.
    pub fn node(&self, rank: usize) -> usize {
        rank / self.ranks_per_node.max(1)
    }

    /// The link from `a` to `b`.
    pub fn link(&self, a: usize, b: usize) -> &Link {
        if self.node(a) == self.node(b) {
            &self.intra
        } else {
            &self.inter
        }
    }

    /// One pipelined transfer of `params` f32 values sharded evenly over `world` ranks, by
    /// `rank` from or to every shard (a dense pull, or a push and its flush): one latency of the
    /// slowest link used, plus each link's bytes over its bandwidth (between nodes the node's
    /// ranks share it).
    pub fn transfer(&self, rank: usize, world: usize, params: usize) -> Nanos {
        let world = world.max(1);
        // Shards on this rank's node (its own included) and elsewhere.
        let local_ranks = self.node_ranks(rank, world);
        let bytes = |ranks: usize| (params as f64 * 4.0) * ranks as f64 / world as f64;
        let (li, le) = (local_ranks, world - local_ranks);
        let mut s = 0.0;
        if params > 0 {
            s += if le > 0 { self.inter.latency } else { self.intra.latency };
            s += bytes(li) / self.intra.bandwidth
                + if le > 0 { bytes(le) / self.shared_inter(local_ranks) } else { 0.0 };
        }
        nanos(s)
    }

    /// Bytes per second of each of `k` ranks of a node moving data between nodes at once.
    fn shared_inter(&self, k: usize) -> f64 {
        self.inter.bandwidth / k.max(1) as f64
    }

    /// Ranks on `rank`'s node, in a world of `world` (the last node may be part full).
    fn node_ranks(&self, rank: usize, world: usize) -> usize {
        let per_node = self.ranks_per_node.max(1).min(world.max(1));
        let start = self.node(rank) * per_node;
        (world.min(start + per_node) - start.min(world)).max(1)
    }

    /// What `rank`'s pull and push of `params` f32 values sharded evenly over `world` ranks cost
    /// when the ranks of a node share one copy of the parameters and combine their updates
    /// before anything crosses the network ([`CombineCosts`]). A node of `k` ranks fetches the
    /// shards held elsewhere (`world - k` of them) and writes its sums of them back, each of
    /// its ranks a `1/k` stripe of them: for full nodes, `nodes - 1` shards a rank each way,
    /// pipelined behind one latency of the link between nodes.
    pub fn combine(&self, rank: usize, world: usize, params: usize) -> CombineCosts {
        let world = world.max(1);
        let k = self.node_ranks(rank, world);
        let bytes = params as f64 * 4.0;
        let shard = bytes / world as f64;
        let far = (world - k) as f64 * shard / k as f64;
        let (latency, transfer) = if params > 0 && world > k {
            (self.inter.latency, far / self.shared_inter(k))
        } else {
            (0.0, 0.0)
        };
        // The push sums one shard after another and sends each at once: a two-stage pipeline
        // over the shards held elsewhere (about `(world - k) / k` of them), whose makespan is the
        // longer stage in full and one piece of the shorter.
        let sum = bytes / self.intra.bandwidth;
        let pieces = ((world - k) as f64 / k as f64).round().max(1.0);
        let push_sum =
            if transfer > 0.0 { sum.max(transfer) + latency + sum.min(transfer) / pieces } else { sum };
        CombineCosts {
            pull: nanos(latency + transfer + shard / self.intra.bandwidth),
            push_copy: nanos(bytes / self.intra.bandwidth),
            push_sum: nanos(push_sum),
            barrier: nanos(self.intra.atomic),
        }
    }

    /// One atomic operation by `from` on a word of `to`.
    pub fn atomic(&self, from: usize, to: usize) -> Nanos {
        nanos(self.link(from, to).atomic)
    }

    /// The mean cost of one atomic operation by `rank` on a word of a rank chosen at random (reads
    /// of many ranks' words: clocks, queues, rates).
    pub fn mean_atomic(&self, world: usize) -> f64 {
        self.mean(world, |l| l.atomic)
    }

    /// The mean gap ([`Link::gap`]) of one more read in a batch reading a word of every rank.
    pub fn mean_gap(&self, world: usize) -> f64 {
        self.mean(world, |l| l.gap)
    }

    /// `figure` of the link to a rank chosen at random among `world`, on average.
    fn mean(&self, world: usize, figure: impl Fn(&Link) -> f64) -> f64 {
        if world <= 1 {
            return figure(&self.intra);
        }
        let per_node = self.ranks_per_node.max(1).min(world);
        let near = (per_node - 1) as f64 / (world - 1) as f64;
        near * figure(&self.intra) + (1.0 - near) * figure(&self.inter)
    }
}

/// What one chunk costs a thread to compute, before the injected stragglers.
#[derive(Clone, Debug, PartialEq)]
pub enum ComputeModel {
    /// Every chunk takes this many seconds.
    Constant(f64),
    /// Chunk seconds drawn from these measured ones, by a hash of the chunk (iteration, batch
    /// chunk), so that every scheme meets the same costs.
    Samples(Vec<f64>),
    /// Per rank and iteration, as measured in a real run.
    Replay(Replay),
}

/// A real run's measured costs, per rank and iteration (missing ones: the rank's median; a rank
/// with no chunk at all: every rank's median chunk).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replay {
    /// `per_rank[r][it]`: seconds.
    pub per_rank: Vec<Vec<Option<Measured>>>,
    /// Per rank, the median of each field.
    pub median: Vec<Measured>,
}

/// One rank's measured costs in one iteration.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measured {
    /// Seconds a thread spent per chunk, the injected delay taken out (NaN: the rank computed no
    /// chunk in that iteration; its median stands in).
    pub chunk: f64,
    /// Seconds pulling and pushing.
    pub comm: f64,
    /// Seconds of the iteration outside compute, communication and waits (opening, closing,
    /// writing metrics).
    pub overhead: f64,
}

impl Replay {
    /// Builds the medians from `per_rank`.
    /// A rank that computed no chunk in the whole run (others took all of its chunks) gets the
    /// median over every rank's chunks: its own cost is unknown, and none at all would let it
    /// compute for free in the replay.
    pub fn new(per_rank: Vec<Vec<Option<Measured>>>) -> Self {
        fn median<'m>(v: impl Iterator<Item = &'m Measured>, f: fn(&Measured) -> f64) -> Option<f64> {
            let mut v: Vec<f64> = v.map(f).filter(|x| !x.is_nan()).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        }
        let every_chunk = median(per_rank.iter().flatten().flatten(), |m| m.chunk).unwrap_or(0.0);
        let median = per_rank
            .iter()
            .map(|its| {
                let field = |f| median(its.iter().flatten(), f);
                Measured {
                    chunk: field(|m| m.chunk).unwrap_or(every_chunk),
                    comm: field(|m| m.comm).unwrap_or(0.0),
                    overhead: field(|m| m.overhead).unwrap_or(0.0),
                }
            })
            .collect();
        Self { per_rank, median }
    }

    /// `rank`'s costs in iteration `it`.
    pub fn get(&self, rank: usize, it: u64) -> Measured {
        let r = rank % self.per_rank.len().max(1);
        let median = self.median.get(r).copied().unwrap_or_default();
        match self.per_rank.get(r).and_then(|its| its.get(it as usize).copied().flatten()) {
            Some(m) if m.chunk.is_nan() => Measured { chunk: median.chunk, ..m },
            Some(m) => m,
            None => median,
        }
    }
}

impl ComputeModel {
    /// Seconds for one thread of `rank` (in its iteration `it`) to compute chunk `chunk` of
    /// iteration `chunk_it`'s batch.
    pub fn chunk(&self, rank: usize, it: u64, chunk_it: u64, chunk: usize) -> f64 {
        match self {
            Self::Constant(s) => *s,
            Self::Samples(v) if v.is_empty() => 0.0,
            Self::Samples(v) => {
                v[(mix(chunk_it.wrapping_mul(0x9E37_79B9) ^ mix(chunk as u64)) % v.len() as u64) as usize]
            }
            Self::Replay(r) => r.get(rank, it).chunk,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(per_node: usize) -> Network {
        Network {
            intra: Link { latency: 1e-6, atomic: 2e-6, gap: 0.1e-6, bandwidth: 1e9 },
            inter: Link { latency: 10e-6, atomic: 20e-6, gap: 1e-6, bandwidth: 1e8 },
            ranks_per_node: per_node,
        }
    }

    #[test]
    fn a_transfer_is_one_latency_plus_bytes_over_bandwidth() {
        // 1M floats over 4 ranks, 2 per node: rank 0 has 2 shards (2 MB) near and 2 MB far, at
        // half the card's 100 MB/s (the node's other rank moves as much at once).
        let n = net(2);
        let s = 10e-6 + 2e6 / 1e9 + 2e6 / 5e7;
        assert_eq!(n.transfer(0, 4, 1_000_000), nanos(s));
        // All on one node: the near link only.
        assert_eq!(net(4).transfer(3, 4, 1_000_000), nanos(1e-6 + 4e6 / 1e9));
        // Nothing to move costs nothing.
        assert_eq!(n.transfer(0, 4, 0), 0);
        // A last node that is not full: rank 4 of 5 is alone on node 2 (the whole card).
        assert_eq!(n.transfer(4, 5, 1_000_000), nanos(10e-6 + 0.8e6 / 1e9 + 3.2e6 / 1e8));
    }

    #[test]
    fn a_node_combine_moves_a_stripe_between_nodes_and_the_whole_update_within() {
        // 1M floats over 8 ranks, 4 per node: a shard is 500 KB; a rank fetches its stripe's
        // one shard from the other node (10 us + 500 KB at a quarter of the card's 100 MB/s: the
        // node's 4 ranks fetch at once) and copies its own shard into the node's copy (500 KB at
        // 1 GB/s); it copies its 4 MB update into its slot, then reads the node's 4 slots of its
        // stripe (4 MB) and writes one shard's sum to the other node.
        let c = net(4).combine(5, 8, 1_000_000);
        assert_eq!(c.pull, nanos(10e-6 + 5e5 / 2.5e7 + 5e5 / 1e9));
        assert_eq!(c.pull, 20_510_000);
        assert_eq!(c.push_copy, 4_000_000);
        // The sum (4 ms) and the send of the one shard held elsewhere (20 ms) do not overlap:
        // one piece.
        assert_eq!(c.push_sum, nanos(4e6 / 1e9 + 10e-6 + 5e5 / 2.5e7));
        assert_eq!(c.push_sum, 24_010_000);
        // 64 ranks, 4 per node: 15 shards held elsewhere, 62.5 KB each (937.5 KB at 25 MB/s:
        // 37.5 ms), summed from 4 MB of slots (4 ms): the sends in full, behind the sum of the
        // first shard (a fifteenth of the sum) and one latency.
        let c = net(4).combine(0, 64, 1_000_000);
        assert_eq!(c.push_sum, nanos(15.0 * 62_500.0 / 2.5e7 + 10e-6 + 4e6 / 1e9 / 15.0));
        // Over a card 100 times faster (937.5 KB at 2.5 GB/s: 0.375 ms) the sum is the longer
        // stage: in full, then the last shard's send.
        let mut fast = net(4);
        fast.inter.bandwidth = 1e10;
        let c = fast.combine(0, 64, 1_000_000);
        assert_eq!(c.push_sum, nanos(4e6 / 1e9 + 10e-6 + 15.0 * 62_500.0 / 2.5e9 / 15.0));
        assert_eq!(c.barrier, 2_000);
        // The flat transfer moves 2 MB between nodes each way (80 ms), the combine 500 KB.
        assert_eq!(net(4).transfer(5, 8, 1_000_000), nanos(10e-6 + 2e6 / 1e9 + 2e6 / 2.5e7));
        // 16 ranks, 4 per node: 3 shards of 250 KB from the other nodes, pipelined.
        assert_eq!(net(4).combine(0, 16, 1_000_000).pull, nanos(10e-6 + 7.5e5 / 2.5e7 + 2.5e5 / 1e9));
        // A last node that is not full (10 ranks, 400 KB a shard): ranks 8 and 9 share the 8
        // shards held elsewhere (4 each, at half the card), ranks 0-3 the 6 held on nodes 1 and
        // 2 (1.5 each, at a quarter).
        assert_eq!(net(4).combine(9, 10, 1_000_000).pull, nanos(10e-6 + 1.6e6 / 5e7 + 4e5 / 1e9));
        assert_eq!(net(4).combine(0, 10, 1_000_000).pull, nanos(10e-6 + 6e5 / 2.5e7 + 4e5 / 1e9));
        // Every rank on one node: nothing crosses the network.
        let one = net(8).combine(3, 8, 1_000_000);
        assert_eq!((one.pull, one.push_sum), (nanos(5e5 / 1e9), nanos(4e6 / 1e9)));
        // Nothing to move costs nothing but the copies of nothing.
        let none = net(4).combine(0, 8, 0);
        assert_eq!((none.pull, none.push_copy, none.push_sum), (0, 0, 0));
    }

    #[test]
    fn atomics_cost_the_link_they_cross() {
        let n = net(2);
        assert_eq!(n.atomic(0, 1), 2_000);
        assert_eq!(n.atomic(1, 2), 20_000);
        // 5 ranks, 2 per node: 1 of the 4 others is near.
        assert!((n.mean_atomic(5) - (0.25 * 2e-6 + 0.75 * 20e-6)).abs() < 1e-15);
        assert_eq!(n.mean_atomic(1), 2e-6);
        // A batch's further words cost the gap, mixed the same way.
        assert!((n.mean_gap(5) - (0.25 * 0.1e-6 + 0.75 * 1e-6)).abs() < 1e-15);
        assert_eq!(n.mean_gap(1), 0.1e-6);
    }

    #[test]
    fn compute_models_give_the_same_cost_to_the_same_chunk() {
        let m = ComputeModel::Samples(vec![1.0, 2.0, 3.0, 4.0]);
        let a = m.chunk(0, 7, 7, 11);
        assert_eq!(a, m.chunk(5, 9, 7, 11), "the chunk, not who computes it, picks the sample");
        let drawn: std::collections::BTreeSet<u64> = (0..200).map(|c| m.chunk(0, 0, 0, c) as u64).collect();
        assert_eq!(drawn.len(), 4, "every sample is drawn");
        let r = Replay::new(vec![vec![
            Some(Measured { chunk: 1.0, comm: 0.1, overhead: 0.0 }),
            None,
            Some(Measured { chunk: 3.0, comm: 0.3, overhead: 0.0 }),
            Some(Measured { chunk: f64::NAN, comm: 0.5, overhead: 0.0 }),
        ]]);
        assert_eq!(r.get(0, 3), Measured { chunk: 3.0, comm: 0.5, overhead: 0.0 }, "no chunk: its median");
        let m = ComputeModel::Replay(r);
        assert_eq!(m.chunk(0, 0, 0, 0), 1.0);
        assert_eq!(m.chunk(0, 1, 1, 0), 3.0, "a missing iteration: the rank's median");
        assert_eq!(m.chunk(0, 99, 99, 0), 3.0);
        // A rank that computed no chunk at all: the median over every rank's chunks (2.0 of
        // 1, 2, 3), not nothing.
        let r = Replay::new(vec![
            vec![Some(Measured { chunk: 1.0, ..Measured::default() })],
            vec![Some(Measured { chunk: f64::NAN, comm: 0.2, overhead: 0.0 }), None],
            vec![
                Some(Measured { chunk: 3.0, ..Measured::default() }),
                Some(Measured { chunk: 2.0, ..Measured::default() }),
            ],
        ]);
        assert_eq!(r.get(1, 0), Measured { chunk: 2.0, comm: 0.2, overhead: 0.0 });
        assert_eq!(r.get(1, 1).chunk, 2.0);
    }
}
