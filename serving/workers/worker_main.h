// The worker process: `numaserve worker ...`, started by the supervisor, one
// per planned domain. It maps its arena, pins itself and binds its memory
// and the arena's pages to its node (BindWorker) before anything else runs,
// then loads models, so everything it allocates is node-local.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "affinity/pinning.h"
#include "engine/model.h"
#include "serving/workers/row_chunks.h"
#include "serving/workers/shared_arena.h"
#include "worker.pb.h"

namespace numaserve::serving {

// Descriptor numbers the supervisor places the control socket and the arena at.
inline constexpr int kWorkerControlFd = 3;
inline constexpr int kWorkerArenaFd = 4;

// Entry point of the `worker` sub-command (internal: started by `serve`).
int WorkerCommand(const std::vector<std::string>& args);

// What binding a worker came to, its cpus and its memory apart.
struct WorkerBinding {
  bool cpus_bound = false;
  std::string cpu_error;  // why not, when not
  // The memory policy in force on the worker's node, for the process and
  // its arena: "strict" or "prefer" (--membind), as asked; "first-touch"
  // where the kernel refused the policy (EPERM: a container's seccomp
  // filter) and the worker, bound to its node's cpus, touched its arena's
  // pages itself (its other memory is written first by those cpus too);
  // "none" where no node was planned or nothing could place the pages.
  std::string memory_policy = "none";
  std::string memory_error;  // the refusal or failure, when any
  std::string prefault;      // how the arena was pre-faulted, when it was
};

// Binds the calling process to `cpus` and its memory, and the arena's
// pages, to `numa_node` under `policy` (BindProcessCpus, BindProcessMemory,
// BindMemoryToNode), falling back on first touch as WorkerBinding says.
WorkerBinding BindWorker(const absl::StatusOr<std::vector<int>>& cpus, int numa_node,
                         affinity::MemoryPolicy policy, SharedArena& arena);

// The Hello's binding: the process's binding as the kernel has it, then
// whether the cpu binding held and which memory policy is in force, e.g.
// "cpus 0-3 mem strict node 0; cpu binding held; memory strict on node 0".
std::string DescribeWorkerBinding(const WorkerBinding& binding, int numa_node);

// Runs one batch of `model` on the slices of `arena` that `run` names and
// fills `reply` (ok and compute_ns, or the error and its code). First every
// slice must lie inside the arena and hold exactly what the model reads or
// writes at run.batch() rows (CompiledModel::CheckBufferSizes): otherwise
// the batch fails, naming the tensor, before the engine reads or writes a
// byte (code INTERNAL: the server's slots are wrong). An error of the
// engine's run carries the engine's code (INVALID_ARGUMENT, ...); a
// RESOURCE_EXHAUSTED one (a batch needing more activation bytes than the
// model's max_activation_bytes) names the model and what sets its limit.
// A shape-polymorphic model's batch runs at its signature
// (run.input_shapes(), SignatureOf): the signature forms of
// CheckBufferSizes and Run; any other at run.batch() alone.
// A batched model's batch over that limit runs in chunks of rows that fit
// (RunRowsInChunks; `fit`, kept per model copy by the caller, holds how
// many), so only a batch of which one row does not fit is refused so.
// `min_compute` > 0 (`worker --test-batch-compute-us`, for scheduler tests):
// a batch that computed in less sleeps (it does not spin) until that long
// has passed since its compute started, and reports the whole time as
// compute_ns, so many workers on few cores each hold a busy slot of a known
// length.
// With run.profile(), the engine's step profiling is on for this one run
// (SetProfiling(true) before, false after, so the model's next run pays
// nothing) and a successful reply carries profile_json:
// BatchProfileJson(run.batch(), compute_ns, StepProfileJson of the run).
// The signature a RunBatch carries (RunBatch::input_shapes); empty when it
// carries none (a model whose only dynamic dims are dims 0).
engine::CompiledModel::InputShapes SignatureOf(const worker::RunBatch& run);

void RunBatchOn(engine::CompiledModel& model, const SharedArena& arena, const worker::RunBatch& run,
                worker::Reply* reply,
                std::chrono::microseconds min_compute = std::chrono::microseconds(0),
                RowsThatFit* fit = nullptr);

// One profiled batch as a JSON object: {"batch": rows, "compute_ms": ...}
// followed by the fields of `steps_json` (engine::StepProfileJson: "runs",
// "step_ms", "wall_ms", "rows").
std::string BatchProfileJson(int64_t batch, int64_t compute_ns, std::string_view steps_json);

// Pages of the process's own resident memory per NUMA node from the text
// of /proc/<pid>/numa_maps (the N<node>=<pages> fields of its anonymous and
// shared-memory mappings, summed; not the page cache of the files it maps,
// shared with every process and placed where a file was first read):
// "0=1234 1=5", nodes ascending; empty when there are none.
std::string SumNumaMapsPages(std::string_view numa_maps);

}  // namespace numaserve::serving
