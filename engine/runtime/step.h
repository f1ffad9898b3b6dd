// The step a compiled plan runs (engine/runtime/plan.h): one kernel,
// standing for one or more fused graph nodes, reading and writing values
// through a per-run pointer table indexed by ValueId. What the planners
// (layouts, memory, batch split, profile) know of a step is its
// StepTraits, plain data fixed when the step is made; the step itself keeps
// what differs per kernel: Prepare, Run, Describe and the profile's views
// at concrete shapes. The compiler (engine/compiler/compiled_steps.h) makes
// the concrete steps; the runtime runs them through this interface alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/ir/graph.h"

namespace numaserve::engine {

struct StepContext {
  dnnl::stream& stream;
  const std::vector<Shape>& shapes;  // concrete, by ValueId
  const std::vector<float*>& data;   // by ValueId (views resolved)
  // Profiling only (null otherwise): a step adds here the seconds it spends
  // copying or reordering a residual into its output, so the profile shows
  // that time as a reorder of its own.
  double* residual_seconds = nullptr;
};

// What the planners (layouts, memory, batch split, profile) know of a
// step: plain data, fixed when the step is made.
struct StepTraits {
  // Every value the step reads (kNoValue for an absent optional operand).
  std::vector<ValueId> reads;
  // Every value the step writes (its output; a reference step's outputs).
  std::vector<ValueId> writes;
  // Those of `reads` the step can read in oneDNN's channel-blocked layout
  // (nC[D]HW16c, nC[D]HW8c on AVX2), and the value it writes, if it can
  // write it blocked (kNoValue otherwise). A value stays blocked only when
  // its producer and every reader handle it (the compiler's layout plan decides).
  std::vector<ValueId> blocked_reads;
  ValueId blocked_write = kNoValue;
  // The residual this step copies into its output first, if any; with one,
  // the value the step computes from (residual_source) and the value it
  // writes (residual_output), for the in-place residual plan.
  ValueId residual_input = kNoValue;
  ValueId residual_source = kNoValue;
  ValueId residual_output = kNoValue;
  // Every value the step reads and writes when row i (index i of the
  // leading, batch dimension) of what it writes depends on row i of what it
  // reads alone, as in conv, pooling, matmul with constant weights, layer
  // norm and attention over batch dims: such a step can run a batch in
  // slices of rows. The value written comes last. Empty otherwise.
  std::vector<ValueId> row_wise;
  // Bytes of the constant weights the step reads on every run (and every
  // slice of a split batch); 0 when it has none worth counting.
  int64_t weight_bytes = 0;
  // For the profile's bytes moved: the constant operands the step holds
  // itself (weights, bias, norm scales folded in at compile time, which
  // `reads` does not name), at their logical size in the type the step
  // reads them in, not their prepacked (padded) size; 0 for steps holding
  // none.
  int64_t parameter_bytes = 0;
  // The arithmetic the step's multiply-adds run in: "fp32", "bf16" or
  // "int8" (the peak its FLOPs are measured against).
  const char* arithmetic = "fp32";
  // The step looks each of `reads` up through Graph::FindConstant at every
  // Run before it reads its bytes (the reference steps): a value that is a
  // shape value at the signature run (graph.h's ShapeValues) is read as
  // that constant, and needs no bytes.
  bool reads_shape_values = false;

  // A step that reads `reads`, writes `writes` and has nothing else to say.
  static StepTraits ReadsWrites(std::vector<ValueId> reads, std::vector<ValueId> writes) {
    StepTraits t;
    t.reads = std::move(reads);
    t.writes = std::move(writes);
    return t;
  }
};

class Step {
 public:
  explicit Step(StepTraits traits) : traits_(std::move(traits)) {}
  virtual ~Step() = default;

  const StepTraits& traits() const { return traits_; }

  // Called once per new batch size, before its first Run. What it creates
  // per shape is kept for the kernels::kShapeCacheCapacity most recently
  // run shapes only: Run creates it again for a shape dropped since.
  virtual absl::Status Prepare(const std::vector<Shape>& shapes) { return absl::OkStatus(); }
  virtual absl::Status Run(const StepContext& ctx) = 0;
  // The kernel and the graph nodes this step stands for
  // ("matmul: fc1+add1+relu1").
  virtual std::string Describe() const = 0;
  // The layouts chosen (by ValueId), before the first Prepare: true for a
  // value stored blocked (only values in traits().blocked_reads or
  // traits().blocked_write can be).
  virtual void SetLayouts(const std::vector<bool>& blocked) {}

  // For the profile: the multiply-adds x2 one Run does at these shapes (0
  // for steps without counted FLOPs), the layouts it reads and writes where
  // it has a choice ("nChw16c->plain"), and the oneDNN implementation.
  virtual double Flops(const std::vector<Shape>& shapes) const { return 0; }
  // The FLOPs its threads do between two of their synchronisations at these
  // shapes, held against ExecutionPlan::serial_below_flops to decide whether
  // it runs on one thread: all of Flops for most steps; one time step's for
  // a recurrent layer, whose threads meet at every step.
  virtual double ParallelGrainFlops(const std::vector<Shape>& shapes) const {
    return Flops(shapes);
  }
  virtual std::string Layouts() const { return ""; }
  virtual std::string Implementation(const std::vector<Shape>& shapes) const { return ""; }
  // Shapes (or shape pairs) the step keeps compiled state for (primitives,
  // broadcast plans), for tests of its bound; 0 for steps keeping none.
  virtual size_t CachedShapes() const { return 0; }
  // The layouts of the step's residual copy ("nChw16c->nChw16c"), for the
  // profile's reorder row; "" for steps that copy none or have no choice.
  virtual std::string ResidualLayouts() const { return ""; }

 private:
  StepTraits traits_;
};

}  // namespace numaserve::engine
