// Running a compiled model in process, for `numaserve bench` and
// `numaserve profile`: random inputs and room for the outputs at a batch
// size, and a stretch of runs with every compiled step timed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"

namespace numaserve::cli {

// Random inputs and room for the outputs of `batch` rows, each in its own
// datatype (storage in 8-byte words, so every element type is aligned).
struct RunBuffers {
  std::vector<std::vector<uint64_t>> inputs, outputs;
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
};

// By input name: integer inputs drawn uniformly in [0, bound), ids into a
// table of `bound` rows (numaserve bench --index-bounds).
using IndexBounds = std::map<std::string, int64_t>;

// "name=bound,name=bound" as IndexBounds; INVALID_ARGUMENT naming the part
// that is not a name, '=' and a bound >= 1.
absl::StatusOr<IndexBounds> ParseIndexBounds(const std::string& text);

// Floats in [-1, 1), integers 0..9 (an input `bounds` names: in [0, its
// bound)), booleans; the same values every call. INVALID_ARGUMENT when a
// buffer exceeds the engine's tensor limit (kernels::NumElementsChecked) or
// `bounds` names no integer input of the model (or a bound its type cannot
// hold), RESOURCE_EXHAUSTED when they take more than half the memory
// available now; the caller names the batch.
absl::StatusOr<RunBuffers> MakeRunBuffers(engine::CompiledModel& model, int64_t batch,
                                          const IndexBounds& bounds = {});

// The value at quantile q (0..1) of `v`, nearest rank; 0 when empty.
double Percentile(std::vector<double> v, double q);

// What ProfileRuns measured.
struct ProfiledRuns {
  int64_t runs = 0;
  double wall_seconds = 0;          // the runs' total wall time
  std::vector<double> run_seconds;  // each run's wall time, in order
  std::vector<engine::StepProfile> steps;
  std::vector<engine::StepEvent> events;  // with max_events > 0
};

// Runs `batch` rows for `seconds` (at least `min_runs` runs) with every
// step timed, keeping up to `max_events` step events (0: none), on inputs
// drawn as MakeRunBuffers draws them; profiling is off again when it
// returns, whatever the outcome.
absl::StatusOr<ProfiledRuns> ProfileRuns(engine::CompiledModel& model, int64_t batch,
                                         double seconds, int64_t min_runs = 5,
                                         int64_t max_events = 0, const IndexBounds& bounds = {});

}  // namespace numaserve::cli
