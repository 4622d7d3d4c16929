//! The Slurm environment of one task: what `sbatch`, `salloc` and `srun` export to it.

use std::path::PathBuf;
use std::str::FromStr;

use crate::error::{Error, MAX_HOSTS};
use crate::hostlist::{compress, expand_var};

/// The Slurm job environment of one task, read from `SLURM_*` variables by
/// [`from_env`](Self::from_env) or [`from_vars`](Self::from_vars).
///
/// Where Slurm has a legacy name for a variable it is read when the current name is absent.
/// Inside a step (`srun`), `procid`, `ntasks`, `localid`, `nodeid` and `tasks_per_node` describe
/// the step, while `nnodes` and `nodelist` describe the whole job's allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SlurmEnv {
    /// `SLURM_JOB_ID`: the job's id. Its presence is what makes an environment a Slurm one.
    pub job_id: u64,
    /// `SLURM_STEP_ID` (or the obsolete `SLURM_STEPID`): the step's id; absent in a batch script.
    pub step_id: Option<u32>,
    /// `SLURM_PROCID`: the task's global rank in the step; absent in a batch script outside a
    /// step.
    pub procid: Option<u32>,
    /// `SLURM_NTASKS` (or `SLURM_NPROCS`): the number of tasks.
    pub ntasks: Option<u32>,
    /// `SLURM_LOCALID`: the task's rank among the tasks of its node.
    pub localid: Option<u32>,
    /// `SLURM_NODEID`: the index of the task's node (relative to the step's nodes).
    pub nodeid: Option<u32>,
    /// `SLURM_JOB_NUM_NODES` (or `SLURM_NNODES`): the number of nodes in the allocation.
    pub nnodes: Option<u32>,
    /// `SLURM_JOB_NODELIST` (or `SLURM_NODELIST`), expanded with [`expand`](crate::expand); empty
    /// when neither is set.
    pub nodelist: Vec<String>,
    /// `SLURM_STEP_NODELIST`, expanded: the step's nodes, which `nodeid` indexes; absent outside a
    /// step.
    pub step_nodelist: Option<Vec<String>>,
    /// `SLURM_CPUS_PER_TASK`: CPUs per task, when `--cpus-per-task` was given.
    pub cpus_per_task: Option<u32>,
    /// `SLURM_TASKS_PER_NODE`, expanded: tasks on each node, in node order (`2(x3),1` gives
    /// `[2, 2, 2, 1]`).
    pub tasks_per_node: Option<Vec<u32>>,
    /// `SLURM_CPU_BIND`: the CPU binding `srun` applied (`quiet,mask_cpu:0x3,0xC`), as written.
    pub cpu_bind: Option<String>,
    /// `SLURM_JOB_NAME`: the job's name.
    pub job_name: Option<String>,
    /// `SLURM_JOB_PARTITION`: the partition the job runs in.
    pub partition: Option<String>,
    /// `SLURM_SUBMIT_DIR`: the directory the job was submitted from.
    pub submit_dir: Option<PathBuf>,
    /// `SLURM_RESTART_COUNT`: how many times the job was requeued; 0 when unset.
    pub restart_count: u32,
    /// `SLURM_HET_SIZE` (or `SLURM_PACK_SIZE`): the number of components of a heterogeneous job.
    pub het_size: Option<u32>,
    /// `SLURM_HET_JOB_ID` (or `SLURM_PACK_JOB_ID`): the id of the heterogeneous job as a whole.
    pub het_job_id: Option<u64>,
}

const UNSIGNED: &str = "an unsigned decimal integer";
const DIGIT: &str = "a decimal digit";
const BELOW_2_32: &str = "an unsigned integer below 2^32";
const BELOW_2_64: &str = "an unsigned integer below 2^64";

/// Parses an unsigned decimal `value` of `variable`; `too_large` is what to expect on overflow.
fn parse_num<T: FromStr>(variable: &'static str, value: &str, too_large: &'static str) -> Result<T, Error> {
    let bad = |position, expected| Error::Variable { variable, value: value.to_owned(), position, expected };
    if value.is_empty() {
        return Err(bad(0, UNSIGNED));
    }
    if let Some(k) = value.bytes().position(|b| !b.is_ascii_digit()) {
        return Err(bad(k, DIGIT));
    }
    value.parse().map_err(|_| bad(0, too_large))
}

/// Reads variables through the caller's lookup.
struct Reader<F> {
    get: F,
}

impl<F: Fn(&str) -> Option<String>> Reader<F> {
    /// The first of `names` that is set, with its name.
    fn first(&self, names: &[&'static str]) -> Option<(&'static str, String)> {
        names.iter().find_map(|&name| (self.get)(name).map(|v| (name, v)))
    }

    fn string(&self, name: &'static str) -> Option<String> {
        (self.get)(name)
    }

    fn u32(&self, names: &[&'static str]) -> Result<Option<(&'static str, u32)>, Error> {
        self.first(names).map(|(n, v)| parse_num(n, &v, BELOW_2_32).map(|x| (n, x))).transpose()
    }

    fn u64(&self, names: &[&'static str]) -> Result<Option<(&'static str, u64)>, Error> {
        self.first(names).map(|(n, v)| parse_num(n, &v, BELOW_2_64).map(|x| (n, x))).transpose()
    }
}

fn inconsistent(variables: &[&'static str], message: String) -> Error {
    Error::Inconsistent { variables: variables.to_vec(), message }
}

impl SlurmEnv {
    /// Reads the environment of this process. See [`from_vars`](Self::from_vars); a value that is
    /// not valid Unicode is read lossily (and then fails to parse if it should be a number).
    ///
    /// # Errors
    ///
    /// As [`from_vars`](Self::from_vars).
    pub fn from_env() -> Result<Option<Self>, Error> {
        Self::from_vars(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads the Slurm environment through `get`, which returns a variable's value or `None` when
    /// it is unset. Returns `Ok(None)` when `SLURM_JOB_ID` is unset (not inside a Slurm job).
    ///
    /// # Errors
    ///
    /// [`Error::Variable`] when a numeric variable or `SLURM_TASKS_PER_NODE` does not parse (an
    /// empty value included), [`Error::Hostlist`] when a node list does not expand, and
    /// [`Error::Inconsistent`] when variables contradict each other: `SLURM_PROCID` not below the
    /// task count; `SLURM_NODEID` not below the node count or the length of
    /// `SLURM_STEP_NODELIST`; a node count that differs from the length of the node list;
    /// `SLURM_TASKS_PER_NODE` not summing to the task count, or too short for `SLURM_NODEID`;
    /// `SLURM_LOCALID` not below the tasks on this node.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// let vars: HashMap<&str, &str> = [
    ///     ("SLURM_JOB_ID", "42"),
    ///     ("SLURM_PROCID", "3"),
    ///     ("SLURM_NTASKS", "4"),
    ///     ("SLURM_NODEID", "1"),
    ///     ("SLURM_LOCALID", "1"),
    ///     ("SLURM_JOB_NUM_NODES", "2"),
    ///     ("SLURM_JOB_NODELIST", "cn[07-08]"),
    ///     ("SLURM_TASKS_PER_NODE", "2(x2)"),
    /// ]
    /// .into();
    /// let env = peregrine_slurm::SlurmEnv::from_vars(|k| vars.get(k).map(|v| v.to_string()))?;
    /// let env = env.expect("SLURM_JOB_ID is set");
    /// assert_eq!(env.node_name(), Some("cn08"));
    /// assert_eq!(env.tasks_per_node, Some(vec![2, 2]));
    /// # Ok::<(), peregrine_slurm::Error>(())
    /// ```
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, Error> {
        let r = Reader { get };
        let Some((_, job_id)) = r.u64(&["SLURM_JOB_ID"])? else {
            return Ok(None);
        };
        let step_id = r.u32(&["SLURM_STEP_ID", "SLURM_STEPID"])?;
        let procid = r.u32(&["SLURM_PROCID"])?;
        let ntasks = r.u32(&["SLURM_NTASKS", "SLURM_NPROCS"])?;
        let localid = r.u32(&["SLURM_LOCALID"])?;
        let nodeid = r.u32(&["SLURM_NODEID"])?;
        let nnodes = r.u32(&["SLURM_JOB_NUM_NODES", "SLURM_NNODES"])?;
        let nodelist_var = r.first(&["SLURM_JOB_NODELIST", "SLURM_NODELIST"]);
        let nodelist = match &nodelist_var {
            Some((name, value)) => expand_var(name, value)?,
            None => Vec::new(),
        };
        let step_nodelist_var = r.first(&["SLURM_STEP_NODELIST"]);
        let step_nodelist = match &step_nodelist_var {
            Some((name, value)) => Some(expand_var(name, value)?),
            None => None,
        };
        let cpus_per_task = r.u32(&["SLURM_CPUS_PER_TASK"])?;
        let tpn_var = r.first(&["SLURM_TASKS_PER_NODE"]);
        let tasks_per_node = match &tpn_var {
            Some((name, value)) => Some(parse_counts(name, value)?),
            None => None,
        };
        let restart_count = r.u32(&["SLURM_RESTART_COUNT"])?;
        let het_size = r.u32(&["SLURM_HET_SIZE", "SLURM_PACK_SIZE"])?;
        let het_job_id = r.u64(&["SLURM_HET_JOB_ID", "SLURM_PACK_JOB_ID"])?;

        if let (Some((pv, p)), Some((nv, n))) = (procid, ntasks) {
            if p >= n {
                return Err(inconsistent(&[pv, nv], format!("{pv}={p} is not below {nv}={n}")));
            }
        }
        if let (Some((nv, n)), Some((lv, list))) = (nnodes, &nodelist_var) {
            if n as usize != nodelist.len() {
                return Err(inconsistent(
                    &[nv, lv],
                    format!("{nv}={n} but {lv}={list:?} names {} hosts", nodelist.len()),
                ));
            }
        }
        if let Some((iv, i)) = nodeid {
            if let Some((nv, n)) = nnodes {
                if i >= n {
                    return Err(inconsistent(&[iv, nv], format!("{iv}={i} is not below {nv}={n}")));
                }
            }
            if let (Some((sv, list)), Some(step)) = (&step_nodelist_var, &step_nodelist) {
                if i as usize >= step.len() {
                    return Err(inconsistent(
                        &[iv, sv],
                        format!("{iv}={i} but {sv}={list:?} names {} hosts", step.len()),
                    ));
                }
            }
        }
        if let (Some((tv, tpn_text)), Some(tpn)) = (&tpn_var, &tasks_per_node) {
            if let Some((nv, n)) = ntasks {
                let sum: u64 = tpn.iter().map(|&t| u64::from(t)).sum();
                if sum != u64::from(n) {
                    return Err(inconsistent(
                        &[tv, nv],
                        format!("{tv}={tpn_text:?} sums to {sum} tasks but {nv}={n}"),
                    ));
                }
            }
            if let Some((iv, i)) = nodeid {
                let Some(&here) = tpn.get(i as usize) else {
                    return Err(inconsistent(
                        &[iv, tv],
                        format!("{iv}={i} but {tv}={tpn_text:?} lists {} nodes", tpn.len()),
                    ));
                };
                if let Some((lv, l)) = localid {
                    if l >= here {
                        return Err(inconsistent(
                            &[lv, tv, iv],
                            format!("{lv}={l} is not below the {here} tasks that {tv}={tpn_text:?} gives node {iv}={i}"),
                        ));
                    }
                }
            }
        }

        Ok(Some(Self {
            job_id,
            step_id: step_id.map(|(_, v)| v),
            procid: procid.map(|(_, v)| v),
            ntasks: ntasks.map(|(_, v)| v),
            localid: localid.map(|(_, v)| v),
            nodeid: nodeid.map(|(_, v)| v),
            nnodes: nnodes.map(|(_, v)| v),
            nodelist,
            step_nodelist,
            cpus_per_task: cpus_per_task.map(|(_, v)| v),
            tasks_per_node,
            cpu_bind: r.string("SLURM_CPU_BIND"),
            job_name: r.string("SLURM_JOB_NAME"),
            partition: r.string("SLURM_JOB_PARTITION"),
            submit_dir: r.string("SLURM_SUBMIT_DIR").map(PathBuf::from),
            restart_count: restart_count.map_or(0, |(_, v)| v),
            het_size: het_size.map(|(_, v)| v),
            het_job_id: het_job_id.map(|(_, v)| v),
        }))
    }

    /// The name of this task's node: entry `nodeid` of the step's node list when known, else of
    /// the job's. `None` without `nodeid` or a node list.
    pub fn node_name(&self) -> Option<&str> {
        let list = self.step_nodelist.as_ref().unwrap_or(&self.nodelist);
        list.get(usize::try_from(self.nodeid?).ok()?).map(String::as_str)
    }

    /// How many tasks run on this task's node: entry `nodeid` of `tasks_per_node`.
    pub fn tasks_on_node(&self) -> Option<u32> {
        self.tasks_per_node.as_ref()?.get(usize::try_from(self.nodeid?).ok()?).copied()
    }

    /// Key/value pairs to record in a run's metadata, keys prefixed `slurm_`: job id, step,
    /// ranks, task and node counts, this node's name, the node list (compressed), tasks per node
    /// (compressed), CPUs per task, CPU binding, job name, partition, submit directory, restart
    /// count (always present) and heterogeneous-job fields. Unset fields are left out.
    pub fn summary(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![("slurm_job_id", self.job_id.to_string())];
        let mut push = |key, value: Option<String>| {
            if let Some(v) = value {
                out.push((key, v));
            }
        };
        push("slurm_step_id", self.step_id.map(|v| v.to_string()));
        push("slurm_procid", self.procid.map(|v| v.to_string()));
        push("slurm_ntasks", self.ntasks.map(|v| v.to_string()));
        push("slurm_localid", self.localid.map(|v| v.to_string()));
        push("slurm_nodeid", self.nodeid.map(|v| v.to_string()));
        push("slurm_node", self.node_name().map(str::to_owned));
        push("slurm_nnodes", self.nnodes.map(|v| v.to_string()));
        push("slurm_nodelist", (!self.nodelist.is_empty()).then(|| compress(&self.nodelist)));
        push("slurm_step_nodelist", self.step_nodelist.as_deref().map(compress));
        push("slurm_tasks_per_node", self.tasks_per_node.as_deref().map(format_tasks_per_node));
        push("slurm_cpus_per_task", self.cpus_per_task.map(|v| v.to_string()));
        push("slurm_cpu_bind", self.cpu_bind.clone());
        push("slurm_job_name", self.job_name.clone());
        push("slurm_partition", self.partition.clone());
        push("slurm_submit_dir", self.submit_dir.as_ref().map(|p| p.display().to_string()));
        push("slurm_restart_count", Some(self.restart_count.to_string()));
        push("slurm_het_size", self.het_size.map(|v| v.to_string()));
        push("slurm_het_job_id", self.het_job_id.map(|v| v.to_string()));
        out
    }
}

/// Parses the compressed per-node count form Slurm uses in `SLURM_TASKS_PER_NODE`: `2(x3),1`
/// means 2, 2, 2, 1.
///
/// # Errors
///
/// [`Error::Variable`] naming `SLURM_TASKS_PER_NODE`, with the byte position and what was
/// expected there: an empty value or item, a non-digit, a count over 32 bits, a repeat count of
/// zero, a missing `)`, or more than [`MAX_HOSTS`] nodes in total.
///
/// ```
/// assert_eq!(peregrine_slurm::parse_tasks_per_node("2(x3),1")?, [2, 2, 2, 1]);
/// # Ok::<(), peregrine_slurm::Error>(())
/// ```
pub fn parse_tasks_per_node(value: &str) -> Result<Vec<u32>, Error> {
    parse_counts("SLURM_TASKS_PER_NODE", value)
}

fn parse_counts(variable: &'static str, value: &str) -> Result<Vec<u32>, Error> {
    let bad = |position, expected| Error::Variable { variable, value: value.to_owned(), position, expected };
    let bytes = value.as_bytes();
    // Digits from `at`: the number and where it ends.
    let number = |at: usize, what: &'static str| -> Result<(u32, usize), Error> {
        let len = bytes[at..].iter().take_while(|b| b.is_ascii_digit()).count();
        if len == 0 {
            return Err(bad(at, what));
        }
        let n = value[at..at + len].parse().map_err(|_| bad(at, BELOW_2_32))?;
        Ok((n, at + len))
    };
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        let item = i;
        let (count, mut end) = number(i, "a task count")?;
        let mut repeat = 1;
        if bytes.get(end) == Some(&b'(') {
            if bytes.get(end + 1) != Some(&b'x') {
                return Err(bad(end + 1, "'x' after '('"));
            }
            let (r, after) = number(end + 2, "a repeat count")?;
            if r == 0 {
                return Err(bad(end + 2, "a repeat count of at least 1"));
            }
            if bytes.get(after) != Some(&b')') {
                return Err(bad(after, "')'"));
            }
            repeat = r;
            end = after + 1;
        }
        if out.len().saturating_add(repeat as usize) > MAX_HOSTS {
            return Err(bad(item, "at most 1000000 nodes in total"));
        }
        out.extend(std::iter::repeat_n(count, repeat as usize));
        match bytes.get(end) {
            None => return Ok(out),
            Some(b',') => i = end + 1,
            Some(_) => return Err(bad(end, "',' or '(x'")),
        }
    }
}

/// Writes per-node counts in Slurm's compressed form, the inverse of [`parse_tasks_per_node`]:
/// `[2, 2, 2, 1]` gives `2(x3),1`. An empty slice gives an empty string.
pub fn format_tasks_per_node(counts: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut k = 0;
    while k < counts.len() {
        let run = counts[k..].iter().take_while(|&&c| c == counts[k]).count();
        parts.push(if run == 1 { counts[k].to_string() } else { format!("{}(x{run})", counts[k]) });
        k += run;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::HostlistProblem;
    use proptest::prelude::*;
    use std::collections::HashMap;

    type Vars = Vec<(&'static str, &'static str)>;

    fn read(vars: &[(&str, &str)]) -> Result<Option<SlurmEnv>, Error> {
        let map: HashMap<String, String> =
            vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        SlurmEnv::from_vars(|k| map.get(k).cloned())
    }

    fn ok(vars: &[(&str, &str)]) -> SlurmEnv {
        match read(vars) {
            Ok(Some(env)) => env,
            other => panic!("expected an environment, got {other:?}"),
        }
    }

    fn err(vars: &[(&str, &str)]) -> Error {
        match read(vars) {
            Err(e) => e,
            Ok(v) => panic!("expected an error, got {v:?}"),
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    /// `base` with the variables in `changes` set (replaced or added).
    fn set(base: &[(&'static str, &'static str)], changes: &[(&'static str, &'static str)]) -> Vars {
        let mut v: Vars =
            base.iter().filter(|(k, _)| !changes.iter().any(|(c, _)| c == k)).copied().collect();
        v.extend_from_slice(changes);
        v
    }

    /// `base` without the variables in `names`.
    fn unset(base: &[(&'static str, &'static str)], names: &[&str]) -> Vars {
        base.iter().filter(|(k, _)| !names.contains(k)).copied().collect()
    }

    fn summary(env: &SlurmEnv) -> Vec<(&'static str, String)> {
        env.summary()
    }

    fn pairs(v: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        v.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
    }

    fn inconsistent(variables: &[&'static str], message: &str) -> Error {
        Error::Inconsistent { variables: variables.to_vec(), message: message.to_owned() }
    }

    fn variable(variable: &'static str, value: &str, position: usize, expected: &'static str) -> Error {
        Error::Variable { variable, value: value.to_owned(), position, expected }
    }

    /// Rank 3 of 4 in `srun -N2 -n4 -c8` inside a 2-node job, as srun sets it up.
    const STEP: &[(&str, &str)] = &[
        ("SLURM_JOB_ID", "123456"),
        ("SLURM_JOBID", "123456"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_STEPID", "0"),
        ("SLURM_PROCID", "3"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_NPROCS", "4"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "1"),
        ("SLURM_JOB_NUM_NODES", "2"),
        ("SLURM_NNODES", "2"),
        ("SLURM_JOB_NODELIST", "cn[07-08]"),
        ("SLURM_NODELIST", "cn[07-08]"),
        ("SLURM_STEP_NODELIST", "cn[07-08]"),
        ("SLURM_STEP_NUM_NODES", "2"),
        ("SLURM_TASKS_PER_NODE", "2(x2)"),
        ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
        ("SLURM_CPUS_PER_TASK", "8"),
        ("SLURM_CPU_BIND", "quiet,mask_cpu:0x00FF,0xFF00"),
        ("SLURM_JOB_NAME", "train-mlp"),
        ("SLURM_JOB_PARTITION", "cpu"),
        ("SLURM_SUBMIT_DIR", "/home/ana/runs"),
        ("SLURMD_NODENAME", "cn08"),
    ];

    /// The batch script of `sbatch -N2 --ntasks-per-node=2`: no step, no rank.
    const BATCH: &[(&str, &str)] = &[
        ("SLURM_JOB_ID", "777"),
        ("SLURM_JOBID", "777"),
        ("SLURM_JOB_NAME", "sweep"),
        ("SLURM_JOB_NODELIST", "rack[1-2]-n[01-02]"),
        ("SLURM_NODELIST", "rack[1-2]-n[01-02]"),
        ("SLURM_JOB_NUM_NODES", "4"),
        ("SLURM_NNODES", "4"),
        ("SLURM_NODEID", "0"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_NPROCS", "8"),
        ("SLURM_TASKS_PER_NODE", "2(x4)"),
        ("SLURM_JOB_PARTITION", "batch"),
        ("SLURM_SUBMIT_DIR", "/scratch/b"),
        ("SLURM_JOB_CPUS_PER_NODE", "64(x4)"),
    ];

    #[test]
    fn not_in_slurm() {
        assert_eq!(read(&[]), Ok(None));
        assert_eq!(read(&unset(STEP, &["SLURM_JOB_ID"])), Ok(None));
    }

    #[test]
    fn two_node_step() {
        let env = ok(STEP);
        assert_eq!(
            env,
            SlurmEnv {
                job_id: 123456,
                step_id: Some(0),
                procid: Some(3),
                ntasks: Some(4),
                localid: Some(1),
                nodeid: Some(1),
                nnodes: Some(2),
                nodelist: strings(&["cn07", "cn08"]),
                step_nodelist: Some(strings(&["cn07", "cn08"])),
                cpus_per_task: Some(8),
                tasks_per_node: Some(vec![2, 2]),
                cpu_bind: Some("quiet,mask_cpu:0x00FF,0xFF00".to_owned()),
                job_name: Some("train-mlp".to_owned()),
                partition: Some("cpu".to_owned()),
                submit_dir: Some(PathBuf::from("/home/ana/runs")),
                restart_count: 0,
                het_size: None,
                het_job_id: None,
            }
        );
        assert_eq!(env.node_name(), Some("cn08"));
        assert_eq!(env.tasks_on_node(), Some(2));
        assert_eq!(
            summary(&env),
            pairs(&[
                ("slurm_job_id", "123456"),
                ("slurm_step_id", "0"),
                ("slurm_procid", "3"),
                ("slurm_ntasks", "4"),
                ("slurm_localid", "1"),
                ("slurm_nodeid", "1"),
                ("slurm_node", "cn08"),
                ("slurm_nnodes", "2"),
                ("slurm_nodelist", "cn[07-08]"),
                ("slurm_step_nodelist", "cn[07-08]"),
                ("slurm_tasks_per_node", "2(x2)"),
                ("slurm_cpus_per_task", "8"),
                ("slurm_cpu_bind", "quiet,mask_cpu:0x00FF,0xFF00"),
                ("slurm_job_name", "train-mlp"),
                ("slurm_partition", "cpu"),
                ("slurm_submit_dir", "/home/ana/runs"),
                ("slurm_restart_count", "0"),
            ])
        );
    }

    #[test]
    fn first_rank_of_the_step() {
        let env = ok(&set(STEP, &[("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0"), ("SLURM_NODEID", "0")]));
        assert_eq!((env.procid, env.localid, env.nodeid), (Some(0), Some(0), Some(0)));
        assert_eq!(env.node_name(), Some("cn07"));
    }

    #[test]
    fn batch_script_without_procid() {
        let env = ok(BATCH);
        assert_eq!(env.job_id, 777);
        assert_eq!((env.step_id, env.procid, env.localid), (None, None, None));
        assert_eq!(env.nodelist, strings(&["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]));
        assert_eq!(env.step_nodelist, None);
        assert_eq!(env.tasks_per_node, Some(vec![2, 2, 2, 2]));
        assert_eq!((env.cpus_per_task, env.cpu_bind.as_deref()), (None, None));
        assert_eq!(env.node_name(), Some("rack1-n01"));
        assert_eq!(
            summary(&env),
            pairs(&[
                ("slurm_job_id", "777"),
                ("slurm_ntasks", "8"),
                ("slurm_nodeid", "0"),
                ("slurm_node", "rack1-n01"),
                ("slurm_nnodes", "4"),
                ("slurm_nodelist", "rack1-n[01-02],rack2-n[01-02]"),
                ("slurm_tasks_per_node", "2(x4)"),
                ("slurm_job_name", "sweep"),
                ("slurm_partition", "batch"),
                ("slurm_submit_dir", "/scratch/b"),
                ("slurm_restart_count", "0"),
            ])
        );
    }

    #[test]
    fn requeued_job() {
        let env = ok(&set(STEP, &[("SLURM_RESTART_COUNT", "2")]));
        assert_eq!(env.restart_count, 2);
        assert!(summary(&env).contains(&("slurm_restart_count", "2".to_owned())));
        assert_eq!(ok(&set(BATCH, &[("SLURM_RESTART_COUNT", "1")])).restart_count, 1);
    }

    #[test]
    fn only_the_job_id() {
        let env = ok(&[("SLURM_JOB_ID", "5")]);
        assert_eq!(
            env,
            SlurmEnv {
                job_id: 5,
                step_id: None,
                procid: None,
                ntasks: None,
                localid: None,
                nodeid: None,
                nnodes: None,
                nodelist: Vec::new(),
                step_nodelist: None,
                cpus_per_task: None,
                tasks_per_node: None,
                cpu_bind: None,
                job_name: None,
                partition: None,
                submit_dir: None,
                restart_count: 0,
                het_size: None,
                het_job_id: None,
            }
        );
        assert_eq!(env.node_name(), None);
        assert_eq!(env.tasks_on_node(), None);
        assert_eq!(summary(&env), pairs(&[("slurm_job_id", "5"), ("slurm_restart_count", "0")]));
    }

    #[test]
    fn legacy_names() {
        let env = ok(&[
            ("SLURM_JOB_ID", "9"),
            ("SLURM_STEPID", "3"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NPROCS", "2"),
            ("SLURM_NNODES", "1"),
            ("SLURM_NODELIST", "solo"),
            ("SLURM_NODEID", "0"),
            ("SLURM_PACK_SIZE", "2"),
            ("SLURM_PACK_JOB_ID", "8"),
        ]);
        assert_eq!(
            (env.step_id, env.procid, env.ntasks, env.nnodes, env.het_size, env.het_job_id),
            (Some(3), Some(1), Some(2), Some(1), Some(2), Some(8))
        );
        assert_eq!(env.node_name(), Some("solo"));
    }

    #[test]
    fn current_names_take_precedence() {
        let env = ok(&set(
            STEP,
            &[
                ("SLURM_NPROCS", "99"),
                ("SLURM_NNODES", "1"),
                ("SLURM_NODELIST", "cn07"),
                ("SLURM_STEPID", "7"),
            ],
        ));
        assert_eq!((env.ntasks, env.nnodes, env.step_id), (Some(4), Some(2), Some(0)));
        assert_eq!(env.nodelist, strings(&["cn07", "cn08"]));
    }

    #[test]
    fn heterogeneous_job() {
        let env = ok(&set(STEP, &[("SLURM_HET_SIZE", "2"), ("SLURM_HET_JOB_ID", "123450")]));
        assert_eq!((env.het_size, env.het_job_id), (Some(2), Some(123450)));
        let s = summary(&env);
        assert_eq!(
            &s[s.len() - 2..],
            pairs(&[("slurm_het_size", "2"), ("slurm_het_job_id", "123450")]).as_slice()
        );
    }

    #[test]
    fn step_on_part_of_the_allocation() {
        // `srun -N1 -n1` in a 4-node job: nodeid indexes the step's nodes, not the job's.
        let env = ok(&[
            ("SLURM_JOB_ID", "11"),
            ("SLURM_STEP_ID", "2"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "0"),
            ("SLURM_JOB_NUM_NODES", "4"),
            ("SLURM_NNODES", "1"),
            ("SLURM_JOB_NODELIST", "n[1-4]"),
            ("SLURM_STEP_NODELIST", "n3"),
            ("SLURM_TASKS_PER_NODE", "1"),
        ]);
        assert_eq!(env.nnodes, Some(4));
        assert_eq!(env.node_name(), Some("n3"));
        assert_eq!(env.tasks_on_node(), Some(1));
    }

    #[test]
    fn localid_without_procid_is_fine() {
        let env = ok(&set(BATCH, &[("SLURM_LOCALID", "1")]));
        assert_eq!((env.procid, env.localid), (None, Some(1)));
    }

    #[test]
    fn numeric_variables_that_do_not_parse() {
        let u32_vars = [
            "SLURM_STEP_ID",
            "SLURM_PROCID",
            "SLURM_NTASKS",
            "SLURM_LOCALID",
            "SLURM_NODEID",
            "SLURM_JOB_NUM_NODES",
            "SLURM_CPUS_PER_TASK",
            "SLURM_RESTART_COUNT",
            "SLURM_HET_SIZE",
        ];
        let u64_vars = ["SLURM_JOB_ID", "SLURM_HET_JOB_ID"];
        let bad = [
            ("", 0, UNSIGNED),
            ("x1", 0, DIGIT),
            ("1x", 1, DIGIT),
            ("-1", 0, DIGIT),
            ("+1", 0, DIGIT),
            (" 1", 0, DIGIT),
            ("1 ", 1, DIGIT),
            ("0x10", 1, DIGIT),
        ];
        for name in u32_vars.iter().chain(&u64_vars) {
            for (value, position, expected) in bad {
                assert_eq!(
                    err(&set(STEP, &[(name, value)])),
                    variable(name, value, position, expected),
                    "{name}"
                );
            }
        }
        for name in u32_vars {
            assert_eq!(err(&set(STEP, &[(name, "4294967296")])), variable(name, "4294967296", 0, BELOW_2_32));
        }
        for name in u64_vars {
            let big = "18446744073709551616";
            assert_eq!(err(&set(STEP, &[(name, big)])), variable(name, big, 0, BELOW_2_64));
        }
        // Legacy names are named when they are the ones read.
        assert_eq!(
            err(&set(unset(STEP, &["SLURM_NTASKS"]).as_slice(), &[("SLURM_NPROCS", "four")])),
            variable("SLURM_NPROCS", "four", 0, DIGIT)
        );
        assert_eq!(
            err(&set(unset(STEP, &["SLURM_JOB_NUM_NODES"]).as_slice(), &[("SLURM_NNODES", "2.0")])),
            variable("SLURM_NNODES", "2.0", 1, DIGIT)
        );
        assert_eq!(
            err(&set(unset(STEP, &["SLURM_STEP_ID"]).as_slice(), &[("SLURM_STEPID", "batch")])),
            variable("SLURM_STEPID", "batch", 0, DIGIT)
        );
        assert_eq!(
            err(&[("SLURM_JOB_ID", "1"), ("SLURM_PACK_SIZE", "x")]),
            variable("SLURM_PACK_SIZE", "x", 0, DIGIT)
        );
        // The largest values parse.
        let env = ok(&[("SLURM_JOB_ID", "18446744073709551615"), ("SLURM_STEP_ID", "4294967294")]);
        assert_eq!((env.job_id, env.step_id), (u64::MAX, Some(4_294_967_294)));
    }

    #[test]
    fn variable_error_message() {
        assert_eq!(
            err(&set(STEP, &[("SLURM_PROCID", "3a")])).to_string(),
            "invalid SLURM_PROCID=\"3a\": expected a decimal digit at byte 1"
        );
    }

    #[test]
    fn procid_not_below_ntasks() {
        let e = err(&set(STEP, &[("SLURM_PROCID", "4")]));
        assert_eq!(
            e,
            inconsistent(&["SLURM_PROCID", "SLURM_NTASKS"], "SLURM_PROCID=4 is not below SLURM_NTASKS=4")
        );
        assert_eq!(
            e.to_string(),
            "contradictory Slurm environment: SLURM_PROCID=4 is not below SLURM_NTASKS=4"
        );
        assert_eq!(
            err(&set(unset(STEP, &["SLURM_NTASKS"]).as_slice(), &[("SLURM_PROCID", "7")])),
            inconsistent(&["SLURM_PROCID", "SLURM_NPROCS"], "SLURM_PROCID=7 is not below SLURM_NPROCS=4")
        );
    }

    #[test]
    fn localid_not_below_tasks_on_node() {
        assert_eq!(
            err(&set(STEP, &[("SLURM_LOCALID", "2")])),
            inconsistent(
                &["SLURM_LOCALID", "SLURM_TASKS_PER_NODE", "SLURM_NODEID"],
                "SLURM_LOCALID=2 is not below the 2 tasks that SLURM_TASKS_PER_NODE=\"2(x2)\" gives node SLURM_NODEID=1"
            )
        );
        // Uneven layout: node 1 has 1 task.
        assert_eq!(
            err(&set(STEP, &[("SLURM_TASKS_PER_NODE", "3,1"), ("SLURM_LOCALID", "1")])),
            inconsistent(
                &["SLURM_LOCALID", "SLURM_TASKS_PER_NODE", "SLURM_NODEID"],
                "SLURM_LOCALID=1 is not below the 1 tasks that SLURM_TASKS_PER_NODE=\"3,1\" gives node SLURM_NODEID=1"
            )
        );
        // Unknown tasks on this node: nothing to check.
        assert_eq!(
            ok(&unset(&set(STEP, &[("SLURM_LOCALID", "9")]), &["SLURM_TASKS_PER_NODE"])).localid,
            Some(9)
        );
        assert_eq!(ok(&unset(&set(STEP, &[("SLURM_LOCALID", "9")]), &["SLURM_NODEID"])).localid, Some(9));
    }

    #[test]
    fn nodeid_not_below_nnodes() {
        assert_eq!(
            err(&set(STEP, &[("SLURM_NODEID", "2")])),
            inconsistent(
                &["SLURM_NODEID", "SLURM_JOB_NUM_NODES"],
                "SLURM_NODEID=2 is not below SLURM_JOB_NUM_NODES=2"
            )
        );
        assert_eq!(
            err(&set(STEP, &[("SLURM_STEP_NODELIST", "cn07")])),
            inconsistent(
                &["SLURM_NODEID", "SLURM_STEP_NODELIST"],
                "SLURM_NODEID=1 but SLURM_STEP_NODELIST=\"cn07\" names 1 hosts"
            )
        );
    }

    #[test]
    fn nnodes_disagrees_with_nodelist() {
        assert_eq!(
            err(&set(STEP, &[("SLURM_JOB_NUM_NODES", "3")])),
            inconsistent(
                &["SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST"],
                "SLURM_JOB_NUM_NODES=3 but SLURM_JOB_NODELIST=\"cn[07-08]\" names 2 hosts"
            )
        );
        assert_eq!(
            err(&[("SLURM_JOB_ID", "1"), ("SLURM_NNODES", "1"), ("SLURM_NODELIST", "a,b")]),
            inconsistent(
                &["SLURM_NNODES", "SLURM_NODELIST"],
                "SLURM_NNODES=1 but SLURM_NODELIST=\"a,b\" names 2 hosts"
            )
        );
    }

    #[test]
    fn tasks_per_node_disagrees_with_ntasks() {
        assert_eq!(
            err(&set(STEP, &[("SLURM_TASKS_PER_NODE", "2,1")])),
            inconsistent(
                &["SLURM_TASKS_PER_NODE", "SLURM_NTASKS"],
                "SLURM_TASKS_PER_NODE=\"2,1\" sums to 3 tasks but SLURM_NTASKS=4"
            )
        );
        assert_eq!(
            err(&set(STEP, &[("SLURM_TASKS_PER_NODE", "4")])),
            inconsistent(
                &["SLURM_NODEID", "SLURM_TASKS_PER_NODE"],
                "SLURM_NODEID=1 but SLURM_TASKS_PER_NODE=\"4\" lists 1 nodes"
            )
        );
    }

    #[test]
    fn malformed_node_lists() {
        assert_eq!(
            err(&set(STEP, &[("SLURM_JOB_NODELIST", "cn[07-")])),
            Error::Hostlist {
                variable: Some("SLURM_JOB_NODELIST"),
                list: "cn[07-".to_owned(),
                position: 2,
                text: "[07-".to_owned(),
                problem: HostlistProblem::UnclosedBracket,
            }
        );
        assert_eq!(
            err(&set(STEP, &[("SLURM_STEP_NODELIST", "cn[08-07]")])),
            Error::Hostlist {
                variable: Some("SLURM_STEP_NODELIST"),
                list: "cn[08-07]".to_owned(),
                position: 3,
                text: "08-07".to_owned(),
                problem: HostlistProblem::DescendingRange { low: 8, high: 7 },
            }
        );
        assert!(matches!(
            err(&set(STEP, &[("SLURM_JOB_NODELIST", "")])),
            Error::Hostlist { variable: Some("SLURM_JOB_NODELIST"), problem: HostlistProblem::EmptyList, .. }
        ));
    }

    #[test]
    fn malformed_tasks_per_node_in_the_environment() {
        assert_eq!(
            err(&set(STEP, &[("SLURM_TASKS_PER_NODE", "2(x2")])),
            variable("SLURM_TASKS_PER_NODE", "2(x2", 4, "')'")
        );
    }

    #[test]
    fn tasks_per_node_forms() {
        let p = |s: &str| parse_tasks_per_node(s);
        assert_eq!(p("1"), Ok(vec![1]));
        assert_eq!(p("2(x3),1"), Ok(vec![2, 2, 2, 1]));
        assert_eq!(p("16(x1)"), Ok(vec![16]));
        assert_eq!(p("0,3(x2),12"), Ok(vec![0, 3, 3, 12]));
        let bad = |s: &str, position, expected| Err(variable("SLURM_TASKS_PER_NODE", s, position, expected));
        assert_eq!(p(""), bad("", 0, "a task count"));
        assert_eq!(p(" 2"), bad(" 2", 0, "a task count"));
        assert_eq!(p("2,,1"), bad("2,,1", 2, "a task count"));
        assert_eq!(p("2,"), bad("2,", 2, "a task count"));
        assert_eq!(p("2(3)"), bad("2(3)", 2, "'x' after '('"));
        assert_eq!(p("2("), bad("2(", 2, "'x' after '('"));
        assert_eq!(p("2(x)"), bad("2(x)", 3, "a repeat count"));
        assert_eq!(p("2(x0)"), bad("2(x0)", 3, "a repeat count of at least 1"));
        assert_eq!(p("2(x3"), bad("2(x3", 4, "')'"));
        assert_eq!(p("2(x3]"), bad("2(x3]", 4, "')'"));
        assert_eq!(p("2x"), bad("2x", 1, "',' or '(x'"));
        assert_eq!(p("2(x3)x"), bad("2(x3)x", 5, "',' or '(x'"));
        assert_eq!(p("4294967296"), bad("4294967296", 0, BELOW_2_32));
        assert_eq!(p("1(x4294967296)"), bad("1(x4294967296)", 3, BELOW_2_32));
        assert_eq!(p("1(x1000001)"), bad("1(x1000001)", 0, "at most 1000000 nodes in total"));
        assert_eq!(
            p("1(x600000),1(x400001)"),
            bad("1(x600000),1(x400001)", 11, "at most 1000000 nodes in total")
        );
        assert_eq!(p("1(x1000000)").map(|v| v.len()), Ok(MAX_HOSTS));
    }

    #[test]
    fn tasks_per_node_format() {
        assert_eq!(format_tasks_per_node(&[]), "");
        assert_eq!(format_tasks_per_node(&[2, 2, 2, 1]), "2(x3),1");
        assert_eq!(format_tasks_per_node(&[1, 2, 1]), "1,2,1");
        assert_eq!(format_tasks_per_node(&[4, 4]), "4(x2)");
    }

    proptest! {
        #[test]
        fn tasks_per_node_round_trip(counts in prop::collection::vec(prop_oneof![0u32..4, Just(u32::MAX)], 1..30)) {
            prop_assert_eq!(parse_tasks_per_node(&format_tasks_per_node(&counts)), Ok(counts));
        }

        #[test]
        fn from_vars_never_panics(
            procid in "[0-9x]{0,3}",
            ntasks in "[0-9]{0,2}",
            nodeid in "[0-9]{0,2}",
            localid in "[0-9]{0,2}",
            tpn in "[0-9(x),]{0,8}",
            list in "[a-b0-9,\\[\\]\\-]{0,10}",
        ) {
            let vars = [
                ("SLURM_JOB_ID", "1"),
                ("SLURM_PROCID", procid.as_str()),
                ("SLURM_NTASKS", ntasks.as_str()),
                ("SLURM_NODEID", nodeid.as_str()),
                ("SLURM_LOCALID", localid.as_str()),
                ("SLURM_TASKS_PER_NODE", tpn.as_str()),
                ("SLURM_JOB_NODELIST", list.as_str()),
            ];
            let _ = read(&vars);
        }
    }
}
