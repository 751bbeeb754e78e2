// How a process learns that an MPI launcher started it as one of a job's processes.
#pragma once
#include <string>
#include <vector>

namespace tessera {

// The variables by which a launcher tells a process that it is one of an MPI job's: mpirun's
// OMPI_COMM_WORLD_SIZE, PMIx's PMIX_RANK, PMI's PMI_SIZE (srun sets one of the last two).
// `train` starts MPI when one is set; the sweep clears them for its trials, which train alone.
const std::vector<std::string>& mpi_launcher_variables();

}  // namespace tessera
