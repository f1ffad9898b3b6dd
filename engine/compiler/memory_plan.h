// The compiler's passes over an ExecutionPlan (engine/runtime/plan.h) once
// every node has its step: where each value's bytes live, which
// activations stay in the blocked layout, each arena value's lifetime in
// steps, and which outputs take over a dying residual's bytes. Each pass
// reads the plan's graph, roots and the steps' traits, and fills in its
// own fields of the plan; the runtime plans each batch size from them
// (engine/runtime/batch_plan.h). Called in this order by
// CompiledModelImpl::PlanAfterLowering.
#pragma once

#include <vector>

#include "engine/runtime/plan.h"

namespace numaserve::engine::internal {

// plan.storage and plan.output_slot: graph inputs and constants keep their
// own bytes; a root produced by a step writes straight into the caller's
// output buffer when exactly one graph output resolves to it; everything
// else lives in the arena (outputs that are views of inputs or constants,
// or that share a root, are copied at the end of a run).
void AssignStorage(runtime::ExecutionPlan& plan);

// plan.blocked: an arena root of rank 3 to 5 stays in plan.blocked_layout
// when the step writing it can write it so and every step reading it can
// read it so (conv and pool chains), and no view reads it; plain
// otherwise. Then tells every step the layouts (Step::SetLayouts).
void ChooseLayouts(runtime::ExecutionPlan& plan);

// plan.first_step, plan.last_step and plan.internal: per arena root, the
// step writing it and the last step reading it or a view of it, and
// whether only the step writing it reads it (a value fused inside one step,
// which needs no bytes). step_of_node: by node, the step computing it;
// producer: by value, the node writing it (-1 for inputs and constants);
// consumers: by value, the nodes reading it.
void PlanLifetimes(runtime::ExecutionPlan& plan, const std::vector<int>& step_of_node,
                   const std::vector<int>& producer,
                   const std::vector<std::vector<int>>& consumers);

// plan.step_reads and plan.read_outside_steps: by step, the inputs of the
// graph nodes it stands for (step_of_node) and its traits' reads, each read
// as a shape value where the step reads its inputs so and the node is its
// own (not absorbed: `absorbed`, by node); graph outputs and the inputs of
// nodes without a step that are not views (a transpose a matmul reads
// through strides) are read outside the steps. A view's other inputs (a
// Reshape's target) are not read at run time.
void PlanStepReads(runtime::ExecutionPlan& plan, const std::vector<int>& step_of_node,
                   const std::vector<bool>& absorbed);

// plan.in_place_of: a step that copies a residual into its output first
// (conv's sum, matmul's residual, Gemm's C) writes into the residual's
// bytes instead when the residual dies at that step, has the same shape at
// batch 1 and the same layout, and is not the step's own source; the
// residual's lifetime then extends to the output's. With `enabled` false
// (CompileOptions::in_place_residuals), none.
void PlanInPlaceResiduals(runtime::ExecutionPlan& plan, bool enabled);

}  // namespace numaserve::engine::internal
