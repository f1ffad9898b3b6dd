// The compiler's passes over the ExecutionPlan (memory_plan.h): storage,
// layouts, lifetimes, in-place residuals.
#include "engine/compiler/memory_plan.h"

#include <algorithm>

namespace numaserve::engine::internal {

using runtime::ExecutionPlan;
using runtime::Storage;

void PlanInPlaceResiduals(ExecutionPlan& plan, bool enabled) {
  plan.in_place_of.assign(plan.graph->num_values(), kNoValue);
  if (!enabled) return;
  for (size_t k = 0; k < plan.steps.size(); ++k) {
    // Conv's residual sum and MatMul's residual (or Gemm's C).
    const StepTraits& traits = plan.steps[k]->traits();
    const ValueId residual = traits.residual_input;
    if (residual == kNoValue) continue;
    const ValueId source = traits.residual_source, d = traits.residual_output;
    const ValueId s = plan.root[residual];
    if (plan.root[d] != d || plan.storage[s] != Storage::kArena ||
        plan.storage[d] != Storage::kArena || plan.internal[s] || plan.internal[d] ||
        plan.first_step[s] < 0 || plan.first_step[d] < 0 ||
        plan.last_step[s] != static_cast<int>(k) || plan.root[source] == s ||
        plan.shapes1[residual] != plan.shapes1[d] || plan.blocked[s] != plan.blocked[d]) {
      continue;
    }
    plan.in_place_of[d] = s;
    // The bytes now live until d's last reader: extend every owner's
    // lifetime along the chain (residual blocks chain through each other).
    for (ValueId t = s; t != kNoValue; t = plan.in_place_of[t]) {
      plan.last_step[t] = std::max(plan.last_step[t], plan.last_step[d]);
    }
  }
}

void PlanLifetimes(ExecutionPlan& plan, const std::vector<int>& step_of_node,
                   const std::vector<int>& producer,
                   const std::vector<std::vector<int>>& consumers) {
  const int num_values = plan.graph->num_values();
  plan.first_step.assign(num_values, -1);
  plan.last_step.assign(num_values, -1);
  for (ValueId v = 0; v < num_values; ++v) {
    if (plan.root[v] != v || plan.storage[v] != Storage::kArena || producer[v] < 0) continue;
    plan.first_step[v] = step_of_node[producer[v]];
  }
  for (ValueId v = 0; v < num_values; ++v) {
    const ValueId r = plan.root[v];
    if (plan.storage[r] != Storage::kArena || plan.first_step[r] < 0) continue;
    plan.last_step[r] = std::max(plan.last_step[r], plan.first_step[r]);
    for (int c : consumers[v]) plan.last_step[r] = std::max(plan.last_step[r], step_of_node[c]);
  }
  // A value that only the step producing it reads (a conv's output before
  // its fused BatchNormalization, activation or depthwise conv) is never
  // stored: it needs no space.
  plan.internal.assign(num_values, false);
  std::vector<int> readers(num_values, 0), outside(num_values, 0);
  for (ValueId v = 0; v < num_values; ++v) {
    const ValueId r = plan.root[v];
    if (plan.storage[r] != Storage::kArena || plan.first_step[r] < 0) continue;
    for (int c : consumers[v]) {
      ++readers[r];
      if (step_of_node[c] != plan.first_step[r]) ++outside[r];
    }
  }
  for (ValueId v = 0; v < num_values; ++v) {
    plan.internal[v] = plan.root[v] == v && plan.storage[v] == Storage::kArena &&
                       plan.first_step[v] >= 0 && readers[v] > 0 && outside[v] == 0;
  }
}

void PlanStepReads(ExecutionPlan& plan, const std::vector<int>& step_of_node,
                   const std::vector<bool>& absorbed) {
  const Graph& graph = *plan.graph;
  plan.step_reads.assign(plan.steps.size(), {});
  plan.read_outside_steps.clear();
  for (size_t k = 0; k < plan.steps.size(); ++k) {
    const StepTraits& traits = plan.steps[k]->traits();
    for (ValueId v : traits.reads) {
      if (v != kNoValue) plan.step_reads[k].push_back({v, traits.reads_shape_values});
    }
  }
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const Node& node = graph.nodes()[i];
    const int k = i < step_of_node.size() ? step_of_node[i] : -1;
    if (k >= 0 && k < static_cast<int>(plan.steps.size())) {
      const bool as_shape_value =
          plan.steps[k]->traits().reads_shape_values && !(i < absorbed.size() && absorbed[i]);
      for (ValueId v : node.inputs) {
        if (v != kNoValue) plan.step_reads[k].push_back({v, as_shape_value});
      }
      continue;
    }
    // A view's bytes are its source's: read where the view is.
    const bool view = node.outputs.size() == 1 && !node.inputs.empty() &&
                      node.inputs[0] != kNoValue && plan.root[node.outputs[0]] != node.outputs[0] &&
                      plan.root[node.outputs[0]] == plan.root[node.inputs[0]];
    if (view) continue;
    for (ValueId v : node.inputs) {
      if (v != kNoValue) plan.read_outside_steps.push_back(v);
    }
  }
  for (ValueId v : graph.outputs()) plan.read_outside_steps.push_back(v);
}

void ChooseLayouts(ExecutionPlan& plan) {
  const int num_values = plan.graph->num_values();
  const std::vector<Shape>& shapes1 = plan.shapes1;
  plan.blocked.assign(num_values, false);
  for (const auto& step : plan.steps) {
    const ValueId v = step->traits().blocked_write;
    if (v != kNoValue && plan.root[v] == v && plan.storage[v] == Storage::kArena &&
        shapes1[v].size() >= 3 && shapes1[v].size() <= 5) {
      plan.blocked[v] = true;
    }
  }
  for (ValueId v = 0; v < num_values; ++v) {
    if (plan.root[v] != v) plan.blocked[plan.root[v]] = false;  // a view reads it plain
  }
  for (bool changed = true; changed;) {
    changed = false;
    auto unblock = [&](ValueId v) {
      if (v != kNoValue && plan.blocked[v]) {
        plan.blocked[v] = false;
        changed = true;
      }
    };
    for (const auto& step : plan.steps) {
      const std::vector<ValueId>& ok = step->traits().blocked_reads;
      for (ValueId r : step->traits().reads) {
        if (r != kNoValue && std::find(ok.begin(), ok.end(), r) == ok.end()) unblock(r);
      }
    }
  }
  for (const auto& step : plan.steps) step->SetLayouts(plan.blocked);
}

void AssignStorage(ExecutionPlan& plan) {
  const Graph& graph = *plan.graph;
  const int num_values = graph.num_values();
  plan.storage.assign(num_values, Storage::kArena);
  plan.output_slot.assign(num_values, -1);
  for (ValueId v : graph.inputs()) plan.storage[v] = Storage::kInput;
  for (const auto& [v, c] : graph.constants()) plan.storage[v] = Storage::kConstant;
  std::vector<int> outputs_per_root(num_values, 0);
  for (ValueId v : graph.outputs()) ++outputs_per_root[plan.root[v]];
  for (size_t j = 0; j < graph.outputs().size(); ++j) {
    const ValueId r = plan.root[graph.outputs()[j]];
    if (plan.storage[r] == Storage::kArena && outputs_per_root[r] == 1) {
      plan.storage[r] = Storage::kOutput;
      plan.output_slot[r] = static_cast<int>(j);
    }
  }
}

}  // namespace numaserve::engine::internal
