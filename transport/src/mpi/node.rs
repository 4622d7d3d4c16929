//! Nodes under MPI: the layout from `MPI_Comm_split_type`, and node blocks
//! ([`crate::NodeShared`]) as a file of `/dev/shm` that every process of the node maps.
//!
//! Not `MPI_Win_allocate_shared`: OpenMPI's `osc/ucx`, the one-sided component of jobs on several
//! nodes, has no shared windows, and that is where node blocks matter. The file is made by the
//! node's first process (a new name: nothing of anyone else's is opened or replaced), its name
//! sent to the others over the node's communicator, mapped by each, and removed once all have
//! mapped it: nothing is left behind, even if the job is killed afterwards.

use std::ffi::c_int;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use mpi::ffi;

use super::{check, Comm};
use crate::{Elem, NodeLayout, Result};

/// Where node blocks' files are made.
const SHM: &str = "/dev/shm";
/// Bytes before the elements: the barrier count, on a line of its own.
const HEADER: usize = 64;
/// The longest file name sent to the node's processes.
const NAME_BYTES: usize = 256;

/// Collective over `comm`: the layout of nodes (`node`: this process's node's communicator), or
/// `None` where a node's processes are not consecutive ranks.
pub(super) fn layout(
    comm: ffi::MPI_Comm,
    node: ffi::MPI_Comm,
    rank: usize,
    size: usize,
) -> Result<Option<NodeLayout>> {
    let mut leader = rank as u64;
    // SAFETY: one u64 on every process of the live node communicator, root 0 (its lowest world
    // rank: the split kept the world's order, its key being the world rank).
    let rc = unsafe { ffi::MPI_Bcast((&mut leader as *mut u64).cast(), 1, u64::mpi_datatype(), 0, node) };
    check(rank, "MPI_Bcast", rc)?;
    let mut leaders = vec![0u64; size];
    leaders[rank] = leader;
    // SAFETY: `size` u64s on every process of the live communicator, summed in place (each
    // process fills its own entry, the others are zero).
    let rc = unsafe {
        ffi::MPI_Allreduce(
            super::peregrine_mpi_in_place(),
            leaders.as_mut_ptr().cast(),
            super::count(size),
            u64::mpi_datatype(),
            ffi::RSMPI_SUM,
            comm,
        )
    };
    check(rank, "MPI_Allreduce", rc)?;
    let leaders: Vec<usize> = leaders.into_iter().map(|l| l as usize).collect();
    Ok(NodeLayout::from_leaders(&leaders, rank))
}

/// A node block under MPI: a shared mapping of a removed `/dev/shm` file.
#[derive(Debug)]
pub struct MpiNode<T: Elem> {
    map: memmap2::MmapMut,
    len: usize,
    _elem: std::marker::PhantomData<T>,
}

/// Node blocks made by this process so far (part of each file's name).
static MADE: AtomicU64 = AtomicU64::new(0);

impl<T: Elem> MpiNode<T> {
    /// Collective over the world (each node's processes together): the node's block, or `None`
    /// where this process could not map it (the reason on stderr).
    pub(super) fn alloc(comm: &Comm, name: &str, len: usize) -> Result<Option<Self>> {
        let bytes = HEADER + len * size_of::<T>();
        let mut local: c_int = 0;
        // SAFETY: live communicator, valid out-pointer.
        check(comm.rank, "MPI_Comm_rank", unsafe { ffi::MPI_Comm_rank(comm.node, &mut local) })?;
        let mut sent = [0u8; NAME_BYTES];
        let mut made = None;
        if local == 0 {
            let file = PathBuf::from(SHM).join(format!(
                "peregrine-{}-{}-{}",
                std::process::id(),
                MADE.fetch_add(1, Ordering::Relaxed),
                name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect::<String>()
            ));
            let created = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&file)
                .and_then(|f| f.set_len(bytes as u64));
            match created {
                Ok(()) => {
                    let text = file.to_string_lossy();
                    if text.len() < NAME_BYTES {
                        sent[..text.len()].copy_from_slice(text.as_bytes());
                    }
                    made = Some(file);
                }
                Err(e) => eprintln!(
                    "peregrine: rank {}: node block `{name}`: cannot create {}: {e}",
                    comm.rank,
                    file.display()
                ),
            }
        }
        // SAFETY: NAME_BYTES bytes on every process of the live node communicator, root 0.
        let rc = unsafe {
            ffi::MPI_Bcast(sent.as_mut_ptr().cast(), NAME_BYTES as c_int, ffi::RSMPI_UINT8_T, 0, comm.node)
        };
        check(comm.rank, "MPI_Bcast", rc)?;
        let path = std::str::from_utf8(&sent[..sent.iter().position(|&b| b == 0).unwrap_or(NAME_BYTES)])
            .unwrap_or_default()
            .to_owned();
        let mapped = (!path.is_empty()).then(|| {
            let f = OpenOptions::new().read(true).write(true).open(&path)?;
            // SAFETY: the file is this job's own (made above with a new name, removed once every
            // process of the node mapped it), never truncated while mapped.
            unsafe { memmap2::MmapMut::map_mut(&f) }
        });
        let map = match mapped {
            Some(Ok(m)) if m.len() >= bytes => Some(m),
            Some(Ok(_)) => {
                eprintln!(
                    "peregrine: rank {}: node block `{name}`: {path} is shorter than {bytes} bytes",
                    comm.rank
                );
                None
            }
            Some(Err(e)) => {
                eprintln!("peregrine: rank {}: node block `{name}`: cannot map {path}: {e}", comm.rank);
                None
            }
            None => None,
        };
        // Every process of the node has mapped it (or failed to): the name can go.
        // SAFETY: live node communicator.
        check(comm.rank, "MPI_Barrier", unsafe { ffi::MPI_Barrier(comm.node) })?;
        if let Some(file) = made {
            let _ = std::fs::remove_file(file);
        }
        Ok(map.map(|map| Self { map, len, _elem: std::marker::PhantomData }))
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_ptr(&self) -> *mut T {
        self.map.as_ptr().wrapping_add(HEADER).cast_mut().cast()
    }

    /// The node's barrier count: the header's first word (the mapping is page aligned).
    pub(crate) fn counter(&self) -> &AtomicU64 {
        // SAFETY: the mapping is page aligned and at least HEADER bytes long; the word is only
        // ever accessed atomically, by every process of the node (the file starts zeroed).
        unsafe { &*self.map.as_ptr().cast::<AtomicU64>() }
    }
}
