// `numaserve train --config FILE [--ranks auto|N] [--resume]`: data-parallel
// training. Outside MPI it launches `mpirun` with one rank per NUMA domain
// (or N ranks), each rank being this same command; under mpirun (Open MPI's
// OMPI_COMM_WORLD_SIZE is set) it runs as one rank of the given job.
#pragma once

#include <string>
#include <vector>

namespace numaserve::server {

int TrainCommand(const std::vector<std::string>& args);

// The mpirun command line that runs `ranks` ranks of `numaserve train`
// (exposed for tests and --dry-run).
std::vector<std::string> MpirunCommand(const std::string& mpirun, const std::string& self,
                                       int ranks, const std::vector<std::string>& train_args);

}  // namespace numaserve::server
