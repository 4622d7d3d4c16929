//! Multi-rank integration tests of Peregrine. The tests live in `tests/`; this library holds what
//! they share: how to launch an SPMD program under `mpirun`.

use std::path::Path;
use std::process::{Command, Output};

/// The MPI launcher to use: `$PEREGRINE_MPIRUN` (e.g. `mpirun.mpich`), else `mpirun`.
pub fn mpirun() -> String {
    std::env::var("PEREGRINE_MPIRUN").unwrap_or_else(|_| "mpirun".to_owned())
}

/// Runs `program args` under `mpirun -n ranks`, with the environment OpenMPI needs here (one-sided
/// components that work, root, oversubscription) unless the caller set it already.
pub fn mpirun_n(ranks: usize, program: &Path, args: &[&str]) -> Output {
    let launcher = mpirun();
    let mut cmd = Command::new(&launcher);
    cmd.arg("-n").arg(ranks.to_string()).arg(program).args(args);
    for (k, v) in [
        ("OMPI_MCA_osc", "sm,pt2pt"),
        ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
        ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
        ("OMPI_MCA_rmaps_base_oversubscribe", "1"),
    ] {
        if std::env::var_os(k).is_none() {
            cmd.env(k, v);
        }
    }
    cmd.output().unwrap_or_else(|e| panic!("cannot start `{launcher}`: {e} (is MPI installed?)"))
}

/// Panics with the child's output unless it exited with status 0.
pub fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
