// ExecutionPlan: what the compiler hands the runtime. Plain data: the steps
// in order, where each value's bytes live, the layouts, the lifetimes and
// in-place links the activation arena is planned from, and the settings a
// Run needs. The compiler (engine/compiler/) fills it in once; the
// runtime's Executor (executor.h) plans each batch size from it and runs
// it. Nothing here changes after compilation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "engine/runtime/step.h"
#include "kernels/onednn/onednn_common.h"

namespace numaserve::engine::runtime {

// Where a value's data lives. Views share their source's storage: every
// value resolves to a root, and only roots have storage.
enum class Storage { kInput, kConstant, kArena, kOutput };

struct ExecutionPlan {
  // The graph the steps run (its values, inputs, outputs and constants);
  // owned by the compiled model, which outlives the plan.
  const Graph* graph = nullptr;
  // The model's file, for errors.
  std::string name;
  std::vector<std::unique_ptr<Step>> steps;

  // By ValueId: the value whose storage it shares (itself for a root).
  std::vector<ValueId> root;
  // By root: where its bytes live.
  std::vector<Storage> storage;
  // By root: index into Run's outputs for kOutput roots, else -1.
  std::vector<int> output_slot;
  // By root: stored in blocked_layout rather than plain.
  std::vector<bool> blocked;
  kernels::BlockedLayout blocked_layout = kernels::BlockedLayout::kChannelBlocked;
  // By arena root: the first step writing it and the last reading it
  // (views included), -1 for a value no step writes.
  std::vector<int> first_step, last_step;
  // By arena root: read only inside the step writing it (never stored).
  std::vector<bool> internal;
  // By arena root: the residual whose bytes it takes over (kNoValue: none),
  // when both have the same shape at the batch run.
  std::vector<ValueId> in_place_of;
  // Every value's shape at batch 1 (which values are batch-sized).
  std::vector<Shape> shapes1;
  // By step: every value its graph nodes read, with whether the step reads
  // it as a shape value when it is one (StepTraits::reads_shape_values); and
  // the values read outside the steps (graph outputs, the inputs of nodes
  // without a step of their own that are not views). A signature's plan
  // drops the steps that compute shape values no one reads as data
  // (PlanShapeValueSteps, batch_plan.h).
  struct ValueRead {
    ValueId value = kNoValue;
    bool as_shape_value = false;
  };
  std::vector<std::vector<ValueRead>> step_reads;
  std::vector<ValueId> read_outside_steps;

  // Kernel threads for steps not run serially; num_threads > 0: set as
  // OpenMP's thread count at the start of every Run.
  int threads = 1;
  int num_threads = 0;
  // A step runs on the calling thread alone below these (CompileOptions).
  double serial_below_flops = 0;
  int64_t serial_below_elements = 0;
  // The cache a split batch's slices fit (0: no split), how many batch
  // sizes keep their per-batch state (0: all), after how many runs without
  // one a batch size's state is dropped (0: never), and the most activation
  // bytes one run may need (0: no limit); CompileOptions says more.
  int64_t batch_split_cache_bytes = 0;
  int batch_plans = 0;
  int64_t batch_plan_idle_runs = 0;
  int64_t max_activation_bytes = 0;
};

// The arena root whose bytes `v` (an arena root) takes at these shapes,
// following in-place links that hold (equal shapes); `v` itself if none.
inline ValueId BytesOwner(const ExecutionPlan& plan, ValueId v, const std::vector<Shape>& shapes) {
  while (plan.in_place_of[v] != kNoValue && shapes[plan.in_place_of[v]] == shapes[v]) {
    v = plan.in_place_of[v];
  }
  return v;
}

}  // namespace numaserve::engine::runtime
