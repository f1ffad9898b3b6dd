// Executor: runs an ExecutionPlan (plan.h). It keeps the plans of the most
// recently run signatures (batch_plan.h; a signature is every input's
// shape, for most models the batch size alone) and the activation arena they
// share, points every value at its bytes, runs the steps in order (the
// leading ones slice by slice when the batch is split, small ones on the
// calling thread alone) and, while profiling, times each step. What the
// compiled model's run-time methods (engine/model.h) do, the compiled model
// asks of its Executor.
//
// Not thread-safe: one call at a time, as CompiledModel.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/profile/step_profile.h"
#include "engine/runtime/batch_plan.h"
#include "engine/runtime/plan.h"

namespace numaserve::engine::runtime {

class Executor {
 public:
  // `plan` must outlive the Executor; its steps run on `engine`'s stream.
  Executor(const ExecutionPlan* plan, const dnnl::engine& engine);
  // With print_profile_at_exit, the profile goes to the log here.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs `batch` rows: inputs[i] holds graph input i, outputs[j] has room
  // for graph output j (CompiledModel::Run).
  absl::Status Run(int64_t batch, const std::vector<const void*>& inputs,
                   const std::vector<void*>& outputs);
  // Runs at these input shapes (CheckSignature's rules; CompiledModel::Run).
  absl::Status Run(const std::vector<Shape>& input_shapes, const std::vector<const void*>& inputs,
                   const std::vector<void*>& outputs);
  // CompiledModel::CheckBufferSizes.
  absl::Status CheckBufferSizes(int64_t batch, const std::vector<size_t>& input_bytes,
                                const std::vector<size_t>& output_bytes) const;
  absl::Status CheckBufferSizes(const std::vector<Shape>& input_shapes,
                                const std::vector<size_t>& input_bytes,
                                const std::vector<size_t>& output_bytes) const;
  // Every graph output's shape at `batch` rows; empty when it cannot run there.
  std::vector<std::vector<int64_t>> OutputShapes(int64_t batch) const;
  // At these input shapes; INVALID_ARGUMENT naming why it cannot run there.
  absl::StatusOr<std::vector<std::vector<int64_t>>> OutputShapes(
      const std::vector<Shape>& input_shapes) const;
  // The arena bytes the plan at `batch` (at these input shapes) needs,
  // planning it if new.
  absl::StatusOr<int64_t> ActivationBytes(int64_t batch);
  absl::StatusOr<int64_t> ActivationBytes(const std::vector<Shape>& input_shapes);
  // Signatures (batch sizes) with a plan now, and the arena's bytes.
  int64_t cached_plans() const { return static_cast<int64_t>(per_batch_.size()); }
  int64_t arena_bytes() const { return arena_bytes_; }
  // The steps as they ran at `batch` (FAILED_PRECONDITION before a Run there).
  absl::StatusOr<std::vector<PlannedStep>> PlanAt(int64_t batch) const;
  // At these input shapes (FAILED_PRECONDITION before a run there, or once
  // its plan was dropped).
  absl::StatusOr<std::vector<PlannedStep>> PlanAt(const std::vector<Shape>& input_shapes) const;

  // Profiling (CompiledModel::SetProfiling and the rest).
  void SetProfiling(bool on);
  void SetStepEventLimit(int64_t max_events) { event_limit_ = std::max<int64_t>(max_events, 0); }
  std::vector<StepProfile> Profile() const;
  std::vector<StepEvent> StepEvents() const { return events_; }
  // Profiles from the start and logs the profile when the Executor is freed
  // (CompileOptions::profile_steps).
  void PrintProfileAtExit() {
    SetProfiling(true);
    print_profile_at_exit_ = true;
  }

 private:
  // The arena is mapped on its own (mmap), not taken from the heap: freed,
  // its pages go back to the system at once, and arenas of growing sizes
  // leave no holes in the heap that keep the process's resident set up.
  struct Unmap {
    size_t bytes;  // no initializer: default-constructible inside Executor (GCC)
    void operator()(float* p) const;
  };
  // Per step, while profiling.
  struct StepTimes {
    int64_t calls = 0;
    double seconds = 0;           // the step, its residual copy excluded
    double residual_seconds = 0;  // copying/reordering its residual into dst
    double flops = 0;
    double bytes = 0;
    double residual_bytes = 0;
  };

  // OK when `batch` is a row count Run takes: >= 1 when an input has a
  // dynamic dim 0, else 1; never for a model with other dynamic dims.
  absl::Status CheckBatch(int64_t batch) const;
  // The state of the signature `key` (CheckSignature's), planned and
  // prepared when new, at `input_shapes` (null: InputShapesForBatch at
  // key[0]); RESOURCE_EXHAUSTED when its plan needs more than
  // plan.max_activation_bytes.
  absl::StatusOr<BatchState*> GetState(const std::vector<int64_t>& key,
                                       const std::vector<Shape>* input_shapes);
  // GetState at `batch` rows, its key built in batch_key_ (no allocation).
  absl::StatusOr<BatchState*> GetBatchState(int64_t batch);
  // Every value's shape at signature `key` (its plan's, else propagated).
  absl::StatusOr<std::vector<Shape>> ValueShapes(const std::vector<int64_t>& key,
                                                 const std::vector<Shape>& input_shapes) const;
  // CheckBufferSizes at `in_shapes` (`at` names them in errors), with the
  // value shapes of their plan where there is one.
  absl::Status CheckSizes(const std::string& at, const std::vector<Shape>& in_shapes,
                          const std::vector<Shape>* planned, const std::vector<size_t>& input_bytes,
                          const std::vector<size_t>& output_bytes) const;
  // As many non-null buffers as inputs and outputs.
  absl::Status CheckBuffers(const std::vector<const void*>& inputs,
                            const std::vector<void*>& outputs) const;
  // Binds and runs the steps of `state`, then copies the outputs not
  // written in place.
  absl::Status RunState(BatchState& state, const std::vector<const void*>& inputs,
                        const std::vector<void*>& outputs);
  // PlanAt of the signature `key`, named `at` in the error.
  absl::StatusOr<std::vector<PlannedStep>> PlanAtKey(const std::vector<int64_t>& key,
                                                     const std::string& at) const;
  // `s` with the model's name in front.
  absl::Status Named(const absl::Status& s) const;
  // Sizes arena_ for the plans kept and one of `arena_bytes` (for `batch`,
  // in the error): it grows to the largest, and with `shrink` (idle plans
  // were dropped) it is mapped again at that size when it is more than twice
  // as large.
  absl::Status FitArena(int64_t batch, int64_t arena_bytes, bool shrink);
  // Prepares every step at its shapes in `state`, on the threads it will run on.
  absl::Status PrepareSteps(const BatchState& state);
  // Drops the least recently used batch plans until a new one fits plan.batch_plans.
  void EvictBatchPlans();
  // Drops the plans not run in the last plan.batch_plan_idle_runs runs; true
  // when it dropped any.
  bool DropIdlePlans();
  // Forgets the plan at `it` (and the profile's pointer to it).
  void DropPlan(std::map<std::vector<int64_t>, BatchState>::iterator it);
  // Points every value at its bytes for this Run.
  void BindData(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                BatchState& state) const;
  // The step loop, timing each step when `kProfile`.
  template <bool kProfile>
  absl::Status RunSteps(const StepContext& ctx, BatchState& state);
  // Steps [begin, end) on `ctx`; `first` is false for the second and later
  // slices of a split batch (the profile counts a step once per run).
  template <bool kProfile>
  absl::Status RunRange(const StepContext& ctx, const BatchState& state, size_t begin, size_t end,
                        bool first);
  void PrintProfile() const;

  const ExecutionPlan& plan_;
  const Graph& graph_;
  dnnl::stream stream_;
  // By signature key (CheckSignature: {batch} for a model whose only
  // dynamic dims are dims 0): at most plan_.batch_plans, the least recently
  // used dropped first, and none idle for more than
  // plan_.batch_plan_idle_runs runs.
  std::map<std::vector<int64_t>, BatchState> per_batch_;
  std::vector<int64_t> batch_key_;  // Run(batch)'s key, reused
  // Why Run(batch) cannot run this model (a dynamic dim besides dim 0);
  // empty where it can.
  std::string batch_refusal_;
  uint64_t use_clock_ = 0;
  // The activation arena of every batch state (one Run at a time): at least
  // as large as the largest plan kept; at most twice as large right after
  // idle plans were dropped.
  std::unique_ptr<float, Unmap> arena_;
  int64_t arena_bytes_ = 0;

  bool profiling_ = false;
  bool print_profile_at_exit_ = false;
  std::vector<StepTimes> times_;  // by step, since profiling started
  int64_t profile_runs_ = 0;
  std::chrono::steady_clock::time_point profile_start_;  // the last SetProfiling(true)
  int64_t event_limit_ = 0;                              // SetStepEventLimit
  std::vector<StepEvent> events_;                        // since profiling started
  bool events_full_ = false;                // a Run went past event_limit_: keep no more
  bool record_events_ = false;              // keep this Run's events
  const BatchState* last_state_ = nullptr;  // the last profiled Run's
};

}  // namespace numaserve::engine::runtime
