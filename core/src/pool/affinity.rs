//! Discovery and binding: the CPUs the process may use (hwloc's topology, or the Linux affinity
//! mask), the plan of a rank's pinning, and binding threads (`hwloc_set_cpubind`,
//! `sched_setaffinity`) and memory (hwloc, to the pool's NUMA node) to them.

#[cfg(feature = "hwloc")]
use std::sync::Arc;

use super::placement::{Core, CpuPlan};
use super::Slot;

/// What pinning will be attempted.
pub(super) struct Binding {
    pub(super) binder: Binder,
    pub(super) plan: CpuPlan,
    /// All cpus the process may use: where threads go back to if pinning fails.
    pub(super) process_cpus: Vec<usize>,
    pub(super) numa_node: Option<usize>,
    pub(super) mechanism: String,
    /// What `CpuPlan`'s units are: "core" (hwloc) or "cpu" (no topology).
    pub(super) unit_name: &'static str,
}

impl Binding {
    /// The pinning plan for `slot`, or why the pool cannot be pinned.
    pub(super) fn discover(max_threads: usize, slot: Slot) -> Result<Self, String> {
        #[cfg(feature = "hwloc")]
        let fallback_note = match hwloc::Topo::new().and_then(|topo| topo.target(max_threads, slot)) {
            Ok(target) => return Ok(target),
            Err(e) => format!("hwloc failed ({e}), "),
        };
        #[cfg(not(feature = "hwloc"))]
        let fallback_note = String::new();

        let process_cpus = sched::allowed_cpus().map_err(|e| format!("unpinned: {fallback_note}{e}"))?;
        let cores: Vec<Core> = process_cpus.iter().map(|&c| vec![c]).collect();
        let plan = CpuPlan::new(&cores, slot, max_threads)
            .ok_or_else(|| format!("unpinned: {fallback_note}no cpus in the affinity mask"))?;
        Ok(Self {
            binder: Binder::Sched,
            plan,
            process_cpus,
            numa_node: None,
            mechanism: format!("{fallback_note}sched_setaffinity"),
            unit_name: "cpu",
        })
    }
}

/// How threads get bound, and memory.
#[derive(Clone)]
pub(super) enum Binder {
    Sched,
    #[cfg(feature = "hwloc")]
    Hwloc(Arc<hwloc::Topo>),
}

impl Binder {
    /// Restricts the calling thread to `cpus`.
    pub(super) fn bind_current_thread(&self, cpus: &[usize]) -> Result<(), String> {
        match self {
            Binder::Sched => sched::bind_current_thread(cpus),
            #[cfg(feature = "hwloc")]
            Binder::Hwloc(topo) => topo.bind_current_thread(cpus),
        }
    }

    /// Binds the pages of `buf` to NUMA node `node`; whether it did.
    pub(super) fn bind_memory<T>(&self, node: usize, buf: &[T]) -> bool {
        match self {
            Binder::Sched => {
                let _ = (node, buf);
                false
            }
            #[cfg(feature = "hwloc")]
            Binder::Hwloc(topo) => topo.bind_memory(node, buf),
        }
    }
}

/// The CPUs the calling thread may run on (its affinity mask), ascending.
pub fn allowed_cpus() -> Result<Vec<usize>, String> {
    sched::allowed_cpus()
}

/// The CPUs this node gives the job: the online CPUs, or fewer where this process's cgroup (v2,
/// or v1's cpuset controller) confines it to a set (a Slurm allocation on a larger node). Not the process's affinity mask,
/// which a launcher binding each rank to its own cores narrows (`mpirun -n 2` binds each rank
/// to one core): ranks that each have a core of their own do not outnumber the node's cores.
pub fn node_cpus() -> usize {
    // SAFETY: sysconf only reads a system setting.
    let online = usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).unwrap_or(0);
    let online = if online > 0 { online } else { allowed_cpus().map_or(1, |c| c.len().max(1)) };
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|s| {
        // `hierarchy:controllers:path` lines: v2's `0::path`, v1's `N:cpuset:path`.
        s.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (id, controllers, path) = (f.next()?, f.next()?, f.next()?.trim());
            let file = if id == "0" && controllers.is_empty() {
                format!("/sys/fs/cgroup{path}/cpuset.cpus.effective")
            } else if controllers.split(',').any(|c| c == "cpuset") {
                format!("/sys/fs/cgroup/cpuset{path}/cpuset.effective_cpus")
            } else {
                return None;
            };
            cpu_list_len(std::fs::read_to_string(file).ok()?.trim())
        })
    });
    cgroup.filter(|&n| n > 0).map_or(online, |n| n.min(online))
}

/// The number of CPUs in a kernel CPU list (`0-3,8,10-11`); `None` if it is not one.
fn cpu_list_len(list: &str) -> Option<usize> {
    if list.is_empty() {
        return None;
    }
    list.split(',').try_fold(0usize, |n, part| {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.trim().parse::<usize>().ok()?, hi.trim().parse::<usize>().ok()?),
            None => {
                let c = part.trim().parse::<usize>().ok()?;
                (c, c)
            }
        };
        (lo <= hi).then(|| n + (hi - lo + 1))
    })
}

/// Pins the calling thread to `cpu` (best effort: a failure leaves it where it is). Used for
/// threads outside a pool that must share a rank's cores, like straggler-injection disruptors.
pub fn pin_current_thread(cpu: usize) -> bool {
    sched::bind_current_thread(&[cpu]).is_ok()
}

pub(super) mod sched {
    //! Thread affinity through the Linux system calls (the calling thread is pid 0).

    use std::io;
    use std::mem;

    /// Bits in a `cpu_set_t`: cpu ids at or above it cannot be named here.
    const SETSIZE: usize = libc::CPU_SETSIZE as usize;

    /// The calling thread's affinity mask.
    fn mask() -> io::Result<libc::cpu_set_t> {
        // SAFETY: cpu_set_t is a plain bit array, for which all zeroes is a valid (empty) set.
        let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
        // SAFETY: pid 0 is the calling thread; `set` is a valid, writable cpu_set_t of the size
        // passed.
        let rc = unsafe { libc::sched_getaffinity(0, mem::size_of::<libc::cpu_set_t>(), &mut set) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(set)
    }

    /// The cpu ids in the calling thread's affinity mask, ascending.
    pub(crate) fn allowed_cpus() -> Result<Vec<usize>, String> {
        let set = mask().map_err(|e| format!("sched_getaffinity failed: {e}"))?;
        // SAFETY: every index is below CPU_SETSIZE, the bit length of `set`.
        Ok((0..SETSIZE).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
    }

    /// Whether the calling thread may run on `cpu` and on no other (false if the mask cannot be
    /// read). No allocation: it is asked at every one-worker run.
    pub(crate) fn bound_to_only(cpu: usize) -> bool {
        mask().is_ok_and(|set| {
            cpu < SETSIZE
                // SAFETY: `set` is a valid cpu_set_t, and `cpu` is below its bit length (checked).
                && unsafe { libc::CPU_COUNT(&set) == 1 && libc::CPU_ISSET(cpu, &set) }
        })
    }

    /// Restricts the calling thread to `cpus`.
    pub(crate) fn bind_current_thread(cpus: &[usize]) -> Result<(), String> {
        // SAFETY: cpu_set_t is a plain bit array, for which all zeroes is a valid (empty) set.
        let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
        for &c in cpus {
            if c >= SETSIZE {
                return Err(format!("cpu {c} is beyond CPU_SETSIZE ({SETSIZE})"));
            }
            // SAFETY: c < CPU_SETSIZE, the bit length of `set`.
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the size passed.
        let rc = unsafe { libc::sched_setaffinity(0, mem::size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            return Err(format!("sched_setaffinity({cpus:?}) failed: {}", io::Error::last_os_error()));
        }
        Ok(())
    }
}

#[cfg(feature = "hwloc")]
mod hwloc {
    //! Topology-aware placement through hwlocality.

    use std::fmt;

    use hwlocality::cpu::binding::CpuBindingFlags;
    use hwlocality::cpu::cpuset::CpuSet;
    use hwlocality::memory::binding::{MemoryBindingFlags, MemoryBindingPolicy};
    use hwlocality::memory::nodeset::NodeSet;
    use hwlocality::object::types::ObjectType;
    use hwlocality::object::TopologyObject;
    use hwlocality::Topology;

    use super::{Binder, Binding, Core, CpuPlan, Slot};

    /// The machine's topology, shared by the pool's threads (hwlocality's `Topology` is
    /// `Send + Sync`).
    pub(crate) struct Topo(Topology);

    impl Topo {
        pub(super) fn new() -> Result<Self, String> {
            Topology::new().map(Self).map_err(|e| e.to_string())
        }

        /// The process's cores in logical (locality) order, each with the PUs the process may
        /// use.
        fn cores(&self) -> Result<(Vec<Core>, Vec<usize>), String> {
            let topo = &self.0;
            let bound = topo
                .cpu_binding(CpuBindingFlags::PROCESS)
                .map_err(|e| format!("hwloc_get_cpubind(PROCESS) failed: {e}"))?;
            let allowed = bound & topo.cpuset();
            let mut cores: Vec<Core> = Vec::new();
            let mut all = Vec::new();
            let mut last: Option<&TopologyObject> = None;
            // PUs in logical order: the PUs of one core are consecutive.
            for pu in topo.objects_with_type(ObjectType::PU) {
                let Some(os) = pu.os_index() else { continue };
                if !allowed.is_set(os) {
                    continue;
                }
                all.push(os);
                let core = pu.first_ancestor_with_type(ObjectType::Core);
                match (core, last, cores.last_mut()) {
                    (Some(c), Some(l), Some(unit)) if std::ptr::eq(c, l) => unit.push(os),
                    _ => cores.push(vec![os]),
                }
                last = core;
            }
            all.sort_unstable();
            Ok((cores, all))
        }

        pub(super) fn target(self, max_threads: usize, slot: Slot) -> Result<Binding, String> {
            let (cores, process_cpus) = self.cores()?;
            let plan = CpuPlan::new(&cores, slot, max_threads).ok_or("it found no allowed PUs")?;
            let numa_node = self.numa_node(&plan.cpus);
            Ok(Binding {
                binder: Binder::Hwloc(std::sync::Arc::new(self)),
                plan,
                process_cpus,
                numa_node,
                mechanism: "hwloc".to_string(),
                unit_name: "core",
            })
        }

        /// The NUMA node of all of `cpus`, if they have exactly one.
        fn numa_node(&self, cpus: &[usize]) -> Option<usize> {
            let nodes = NodeSet::from_cpuset(&self.0, &cpuset(cpus));
            match nodes.weight() {
                Some(1) => nodes.first_set().map(usize::from),
                _ => None,
            }
        }

        pub(super) fn bind_current_thread(&self, cpus: &[usize]) -> Result<(), String> {
            self.0
                .bind_cpu(&cpuset(cpus), CpuBindingFlags::THREAD)
                .map_err(|e| format!("hwloc_set_cpubind(THREAD, {cpus:?}) failed: {e}"))
        }

        pub(super) fn bind_memory<T>(&self, node: usize, buf: &[T]) -> bool {
            let Some(support) = self.0.feature_support().memory_binding() else { return false };
            if !(support.set_area() && support.bind_policy()) || std::mem::size_of_val(buf) == 0 {
                return false;
            }
            let mut nodes = NodeSet::new();
            nodes.set(node);
            let bind = |flags| {
                self.0.bind_memory_area::<[T], _>(buf, &nodes, MemoryBindingPolicy::Bind, flags).is_ok()
            };
            // Move pages already touched if possible; otherwise bind only the pages to come.
            (support.migrate_flag() && bind(MemoryBindingFlags::MIGRATE)) || bind(MemoryBindingFlags::empty())
        }

        #[cfg(test)]
        pub(crate) fn topology(&self) -> &Topology {
            &self.0
        }
    }

    impl fmt::Debug for Topo {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Topo")
        }
    }

    fn cpuset(cpus: &[usize]) -> CpuSet {
        let mut set = CpuSet::new();
        for &c in cpus {
            // The ids come from hwloc's own topology or the OS's, far below hwloc's index limit.
            set.set(c);
        }
        set
    }
}

#[cfg(test)]
mod cpu_list_tests {
    use super::{cpu_list_len, node_cpus};

    #[test]
    fn cpu_lists_count_their_cpus() {
        assert_eq!(cpu_list_len("0-3,8,10-11"), Some(7));
        assert_eq!(cpu_list_len("5"), Some(1));
        assert_eq!(cpu_list_len("0-1"), Some(2));
        assert_eq!(cpu_list_len(""), None);
        assert_eq!(cpu_list_len("3-1"), None);
        assert_eq!(cpu_list_len("a-b"), None);
    }

    #[test]
    fn the_node_has_at_least_the_cpus_this_thread_may_use() {
        let mine = super::allowed_cpus().expect("mask").len();
        assert!(node_cpus() >= mine, "node {} < mask {mine}", node_cpus());
    }
}
