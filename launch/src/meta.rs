//! `<run-dir>/meta.json`: what ran where. Every rank describes itself (host, process, the CPUs it
//! may run on, its Slurm task); rank 0 gathers the descriptions through a window and writes them.

use std::collections::BTreeMap;
use std::path::Path;

use peregrine_slurm::SlurmEnv;
use peregrine_transport::{Backend, ReduceOp, ShardMap, Transport, Window};
use serde::{Deserialize, Serialize};

use crate::error::AppError;
use crate::preempt::write_atomically;

/// One rank's description.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankInfo {
    /// Rank in the world.
    pub rank: usize,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// CPUs this process may run on (`Cpus_allowed_list`: what `--bind-to`/`--cpu-bind` set).
    pub cpus_allowed: String,
    /// The Slurm task's variables, when started by Slurm.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub slurm: BTreeMap<String, String>,
    /// The CPU's model name (`/proc/cpuinfo`).
    #[serde(default)]
    pub cpu_model: String,
    /// The instruction set the SIMD kernels were compiled for, and the best this CPU has.
    #[serde(default)]
    pub simd: String,
    /// RDMA devices on this host (`/sys/class/infiniband`, what `ibv_devices` lists).
    #[serde(default)]
    pub rdma_devices: Vec<String>,
    /// The MPI library (`MPI_Get_library_version`, first line); empty on the local backend.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub mpi_library: String,
    /// Under OpenMPI, the one-sided component asked for, e.g. `osc=sm,pt2pt`, with the rule that
    /// chose it (see `world::openmpi_defaults`); empty otherwise.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub mpi_components: String,
}

impl RankInfo {
    /// This rank's description.
    pub fn here(t: &Transport, slurm: Option<&SlurmEnv>) -> Self {
        let rank = t.rank();
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let host = read("/proc/sys/kernel/hostname").trim().to_owned();
        let cpus_allowed = read("/proc/self/status")
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default();
        let slurm = slurm
            .map(|s| s.summary().into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            .unwrap_or_default();
        let cpu_model = read("/proc/cpuinfo")
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").and_then(|v| v.split_once(':')).map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_default();
        let simd = peregrine_kernels::cpu::summary();
        let mpi_library = match t.backend() {
            Backend::Mpi => peregrine_transport::mpi_library_version().unwrap_or_default(),
            Backend::Local => String::new(),
        };
        let mpi_components =
            if mpi_library.starts_with("Open MPI") { crate::world::mpi_components() } else { String::new() };
        Self {
            rank,
            host: if host.is_empty() { "unknown".into() } else { host },
            pid: std::process::id(),
            cpus_allowed,
            slurm,
            cpu_model,
            simd,
            rdma_devices: crate::world::rdma_devices(),
            mpi_library,
            mpi_components,
        }
    }
}

/// The whole file.
#[derive(Debug, Serialize)]
struct Meta<'a> {
    peregrine_version: &'static str,
    command_line: Vec<String>,
    backend: String,
    world_size: usize,
    started_unix_s: u64,
    ranks: &'a [RankInfo],
}

/// Collective: every rank contributes `mine`; rank 0 gets all of them in rank order.
pub fn gather(t: &Transport, mine: &RankInfo) -> Result<Option<Vec<RankInfo>>, AppError> {
    let json = serde_json::to_vec(mine)
        .map_err(|e| AppError::Data { what: "rank description".into(), detail: e.to_string() })?;
    // Fixed-size slots of u64 words: [byte length, bytes...], sized by the longest description.
    let mut words = [json.len().div_ceil(8) as u64 + 1];
    t.allreduce(&mut words, ReduceOp::Max)?;
    let slot = words[0] as usize;
    let w: Window<u64> =
        t.alloc_window("rank descriptions", &ShardMap::from_lens(vec![slot; t.world_size()]))?;
    let mut mine_words = vec![0u64; slot];
    mine_words[0] = json.len() as u64;
    for (i, chunk) in json.chunks(8).enumerate() {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        mine_words[1 + i] = u64::from_le_bytes(b);
    }
    w.put(t.rank() * slot, &mine_words)?;
    w.flush_all()?;
    t.barrier()?;
    let mut all = None;
    if t.rank() == 0 {
        let mut buf = vec![0u64; slot * t.world_size()];
        w.get(0, &mut buf)?;
        let infos = buf
            .chunks(slot)
            .map(|s| {
                let bytes: Vec<u8> =
                    s[1..].iter().flat_map(|x| x.to_le_bytes()).take(s[0] as usize).collect();
                serde_json::from_slice(&bytes)
            })
            .collect::<Result<Vec<RankInfo>, _>>()
            .map_err(|e| AppError::Data { what: "rank descriptions".into(), detail: e.to_string() })?;
        all = Some(infos);
    }
    t.barrier()?;
    w.free()?;
    Ok(all)
}

/// Collective: writes `<run_dir>/meta.json` (rank 0).
pub fn write(t: &Transport, run_dir: &Path, slurm: Option<&SlurmEnv>) -> Result<(), AppError> {
    let mine = RankInfo::here(t, slurm);
    if let Some(ranks) = gather(t, &mine)? {
        let meta = Meta {
            peregrine_version: env!("CARGO_PKG_VERSION"),
            command_line: std::env::args().collect(),
            backend: t.backend().to_string(),
            world_size: t.world_size(),
            started_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            ranks: &ranks,
        };
        let json = serde_json::to_vec_pretty(&meta)
            .map_err(|e| AppError::Data { what: "meta.json".into(), detail: e.to_string() })?;
        write_atomically(&run_dir.join("meta.json"), &json)?;
    }
    Ok(())
}
