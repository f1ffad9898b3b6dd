// `numaserve train --config FILE [--ranks auto|N] [--resume]`: data-parallel
// training. Outside MPI it launches `mpirun` with one rank per NUMA domain
// (or N ranks), each rank being this same command; under mpirun (Open MPI's
// OMPI_COMM_WORLD_SIZE is set) it runs as one rank of the given job.
#pragma once

#include <string>
#include <vector>

#include "base/log.h"
#include "serving/workers/process_options.h"

namespace numaserve::cli {

// `process`: the process settings main read from the environment, the
// defaults of their flags (--max-isa, --training-reference-ops, ...).
int TrainCommand(const std::vector<std::string>& args, const serving::ProcessOptions& process);

struct MpirunOptions {
  std::string mpirun = "mpirun";  // the launcher
  std::string self;               // this numaserve executable
  // Ranks; 0 = one per NUMA domain of every host (needs `hostfile`).
  int ranks = 1;
  // Open MPI hostfile for multi-node jobs; empty = this machine.
  std::string hostfile;
  // The log settings every rank gets on its command line (--log-format,
  // --log-level): the launcher's, so every rank, on this host or another,
  // logs as the process that launched it.
  base::LogOptions log;
  // The process settings every rank gets on its command line (the kernel
  // and training ones): the launcher's, which Open MPI would not forward
  // to another host as environment variables.
  serving::ProcessOptions process;
};

// The mpirun command line that runs `numaserve train` ranks: each rank's
// arguments are `train_args`, the log options, then the process settings
// (exposed for --dry-run and its tests).
std::vector<std::string> MpirunCommand(const MpirunOptions& options,
                                       const std::vector<std::string>& train_args);

}  // namespace numaserve::cli
