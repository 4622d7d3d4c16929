//! Builds the MPI constant shim (feature `mpi` only) with the MPI compiler wrapper.

fn main() {
    #[cfg(feature = "mpi")]
    {
        println!("cargo:rerun-if-changed=src/mpi/shim.c");
        println!("cargo:rerun-if-env-changed=MPICC");
        let mpicc = std::env::var("MPICC").unwrap_or_else(|_| "mpicc".to_owned());
        cc::Build::new().compiler(mpicc).file("src/mpi/shim.c").compile("peregrine_mpi_shim");
    }
}
