//! `peregrine slurm ...`: batch scripts for Slurm, and the job environment as Peregrine reads it.

use std::path::PathBuf;
use std::process::Command;

use clap::{Args, Parser, Subcommand, ValueEnum};
use peregrine_slurm::sbatch::{self, BatchSpec, MpiPlugin, NodeGroup};
use peregrine_slurm::SlurmEnv;

use crate::error::AppError;
use crate::output::{self, write_atomically};
use crate::Cli;

#[derive(Debug, Subcommand)]
pub enum SlurmCommand {
    /// Write a batch script that runs `srun --mpi=pmix peregrine <command>` with the right binding,
    /// threads and time-limit handling; `--dry-run` prints it, `--submit` submits it.
    ///
    /// The job's ranks get a warning signal --warn-before seconds before the time limit: they save
    /// their state in the run directory (runs/<job name>-<job id>) and exit 75, and the script
    /// requeues the job, which resumes from that state.
    Sbatch(Box<SbatchArgs>),
    /// Print the Slurm environment of this task as Peregrine reads it (`srun -n 4 peregrine slurm env`).
    Env,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Mpi {
    /// OpenMPI (and any PMIx-based MPI).
    Pmix,
    /// MPICH.
    Pmi2,
}

#[derive(Debug, Args)]
pub struct SbatchArgs {
    /// Nodes (of the first, or only, node type).
    #[arg(long, default_value_t = 1, value_name = "N")]
    nodes: u32,
    /// MPI ranks per node.
    #[arg(long, default_value_t = 1, value_name = "K")]
    ntasks_per_node: u32,
    /// Cores per rank (its compute threads).
    #[arg(long, default_value_t = 1, value_name = "C")]
    cpus_per_task: u32,
    /// Time limit (Slurm formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S).
    #[arg(long, value_name = "T")]
    time: Option<String>,
    /// Partition.
    #[arg(long, value_name = "P")]
    partition: Option<String>,
    /// Node features the first (or only) node type must have (`#SBATCH --constraint`), e.g. a
    /// node type; the --het groups name theirs in their fifth field.
    #[arg(long, value_name = "FEATURES")]
    constraint: Option<String>,
    /// Account to charge.
    #[arg(long, value_name = "A")]
    account: Option<String>,
    /// Job name.
    #[arg(long, default_value = "peregrine", value_name = "NAME")]
    job_name: String,
    /// Output file (%x: job name, %j: job id); a requeued job appends to it.
    #[arg(long, default_value = "%x-%j.out", value_name = "PATTERN")]
    output: String,
    /// PMI plugin for srun: pmix for OpenMPI, pmi2 for MPICH.
    #[arg(long, value_enum, default_value_t = Mpi::Pmix)]
    mpi: Mpi,
    /// Seconds before the time limit at which the ranks save their state and stop (0: never).
    #[arg(long, default_value_t = 120, value_name = "SECS")]
    warn_before: u32,
    /// Do not requeue the job after the ranks saved their state.
    #[arg(long)]
    no_requeue: bool,
    /// Heterogeneous job: one more node type, NODES:TASKS_PER_NODE:CPUS_PER_TASK[:PARTITION[:CONSTRAINT]]
    /// (repeatable; the --nodes/--ntasks-per-node/--cpus-per-task group is the first).
    #[arg(long = "het", value_name = "SPEC")]
    het: Vec<String>,
    /// A further #SBATCH option, verbatim (repeatable): --sbatch-arg=--mail-type=END.
    #[arg(long = "sbatch-arg", value_name = "OPTION", allow_hyphen_values = true)]
    extra: Vec<String>,
    /// The peregrine executable as the compute nodes see it (default: this one).
    #[arg(long, value_name = "PATH")]
    program: Option<PathBuf>,
    /// Where to write the script (default: <job name>.sbatch): written aside and renamed; not a
    /// link, a non-regular file or the program.
    #[arg(long, value_name = "PATH")]
    script: Option<PathBuf>,
    /// Print the script instead of writing it.
    #[arg(long, conflicts_with = "submit")]
    dry_run: bool,
    /// Write the script, submit it with sbatch, and print the job id.
    #[arg(long)]
    submit: bool,
    /// The peregrine command the job runs, after `--` (e.g. `-- conformance --repeat 10`).
    #[arg(last = true, required = true, num_args = 1.., value_name = "COMMAND")]
    command: Vec<String>,
}

pub fn run(cmd: SlurmCommand) -> Result<(), AppError> {
    match cmd {
        SlurmCommand::Sbatch(a) => sbatch_cmd(&a),
        SlurmCommand::Env => {
            let env = SlurmEnv::from_env()?
                .ok_or_else(|| AppError::Launch("not inside a Slurm job (no SLURM_JOB_ID)".into()))?;
            for (k, v) in env.summary() {
                println!("{k}={v}");
            }
            Ok(())
        }
    }
}

/// `NODES:TASKS:CPUS[:PARTITION[:CONSTRAINT]]`.
fn parse_group(spec: &str) -> Result<NodeGroup, AppError> {
    let bad = |why: &str| {
        AppError::Usage(format!(
            "--het `{spec}`: {why}; expected NODES:TASKS_PER_NODE:CPUS_PER_TASK[:PARTITION[:CONSTRAINT]]"
        ))
    };
    let f: Vec<&str> = spec.split(':').collect();
    if !(3..=5).contains(&f.len()) {
        return Err(bad("wrong number of fields"));
    }
    let num = |i: usize, what: &str| {
        f[i].parse::<u32>().map_err(|_| bad(&format!("{what} `{}` is not a number", f[i])))
    };
    let opt = |i: usize| f.get(i).filter(|s| !s.is_empty()).map(|s| (*s).to_owned());
    Ok(NodeGroup {
        nodes: num(0, "nodes")?,
        ntasks_per_node: num(1, "tasks per node")?,
        cpus_per_task: num(2, "cpus per task")?,
        partition: opt(3),
        constraint: opt(4),
    })
}

/// The script must not be a link, a non-regular file, the program it runs or this one.
fn check_script(a: &SbatchArgs, path: &std::path::Path) -> Result<(), AppError> {
    let flag = if a.script.is_some() { "--script" } else { "the script (<job name>.sbatch)" };
    let this = std::env::current_exe().ok();
    let programs: Vec<(&str, &std::path::Path)> = a
        .program
        .as_deref()
        .map(|p| ("--program", p))
        .into_iter()
        .chain(this.as_deref().map(|p| ("this program", p)))
        .collect();
    output::check(flag, path, &programs)
}

fn sbatch_cmd(a: &SbatchArgs) -> Result<(), AppError> {
    // The job's command must be one this binary understands: better now than in the queue.
    let mut argv = vec!["peregrine".to_owned()];
    argv.extend(a.command.iter().cloned());
    match Cli::try_parse_from(&argv) {
        Ok(cli) if matches!(cli.command, crate::Command::Slurm(_)) => {
            return Err(AppError::Usage("the job's command cannot be `slurm`".into()));
        }
        Ok(_) => {}
        Err(e) => {
            return Err(AppError::Usage(format!(
                "the job's command `{}` is not valid:\n{e}",
                a.command.join(" ")
            )));
        }
    }
    let path = a.script.clone().unwrap_or_else(|| PathBuf::from(format!("{}.sbatch", a.job_name)));
    if !a.dry_run {
        check_script(a, &path)?;
    }
    let mut groups = vec![NodeGroup {
        nodes: a.nodes,
        ntasks_per_node: a.ntasks_per_node,
        cpus_per_task: a.cpus_per_task,
        partition: None,
        constraint: a.constraint.clone(),
    }];
    for h in &a.het {
        groups.push(parse_group(h)?);
    }
    let program = match &a.program {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .and_then(|p| p.canonicalize())
            .map_err(|e| AppError::Io { what: "finding this executable's path".into(), source: e })?,
    };
    let spec = BatchSpec {
        job_name: a.job_name.clone(),
        groups,
        time: a.time.clone(),
        partition: a.partition.clone(),
        account: a.account.clone(),
        output: a.output.clone(),
        mpi: match a.mpi {
            Mpi::Pmix => MpiPlugin::Pmix,
            Mpi::Pmi2 => MpiPlugin::Pmi2,
        },
        warn_before_secs: a.warn_before,
        requeue: !a.no_requeue,
        extra: a.extra.clone(),
        program: program.display().to_string(),
        args: a.command.clone(),
    };
    let script = sbatch::render(&spec)?;
    if a.dry_run {
        print!("{script}");
        return Ok(());
    }
    write_atomically(&path, script.as_bytes())?;
    if !a.submit {
        println!("wrote {} (submit it with `sbatch {}`)", path.display(), path.display());
        return Ok(());
    }
    let out = Command::new("sbatch")
        .arg("--parsable")
        .arg(&path)
        .output()
        .map_err(|e| AppError::Io { what: "running sbatch (is Slurm installed?)".into(), source: e })?;
    if !out.status.success() {
        return Err(AppError::Launch(format!(
            "sbatch {} failed ({}): {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let id = stdout.trim().split(';').next().unwrap_or_default();
    eprintln!("submitted {}", path.display());
    println!("{id}");
    Ok(())
}
