// The worker process: `numaserve worker ...`, started by the supervisor, one
// per planned domain. It pins itself first, then maps its arena (bound to its
// node), then loads models, so everything it allocates is node-local.
#pragma once

#include <string>
#include <vector>

namespace numaserve::server {

// Descriptor numbers the supervisor places the control socket and the arena at.
inline constexpr int kWorkerControlFd = 3;
inline constexpr int kWorkerArenaFd = 4;

// Entry point of the `worker` sub-command (internal: started by `serve`).
int WorkerCommand(const std::vector<std::string>& args);

}  // namespace numaserve::server
