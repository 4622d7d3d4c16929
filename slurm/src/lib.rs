//! Slurm support: the job environment (ranks, nodes, hostlists, CPU binding) and sbatch script
//! generation. Nothing here yet.
