// The worker process: `numaserve worker ...`, started by the supervisor, one
// per planned domain. It pins itself first, then maps its arena (bound to its
// node), then loads models, so everything it allocates is node-local.
#pragma once

#include <string>
#include <vector>

#include "engine/model.h"
#include "server/shared_arena.h"
#include "worker.pb.h"

namespace numaserve::server {

// Descriptor numbers the supervisor places the control socket and the arena at.
inline constexpr int kWorkerControlFd = 3;
inline constexpr int kWorkerArenaFd = 4;

// Entry point of the `worker` sub-command (internal: started by `serve`).
int WorkerCommand(const std::vector<std::string>& args);

// Runs one batch of `model` on the slices of `arena` that `run` names and
// fills `reply` (ok, or the error). First every slice must lie inside the
// arena and hold exactly what the model reads or writes at run.batch() rows
// (CompiledModel::CheckBufferSizes): otherwise the batch fails, naming the
// tensor, before the engine reads or writes a byte.
void RunBatchOn(engine::CompiledModel& model, const SharedArena& arena, const worker::RunBatch& run,
                worker::Reply* reply);

}  // namespace numaserve::server
