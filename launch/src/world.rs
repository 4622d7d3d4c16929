//! Starting the world of ranks: local threads or MPI processes, and turning a rank's failure
//! into one clear message and a non-zero exit instead of a hang.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::preempt::Preemption;
use clap::{Args, ValueEnum};
use peregrine_slurm::SlurmEnv;
use peregrine_transport::{
    run_local, run_local_in_nodes, Backend, ErrorKind as TransportErrorKind, ReduceOp, Transport,
};

use crate::error::AppError;

/// The `--backend` choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// `mpi` when started by an MPI launcher (mpirun, mpiexec, srun --mpi=pmix|pmi2), else `local`.
    Auto,
    /// Ranks as threads of this process (`--ranks N`).
    Local,
    /// One rank per MPI process (needs a build with `--features mpi`).
    Mpi,
}

/// How the world of ranks is formed.
#[derive(Debug, Args)]
pub struct WorldArgs {
    /// Transport backend.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// Number of ranks for the local backend (threads of this process). Under MPI the launcher
    /// sets the world size (`mpirun -n N`).
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub ranks: Option<usize>,
    /// Local backend: group the thread ranks into nodes of N consecutive ranks, as MPI ranks on
    /// N-rank nodes would be (node-combined communication between the groups: see `train
    /// --node-combine`), to try in one process what several nodes do [default: one node]. Under
    /// MPI the launcher's placement decides (`MPI_Comm_split_type`).
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub ranks_per_node: Option<usize>,
    /// Run directory: meta.json (ranks, hosts, CPU binding, Slurm ids) and, after a stop on a
    /// signal, checkpoint.json to resume from; a directory, made if missing (not a link). Batch
    /// scripts from `peregrine slurm sbatch` set it to runs/<job name>-<job id>.
    #[arg(long, value_name = "DIR", env = "PEREGRINE_RUN_DIR")]
    pub run_dir: Option<PathBuf>,
}

/// What a command gets besides its rank.
#[derive(Debug)]
pub struct RunContext {
    /// The Slurm task, when started by Slurm.
    pub slurm: Option<SlurmEnv>,
    /// `--run-dir`.
    pub run_dir: Option<PathBuf>,
    /// Set by SIGUSR1/SIGTERM.
    pub preemption: Preemption,
}

impl WorldArgs {
    fn backend(&self) -> Result<Backend, AppError> {
        // Under a launcher `detect` says Mpi whether or not it was compiled in: a build without
        // the feature then fails in `Transport::mpi` with the feature's name.
        let backend = match self.backend {
            BackendChoice::Auto => Backend::detect(),
            BackendChoice::Local => Backend::Local,
            BackendChoice::Mpi => Backend::Mpi,
        };
        if backend == Backend::Mpi && self.ranks.is_some() {
            return Err(AppError::Usage(
                "--ranks sets the number of local (thread) ranks; under MPI the launcher sets it (mpirun -n N)".into(),
            ));
        }
        if backend == Backend::Mpi && self.ranks_per_node.is_some() {
            return Err(AppError::Usage(
                "--ranks-per-node groups local (thread) ranks into nodes; under MPI the launcher's placement \
                 decides (mpirun --map-by, srun --ntasks-per-node)"
                    .into(),
            ));
        }
        Ok(backend)
    }
}

/// Runs `body` on every rank of the world `args` describes (`default_ranks` threads for the local
/// backend unless `--ranks` says otherwise).
///
/// Local backend: the ranks' errors are collected and the root cause (the first error that is not
/// a consequence of another rank leaving) is returned. MPI backend: a rank that fails prints its
/// error and calls `MPI_Abort`, so that peers blocked in a collective do not hang.
pub fn run_world<F>(args: &WorldArgs, default_ranks: usize, body: F) -> Result<(), AppError>
where
    F: Fn(&Transport, &RunContext) -> Result<(), AppError> + Sync,
{
    let backend = args.backend()?;
    if let Some(dir) = &args.run_dir {
        crate::output::check_dir("--run-dir", dir)?;
    }
    let slurm = SlurmEnv::from_env()?;
    if let Some(s) =
        slurm.as_ref().filter(|s| srun_direct() && s.procid.is_some() && s.ntasks.unwrap_or(1) > 1)
    {
        if backend == Backend::Local {
            return Err(AppError::Launch(format!(
                "srun started this process as task {} of {}, but no MPI launcher is visible: run `srun --mpi=pmix` \
                 (OpenMPI) or `srun --mpi=pmi2` (MPICH), with a build that has `--features mpi`",
                s.procid.unwrap_or(0),
                s.ntasks.unwrap_or(1)
            )));
        }
    }
    let ctx = RunContext { slurm, run_dir: args.run_dir.clone(), preemption: Preemption::install()? };
    match backend {
        Backend::Local => {
            let ranks = args.ranks.unwrap_or(default_ranks);
            let outcomes = match args.ranks_per_node {
                Some(per_node) => run_local_in_nodes(ranks, per_node, |t| body(&t, &ctx))?,
                None => run_local(ranks, |t| body(&t, &ctx))?,
            };
            let mut errors: Vec<AppError> = outcomes.into_iter().filter_map(Result::err).collect();
            let root = errors
                .iter()
                .position(|e| {
                    !matches!(e, AppError::Elsewhere { .. })
                        && !matches!(e, AppError::Transport(t) if matches!(t.kind(), TransportErrorKind::PeerExited { .. }))
                })
                .unwrap_or(0);
            if errors.is_empty() {
                Ok(())
            } else {
                Err(errors.swap_remove(root))
            }
        }
        Backend::Mpi => {
            openmpi_defaults();
            let t = Transport::mpi()?;
            let result = check_slurm_world(&t, ctx.slurm.as_ref())
                .and_then(|()| check_components_agree(&t))
                .and_then(|()| body(&t, &ctx));
            match result {
                // Every rank agreed to stop (collectively): a normal exit on every rank.
                Err(e @ (AppError::Preempted { .. } | AppError::StoppedBeforeStart { .. })) => Err(e),
                // Every rank knows (a collective found it): each exits with its message.
                Err(e @ (AppError::Elsewhere { .. } | AppError::Agreed(_))) => Err(e),
                Err(e) => {
                    crate::say(format_args!("error: {e}"));
                    if t.world_size() > 1 {
                        // The job's status as the local backend's: 2 for a usage error (a scheme
                        // that cannot run in this world, found by every rank alike).
                        t.abort(if matches!(e, AppError::Usage(_)) { 2 } else { 1 });
                    }
                    Err(e)
                }
                Ok(()) => Ok(()),
            }
        }
    }
}

/// Whether `srun` started this process itself (a task of a job step), rather than `mpirun` (which,
/// inside an allocation, starts its daemons with srun: their SLURM_PROCID is not the MPI rank).
fn srun_direct() -> bool {
    let set = |v: &str| std::env::var_os(v).is_some();
    set("SLURM_STEP_ID") && !set("OMPI_COMM_WORLD_SIZE") && !set("HYDI_CONTROL_FD")
}

/// Under `srun`, the MPI world must be the Slurm step: MPICH started with the wrong `--mpi` plugin
/// silently runs N one-rank worlds.
fn check_slurm_world(t: &Transport, slurm: Option<&SlurmEnv>) -> Result<(), AppError> {
    let Some(s) = slurm.filter(|_| srun_direct()) else { return Ok(()) };
    let (Some(procid), Some(ntasks)) = (s.procid, s.ntasks) else { return Ok(()) };
    if t.world_size() != ntasks as usize || t.rank() != procid as usize {
        return Err(AppError::Launch(format!(
            "MPI rank {} of {} but Slurm task {procid} of {}: the MPI library did not join srun's tasks into one \
             world; use `srun --mpi=pmix` for OpenMPI or `srun --mpi=pmi2` for MPICH",
            t.rank(),
            t.world_size(),
            ntasks
        )));
    }
    Ok(())
}

/// OpenMPI 4.1's default one-sided component (osc/rdma over shared memory) crashes in
/// `MPI_Compare_and_swap`, and its `pt2pt` component refuses `MPI_THREAD_MULTIPLE` (which
/// Peregrine's threads need) as soon as a window spans nodes. So unless the user chose
/// (`OMPI_MCA_osc` set), Peregrine chooses:
/// - `osc=ucx` (and `pml=ucx` unless `OMPI_MCA_pml` is set) when this host has an RDMA device
///   (`/sys/class/infiniband`) and `ucx_info -d` lists an RDMA transport for it (`rc_*`, `dc_*`,
///   `ud_*`): one-sided operations are then done by the network card, without the target's CPU;
/// - `osc=ucx` and `pml=ucx` over UCX's TCP transport when the job's ranks are on several nodes
///   without RDMA (UCX emulates one-sided operations there; the target's UCX progress serves
///   them, which `pml=ucx` drives whenever the rank is in MPI: with `pml=ob1`, a rank waiting in a
///   barrier leaves the others' atomics unserved);
/// - `osc=sm,pt2pt` otherwise (one node: `sm`).
///
/// Set whatever the MPI library (under `srun` an OpenMPI process has no `OMPI_*` variable before
/// `MPI_Init`, and MPICH ignores it); read by `MPI_Init`, so it must be set before. Every rank
/// chooses alone; [`check_components_agree`] then checks that all chose alike.
fn openmpi_defaults() {
    let var = |k: &str| std::env::var(k).ok();
    let choice = choose_components(&var, &rdma_devices(), ucx_rdma_transports);
    for (var, value) in &choice.set {
        // Edition 2021: `set_var` is safe but process-global. This runs on the main thread before
        // MPI_Init, while no other thread exists.
        std::env::set_var(var, value);
    }
    let _ = COMPONENTS.set(choice);
}

/// What [`openmpi_defaults`] chose, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Components {
    /// `OMPI_MCA_osc` as MPI_Init reads it.
    pub osc: String,
    /// The variables set (not set by the user).
    pub set: Vec<(&'static str, String)>,
    /// Why, in words.
    pub reason: String,
    /// 0: the user's choice, 1: the default `sm,pt2pt`, 2: `ucx` for RDMA, 3: `ucx` over TCP
    /// between nodes (compared across ranks).
    pub code: u64,
    /// How many nodes the launcher said the job's ranks are on ([`job_nodes`]).
    pub nodes: Option<u64>,
}

static COMPONENTS: OnceLock<Components> = OnceLock::new();

/// The one-sided component choice, in words, for meta.json (empty before MPI, or on the local
/// backend).
pub fn mpi_components() -> String {
    COMPONENTS.get().map_or_else(String::new, |c| format!("osc={} ({})", c.osc, c.reason))
}

/// The rule of [`openmpi_defaults`], reading the environment through `var`; `ucx` lists UCX's
/// RDMA transports (called only when there are RDMA devices).
pub fn choose_components(
    var: &dyn Fn(&str) -> Option<String>,
    devices: &[String],
    ucx: impl FnOnce() -> Result<Vec<String>, String>,
) -> Components {
    let nodes = job_nodes(var);
    let made = |osc: &str, set, reason, code| Components { osc: osc.to_owned(), set, reason, code, nodes };
    if let Some(osc) = var("OMPI_MCA_osc") {
        return made(&osc, vec![], "OMPI_MCA_osc set by the user".into(), 0);
    }
    let ucx_set = |extra: &[(&'static str, &str)]| {
        let mut set = vec![("OMPI_MCA_osc", "ucx".to_owned())];
        if var("OMPI_MCA_pml").is_none() {
            set.push(("OMPI_MCA_pml", "ucx".to_owned()));
            set.extend(extra.iter().filter(|(k, _)| var(k).is_none()).map(|(k, v)| (*k, (*v).to_owned())));
        }
        set
    };
    // UCX's RDMA transports, or why there are none.
    let rdma = if devices.is_empty() {
        Err("no RDMA device on this host".to_owned())
    } else {
        let on = devices.join(",");
        match ucx() {
            Ok(t) if !t.is_empty() => Ok(t),
            Ok(_) => Err(format!("RDMA devices {on} but no RDMA transport in `ucx_info -d`")),
            Err(e) => Err(format!("RDMA devices {on} but {e}: set OMPI_MCA_osc=ucx to use them")),
        }
    };
    match (rdma, nodes) {
        (Ok(t), _) => {
            made("ucx", ucx_set(&[]), format!("RDMA devices {}, UCX transports {}", devices.join(","), t.join(",")), 2)
        }
        (Err(why), Some(n)) if n > 1 => made(
            "ucx",
            // OpenMPI 4.1 selects pml ucx only on InfiniBand devices unless told otherwise.
            ucx_set(&[("OMPI_MCA_pml_ucx_tls", "any"), ("OMPI_MCA_pml_ucx_devices", "any")]),
            format!(
                "{why}; ranks on {n} nodes: UCX over TCP, since the pt2pt component refuses MPI_THREAD_MULTIPLE \
                 between nodes"
            ),
            3,
        ),
        (Err(why), _) => made("sm,pt2pt", vec![("OMPI_MCA_osc", "sm,pt2pt".to_owned())], why, 1),
    }
}

/// How many nodes the job's ranks are on, as the launcher tells each process before `MPI_Init`:
/// `SLURM_STEP_NUM_NODES` under `srun`, more than one when OpenMPI's `mpirun` says a rank has
/// fewer local peers than the world (`OMPI_COMM_WORLD_LOCAL_SIZE` < `OMPI_COMM_WORLD_SIZE`);
/// `None` when neither says.
pub fn job_nodes(var: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    let num = |k: &str| var(k).and_then(|v| v.trim().parse::<u64>().ok());
    if let (Some(local), Some(world)) = (num("OMPI_COMM_WORLD_LOCAL_SIZE"), num("OMPI_COMM_WORLD_SIZE")) {
        return Some(if local < world { world.div_ceil(local.max(1)) } else { 1 });
    }
    num("SLURM_STEP_NUM_NODES")
}

/// RDMA devices on this host: the names under `/sys/class/infiniband` (as `ibv_devices` lists).
pub fn rdma_devices() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// The RDMA transports `ucx_info -d` lists (InfiniBand/RoCE: `rc_verbs`, `rc_mlx5`, `dc_mlx5`,
/// `ud_verbs`, `ud_mlx5`).
fn ucx_rdma_transports() -> Result<Vec<String>, String> {
    let out = std::process::Command::new("ucx_info")
        .arg("-d")
        .output()
        .map_err(|e| format!("`ucx_info -d` could not run ({e}; Debian's package is ucx-utils)"))?;
    if !out.status.success() {
        return Err(format!("`ucx_info -d` failed ({})", out.status));
    }
    Ok(rdma_transports(&String::from_utf8_lossy(&out.stdout)))
}

/// The RDMA transports named on `Transport:` lines of `ucx_info -d` output, once each.
pub fn rdma_transports(ucx_info: &str) -> Vec<String> {
    let mut found: Vec<String> = ucx_info
        .lines()
        .filter_map(|l| l.split_once("Transport:").map(|(_, t)| t.trim().to_owned()))
        .filter(|t| ["rc", "dc", "ud"].iter().any(|p| t == p || t.starts_with(&format!("{p}_"))))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Collective: every rank chose the same one-sided components (mixed components cannot talk).
fn check_components_agree(t: &Transport) -> Result<(), AppError> {
    let Some(c) = COMPONENTS.get() else { return Ok(()) };
    let nodes = c.nodes.unwrap_or(1);
    if c.code == 0 && c.osc.contains("pt2pt") && !c.osc.contains("ucx") && nodes > 1 && t.rank() == 0 {
        eprintln!(
            "peregrine: warning: OMPI_MCA_osc={} with ranks on {nodes} nodes: OpenMPI 4.1's pt2pt one-sided \
             component refuses MPI_THREAD_MULTIPLE between nodes (MPI_Win_allocate then fails); unset \
             OMPI_MCA_osc to let Peregrine choose (ucx), or set it to ucx",
            c.osc
        );
    }
    let mut lo = [c.code];
    let mut hi = [c.code];
    t.allreduce(&mut lo, ReduceOp::Min)?;
    t.allreduce(&mut hi, ReduceOp::Max)?;
    if lo != hi {
        return Err(AppError::Agreed(Box::new(AppError::Launch(format!(
            "rank {}: ranks chose different MPI one-sided components (this one: osc={}, {}): some hosts have \
             RDMA and others not; set OMPI_MCA_osc (and OMPI_MCA_pml) for the whole job",
            t.rank(),
            c.osc,
            c.reason
        )))));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ucx_info -d` on a node with a ConnectX card (abridged), and on this machine (no RDMA).
    const UCX_IB: &str =
        "#      Memory domain: mlx5_0\n#      Transport: rc_verbs\n#         Device: mlx5_0:1\n\
                          #      Transport: rc_mlx5\n#      Transport: dc_mlx5\n#      Transport: ud_verbs\n\
                          #      Transport: ud_mlx5\n#      Transport: rc_mlx5\n#      Memory domain: tcp\n\
                          #      Transport: tcp\n#      Transport: self\n";
    const UCX_TCP: &str = "#      Memory domain: tcp\n#      Transport: tcp\n#         Device: eth0\n\
                           #      Memory domain: sysv\n#      Transport: sysv\n#      Transport: posix\n\
                           #      Transport: cma\n#      Transport: self\n";

    #[test]
    fn rdma_transports_are_read_from_ucx_info() {
        assert_eq!(rdma_transports(UCX_IB), ["dc_mlx5", "rc_mlx5", "rc_verbs", "ud_mlx5", "ud_verbs"]);
        assert!(rdma_transports(UCX_TCP).is_empty());
        assert!(rdma_transports("#      Transport: rdmacm_cm\n#      Transport: udp\n").is_empty());
    }

    /// An environment of `pairs`.
    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> =
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |k: &str| pairs.iter().find(|(name, _)| name == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_one_sided_component_follows_the_rule() {
        let ib = vec!["mlx5_0".to_owned()];
        let never = || -> Result<Vec<String>, String> { panic!("ucx_info asked without RDMA devices") };
        let own = |k: &'static str, v: &str| (k, v.to_owned());
        // The user's choice stands, whatever the host has.
        let c = choose_components(&env(&[("OMPI_MCA_osc", "pt2pt")]), &ib, never);
        assert_eq!((c.osc.as_str(), c.set.len(), c.code), ("pt2pt", 0, 0));
        // No RDMA device, one node: sm; UCX is not asked.
        let c = choose_components(&env(&[]), &[], never);
        assert_eq!((c.osc.as_str(), c.code), ("sm,pt2pt", 1));
        assert_eq!(c.set, [own("OMPI_MCA_osc", "sm,pt2pt")]);
        let one_node = env(&[("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "4")]);
        assert_eq!(choose_components(&one_node, &[], never).code, 1);
        // No RDMA, several nodes (srun, or mpirun): UCX over TCP, with pml ucx allowed on it.
        for several in [
            env(&[("SLURM_STEP_NUM_NODES", "2")]),
            env(&[
                ("OMPI_COMM_WORLD_SIZE", "4"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
                ("SLURM_STEP_NUM_NODES", "1"),
            ]),
        ] {
            let c = choose_components(&several, &[], never);
            assert_eq!((c.osc.as_str(), c.code), ("ucx", 3));
            assert_eq!(
                c.set,
                [
                    own("OMPI_MCA_osc", "ucx"),
                    own("OMPI_MCA_pml", "ucx"),
                    own("OMPI_MCA_pml_ucx_tls", "any"),
                    own("OMPI_MCA_pml_ucx_devices", "any")
                ]
            );
            assert!(
                c.reason.contains("on 2 nodes") && c.reason.contains("MPI_THREAD_MULTIPLE"),
                "{}",
                c.reason
            );
        }
        // The user's pml stands (and then its UCX settings are the user's too).
        let c =
            choose_components(&env(&[("SLURM_STEP_NUM_NODES", "3"), ("OMPI_MCA_pml", "ob1")]), &[], never);
        assert_eq!(c.set, [own("OMPI_MCA_osc", "ucx")]);
        // RDMA devices and an RDMA transport in UCX: osc and pml ucx (pml only when unset).
        let c = choose_components(&env(&[]), &ib, || Ok(rdma_transports(UCX_IB)));
        assert_eq!((c.osc.as_str(), c.code), ("ucx", 2));
        assert_eq!(c.set, [own("OMPI_MCA_osc", "ucx"), own("OMPI_MCA_pml", "ucx")]);
        assert!(c.reason.contains("mlx5_0") && c.reason.contains("rc_mlx5"), "{}", c.reason);
        let c = choose_components(&env(&[("OMPI_MCA_pml", "ob1")]), &ib, || Ok(rdma_transports(UCX_IB)));
        assert_eq!(c.set, [own("OMPI_MCA_osc", "ucx")]);
        // Devices but UCX has no RDMA transport for them, or cannot say: as without devices.
        let c = choose_components(&env(&[]), &ib, || Ok(rdma_transports(UCX_TCP)));
        assert_eq!((c.osc.as_str(), c.code), ("sm,pt2pt", 1));
        let c = choose_components(&env(&[]), &ib, || Err("`ucx_info -d` could not run".into()));
        assert_eq!(c.osc, "sm,pt2pt");
        assert!(c.reason.contains("ucx_info") && c.reason.contains("OMPI_MCA_osc=ucx"), "{}", c.reason);
    }
}
