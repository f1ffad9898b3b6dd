// The plan of an ExecutionPlan at one batch size (BatchState): every
// value's shape, the batch split (which leading steps run in slices of
// rows so their activations stay in the cache), the activation arena's
// offsets, and per step its FLOPs, bytes moved and serial flag. Pure
// functions of the plan and the batch; the Executor (executor.h) keeps the
// states of the most recently run batch sizes.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/runtime/plan.h"

namespace numaserve::engine::runtime {

inline constexpr size_t kAlignment = 64;

// Everything that depends on the batch size. Its activations live in the
// arena every state shares (the Executor's), at its offsets.
struct BatchState {
  int64_t batch = 0;
  std::vector<Shape> shapes;  // by ValueId
  // What the graph computes from shapes at this signature (a Reshape's
  // target from Shape -> Gather -> Concat): computed once, when the plan
  // is made, and read by the steps as constants while it runs.
  ShapeValues shape_values;
  // By step: dropped at this signature (PlanShapeValueSteps): every value
  // it writes is a shape value that no running step reads as data and no
  // graph output is. By ValueId: written by a dropped step (no bytes).
  std::vector<char> dropped;
  std::vector<char> dropped_value;
  int dropped_steps = 0;
  std::vector<int64_t> arena_offset;   // by ValueId, for kArena roots
  std::vector<float*> data;            // by ValueId, refreshed per Run
  int64_t arena_bytes = 0;             // peak activation bytes (the plan's size)
  std::vector<double> step_flops;      // by step, per Run (for the profile)
  std::vector<double> step_bytes;      // by step, per Run: compulsory bytes moved
  std::vector<double> residual_bytes;  // by step: its residual read and copied into dst
  std::vector<char> serial;            // by step: runs on the calling thread alone
  // Batch splitting (CompileOptions::batch_split_cache_bytes): steps
  // [0, split_steps) run slice_rows rows at a time, the last slice with the
  // rest. Values those steps alone use ("slice-local") hold one slice and
  // are reused by every slice; the others hold the batch, and a slice sees
  // its rows of them.
  int split_steps = 0;
  int64_t slice_rows = 0;
  std::vector<Shape> slice_shapes, tail_shapes;  // by ValueId: a full slice's, the last's
  std::vector<char> slice_local;                 // by ValueId (views included)
  std::vector<int64_t> row_floats;    // by ValueId: floats per row, for batch-sized values
  std::vector<ValueId> split_values;  // every value the split steps read or write
  std::vector<float*> slice_data;     // by ValueId, per slice
  bool ran = false;                   // a Run at this batch has completed
  uint64_t last_used = 0;             // the Executor's use clock at its last use
};

// Decides state.split_steps and state.slice_rows for state.batch at
// state.shapes, and the shapes and row sizes the slices use.
void PlanBatchSplit(const ExecutionPlan& plan, BatchState& state);

// Decides state.dropped and state.dropped_value at state.shape_values: a
// step whose every output is a shape value is dropped unless a step that
// runs reads one of them as data (not as a shape value,
// ExecutionPlan::step_reads), or it is read outside the steps (a graph
// output); the steps reading it read the value computed when the plan was
// made instead.
void PlanShapeValueSteps(const ExecutionPlan& plan, BatchState& state);

// Places state's arena values (arena_offset) and sets its arena_bytes:
// largest first, each at the lowest offset free during its lifetime; a
// value of a dropped step takes none (offset -1).
void PlanArena(const ExecutionPlan& plan, BatchState& state);

// Per step, into `state`: its FLOPs, compulsory bytes, residual bytes and
// whether it runs serially (below the plan's serial thresholds).
void PlanStepCosts(const ExecutionPlan& plan, BatchState& state);

// The compulsory bytes one Run of `step` moves at `shapes`: the values it
// reads and writes (each once) and the parameters it holds.
double StepBytes(const Graph& graph, const Step& step, const std::vector<Shape>& shapes);

}  // namespace numaserve::engine::runtime
