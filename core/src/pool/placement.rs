//! Placement: which CPU each worker of each rank gets, from the process's cores in locality
//! order (split among the ranks of the process, one PU of every core before the second
//! hyperthread, oversubscription wrapping around), and the text that says so. Pure, so it is
//! tested on made-up machines.

use super::Slot;

/// A core as the pool sees it: the OS ids of its PUs (hyperthreads) the process may run on.
pub(super) type Core = Vec<usize>;

/// The cpus of one slot's workers.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct CpuPlan {
    /// One cpu per worker.
    pub(super) cpus: Vec<usize>,
    /// Distinct cores the workers are on.
    cores_used: usize,
    /// Some workers share a core (hyperthreads of one core).
    smt: bool,
    /// More workers than cpus in the group: some cpus run several workers.
    oversubscribed: bool,
    /// Fewer units than ranks: this slot's cpus are also another slot's (units, ranks).
    shared: Option<(usize, usize)>,
    /// Whether hyperthreads, not cores, were split among the ranks (fewer cores than ranks).
    split_pus: bool,
}

impl CpuPlan {
    /// The cpus of `max_threads` workers of `slot`, from the process's `cores` in locality order.
    pub(super) fn new(cores: &[Core], slot: Slot, max_threads: usize) -> Option<Self> {
        // What is split among the ranks: cores, or single PUs if there are fewer cores than ranks
        // (distinct hyperthreads before sharing anything). Each unit is tagged with its core.
        let split_pus = cores.len() < slot.of && cores.iter().map(Vec::len).sum::<usize>() > cores.len();
        let units: Vec<(usize, &[usize])> = if split_pus {
            cores
                .iter()
                .enumerate()
                .flat_map(|(c, pus)| pus.iter().map(move |pu| (c, std::slice::from_ref(pu))))
                .collect()
        } else {
            cores.iter().enumerate().map(|(c, pus)| (c, &pus[..])).collect()
        };
        let (picked, shared) = split(units.len(), slot);
        // This slot's cores, each with its PUs in this slot.
        let mut group: Vec<(usize, Vec<usize>)> = Vec::new();
        for &u in &picked {
            let (c, pus) = units[u];
            match group.last_mut() {
                Some((last, v)) if *last == c => v.extend_from_slice(pus),
                _ => group.push((c, pus.to_vec())),
            }
        }
        // One PU of every core first, then the second hyperthread of every core, ...
        let depth = group.iter().map(|(_, pus)| pus.len()).max().unwrap_or(0);
        let order: Vec<(usize, usize)> = (0..depth)
            .flat_map(|k| group.iter().filter_map(move |(c, pus)| pus.get(k).map(|&pu| (*c, pu))))
            .collect();
        if order.is_empty() {
            return None;
        }
        let used = &order[..max_threads.min(order.len())];
        let mut cores_used: Vec<usize> = used.iter().map(|&(c, _)| c).collect();
        cores_used.sort_unstable();
        cores_used.dedup();
        Some(Self {
            cpus: (0..max_threads).map(|i| order[i % order.len()].1).collect(),
            cores_used: cores_used.len(),
            smt: used.len() > cores_used.len(),
            oversubscribed: max_threads > order.len(),
            shared: shared.then_some((units.len(), slot.of)),
            split_pus,
        })
    }

    /// The text of [`Placement::how`](super::Placement::how) for a pinned pool.
    pub(super) fn describe(&self, mechanism: &str, unit: &str, slot: Slot) -> String {
        let threads = self.cpus.len();
        let mut how = format!(
            "{mechanism}: 1 cpu per thread, {threads} thread{} on {} {unit}{}",
            plural(threads),
            self.cores_used,
            plural(self.cores_used)
        );
        if slot.of > 1 {
            how += &format!(" (slot {} of {})", slot.index, slot.of);
        }
        if self.split_pus {
            how += &format!("; fewer {unit}s than ranks: hyperthreads split among ranks");
        }
        if self.smt {
            how += "; threads share cores (hyperthreads)";
        }
        if self.oversubscribed {
            let mut distinct = self.cpus.clone();
            distinct.sort_unstable();
            distinct.dedup();
            how += &format!("; oversubscribed: {threads} threads on {} cpus", distinct.len());
        }
        if let Some((units, ranks)) = self.shared {
            let what = if self.split_pus { "cpus".to_string() } else { format!("{unit}s") };
            how += &format!("; shared with other ranks: {units} {what} for {ranks} ranks, round-robin");
        }
        how
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The units (indices into `0..units`) of `slot`, and whether they are shared with other slots.
/// With `units >= slot.of`: `slot.of` contiguous, disjoint groups covering everything, sizes
/// differing by at most one. With fewer units: unit `slot.index % units`, shared.
fn split(units: usize, slot: Slot) -> (Vec<usize>, bool) {
    if units == 0 {
        (Vec::new(), false)
    } else if units >= slot.of {
        ((slot.index * units / slot.of..(slot.index + 1) * units / slot.of).collect(), false)
    } else {
        (vec![slot.index % units], true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn plan_prefers_distinct_cores_then_hyperthreads() {
        // 2 cores with 2 hyperthreads each, Linux-style numbering (siblings n apart).
        let cores = vec![vec![0, 2], vec![1, 3]];
        let p = CpuPlan::new(&cores, Slot::WHOLE, 2).expect("plan");
        assert_eq!(p.cpus, [0, 1]);
        assert!(!p.smt && !p.oversubscribed && p.shared.is_none());
        let p = CpuPlan::new(&cores, Slot::WHOLE, 4).expect("plan");
        assert_eq!(p.cpus, [0, 1, 2, 3]);
        assert!(p.smt && !p.oversubscribed);
        assert!(p.describe("hwloc", "core", Slot::WHOLE).contains("hyperthreads"));
        let p = CpuPlan::new(&cores, Slot::WHOLE, 6).expect("plan");
        assert_eq!(p.cpus, [0, 1, 2, 3, 0, 1]);
        assert!(p.oversubscribed);
        let how = p.describe("hwloc", "core", Slot::WHOLE);
        assert!(how.contains("oversubscribed: 6 threads on 4 cpus"), "{how}");
    }

    #[test]
    fn plan_splits_cores_then_hyperthreads_then_shares() {
        let cores = vec![vec![0, 2], vec![1, 3]];
        // 2 ranks: one core each, both its hyperthreads.
        let p = CpuPlan::new(&cores, Slot { index: 1, of: 2 }, 2).expect("plan");
        assert_eq!(p.cpus, [1, 3]);
        assert!(p.smt && p.shared.is_none());
        // 4 ranks on 2 cores: one hyperthread each, not shared.
        let cpus: Vec<Vec<usize>> =
            (0..4).map(|r| CpuPlan::new(&cores, Slot { index: r, of: 4 }, 1).expect("plan").cpus).collect();
        assert_eq!(cpus, [[0], [2], [1], [3]]);
        let p = CpuPlan::new(&cores, Slot { index: 3, of: 4 }, 1).expect("plan");
        assert!(p.split_pus && p.shared.is_none());
        // 6 ranks on 4 PUs: round-robin, shared.
        let p = CpuPlan::new(&cores, Slot { index: 5, of: 6 }, 1).expect("plan");
        assert_eq!(p.cpus, [2]);
        assert_eq!(p.shared, Some((4, 6)));
        let how = p.describe("hwloc", "core", Slot { index: 5, of: 6 });
        assert!(how.contains("shared with other ranks: 4 cpus for 6 ranks"), "{how}");
        // No cores: nothing to pin to.
        assert_eq!(CpuPlan::new(&[], Slot::WHOLE, 1), None);
    }

    proptest! {
        #[test]
        fn split_is_contiguous_disjoint_and_covering(units in 0usize..200, of in 1usize..40) {
            let groups: Vec<(Vec<usize>, bool)> = (0..of).map(|index| split(units, Slot { index, of })).collect();
            if units >= of {
                let flat: Vec<usize> = groups.iter().flat_map(|(g, _)| g.clone()).collect();
                prop_assert_eq!(flat, (0..units).collect::<Vec<_>>());
                for (g, shared) in &groups {
                    prop_assert!(!shared);
                    prop_assert!(g.len() == units / of || g.len() == units / of + 1);
                }
            } else {
                for (index, (g, shared)) in groups.iter().enumerate() {
                    prop_assert!(*shared || units == 0);
                    if units > 0 {
                        prop_assert_eq!(g.clone(), vec![index % units]);
                    }
                }
            }
        }

        #[test]
        fn plan_gives_each_worker_a_cpu_of_its_group(
            n_cores in 1usize..12, smt in 1usize..4, of in 1usize..6, threads in 1usize..20,
        ) {
            let cores: Vec<Core> = (0..n_cores).map(|c| (0..smt).map(|t| t * n_cores + c).collect()).collect();
            let plans: Vec<CpuPlan> =
                (0..of).map(|index| CpuPlan::new(&cores, Slot { index, of }, threads).expect("plan")).collect();
            for p in &plans {
                prop_assert_eq!(p.cpus.len(), threads);
                // Distinct cores first: the first workers, one per core used, are on distinct cores.
                let k = threads.min(p.cores_used);
                let first: BTreeSet<usize> = p.cpus[..k].iter().map(|c| c % n_cores).collect();
                prop_assert_eq!(first.len(), k);
                let all: BTreeSet<usize> = p.cpus.iter().map(|c| c % n_cores).collect();
                prop_assert_eq!(all.len(), p.cores_used);
            }
            if n_cores * smt >= of {
                // No cpu is in two slots.
                for (i, a) in plans.iter().enumerate() {
                    for b in &plans[i + 1..] {
                        prop_assert!(a.cpus.iter().all(|c| !b.cpus.contains(c)));
                    }
                }
            }
        }
    }
}
