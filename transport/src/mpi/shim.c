/* MPI constants that rsmpi's generated bindings do not export (they are macros whose values and
 * even types differ between OpenMPI and MPICH). Built with the MPI compiler wrapper by build.rs. */
#include <mpi.h>

MPI_Op peregrine_mpi_no_op(void) { return MPI_NO_OP; }
MPI_Op peregrine_mpi_replace(void) { return MPI_REPLACE; }
int peregrine_mpi_mode_nocheck(void) { return MPI_MODE_NOCHECK; }
void *peregrine_mpi_in_place(void) { return MPI_IN_PLACE; }
