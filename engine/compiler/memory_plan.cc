// CompiledModelImpl (compiled_model_impl.h): the memory plan. Activation
// layouts, value lifetimes, in-place residuals and storage, into the
// ExecutionPlan; the runtime plans each batch size from them
// (engine/runtime/batch_plan.h).
#include "engine/compiler/compiled_model_impl.h"

namespace numaserve::engine::internal {

void CompiledModelImpl::PlanInPlaceResiduals() {
  plan_.in_place_of.assign(graph_.num_values(), kNoValue);
  if (!options_.in_place_residuals) return;
  for (size_t k = 0; k < plan_.steps.size(); ++k) {
    // Conv's residual sum and MatMul's residual (or Gemm's C).
    const StepTraits& traits = plan_.steps[k]->traits();
    const ValueId residual = traits.residual_input;
    if (residual == kNoValue) continue;
    const ValueId source = traits.residual_source, d = traits.residual_output;
    const ValueId s = plan_.root[residual];
    if (plan_.root[d] != d || plan_.storage[s] != Storage::kArena ||
        plan_.storage[d] != Storage::kArena || plan_.internal[s] || plan_.internal[d] ||
        plan_.first_step[s] < 0 || plan_.first_step[d] < 0 ||
        plan_.last_step[s] != static_cast<int>(k) || plan_.root[source] == s ||
        plan_.shapes1[residual] != plan_.shapes1[d] || plan_.blocked[s] != plan_.blocked[d]) {
      continue;
    }
    plan_.in_place_of[d] = s;
    // The bytes now live until d's last reader: extend every owner's
    // lifetime along the chain (residual blocks chain through each other).
    for (ValueId t = s; t != kNoValue; t = plan_.in_place_of[t]) {
      plan_.last_step[t] = std::max(plan_.last_step[t], plan_.last_step[d]);
    }
  }
}

void CompiledModelImpl::PlanLifetimes(const std::vector<int>& producer,
                                      const std::vector<std::vector<int>>& consumers) {
  const int num_values = graph_.num_values();
  plan_.first_step.assign(num_values, -1);
  plan_.last_step.assign(num_values, -1);
  for (ValueId v = 0; v < num_values; ++v) {
    if (plan_.root[v] != v || plan_.storage[v] != Storage::kArena || producer[v] < 0) continue;
    plan_.first_step[v] = step_of_node_[producer[v]];
  }
  for (ValueId v = 0; v < num_values; ++v) {
    const ValueId r = plan_.root[v];
    if (plan_.storage[r] != Storage::kArena || plan_.first_step[r] < 0) continue;
    plan_.last_step[r] = std::max(plan_.last_step[r], plan_.first_step[r]);
    for (int c : consumers[v]) plan_.last_step[r] = std::max(plan_.last_step[r], step_of_node_[c]);
  }
  // A value that only the step producing it reads (a conv's output before
  // its fused BatchNormalization, activation or depthwise conv) is never
  // stored: it needs no space.
  plan_.internal.assign(num_values, false);
  std::vector<int> readers(num_values, 0), outside(num_values, 0);
  for (ValueId v = 0; v < num_values; ++v) {
    const ValueId r = plan_.root[v];
    if (plan_.storage[r] != Storage::kArena || plan_.first_step[r] < 0) continue;
    for (int c : consumers[v]) {
      ++readers[r];
      if (step_of_node_[c] != plan_.first_step[r]) ++outside[r];
    }
  }
  for (ValueId v = 0; v < num_values; ++v) {
    plan_.internal[v] = plan_.root[v] == v && plan_.storage[v] == Storage::kArena &&
                        plan_.first_step[v] >= 0 && readers[v] > 0 && outside[v] == 0;
  }
}

void CompiledModelImpl::ChooseBlockedLayout() {
  using Layout = CompileOptions::ActivationLayout;
  bool channels_last = options_.activation_layout == Layout::kChannelsLast;
  if (options_.activation_layout == Layout::kAuto) {
    // oneDNN 2.6's AMX convs (brgconv, INT8 and BF16) read and write only
    // channels-last; on channel-blocked tensors BF16 lands on the AVX512_BF16
    // kernels, which on AMX Xeons are no faster than FP32.
    const bool amx_bf16 =
        options_.precision == Precision::kBf16 && kernels::GetBf16Support().path == "amx_bf16";
    for (size_t i = 0; i < graph_.nodes().size(); ++i) {
      const bool conv = graph_.nodes()[i].op_type == "Conv";
      channels_last = channels_last || (conv && (int8_input_[i] || amx_bf16));
    }
  }
  plan_.blocked_layout = channels_last ? kernels::BlockedLayout::kChannelsLast
                                       : kernels::BlockedLayout::kChannelBlocked;
}

void CompiledModelImpl::ChooseLayouts(const std::vector<Shape>& shapes1) {
  const int num_values = graph_.num_values();
  plan_.blocked.assign(num_values, false);
  for (const auto& step : plan_.steps) {
    const ValueId v = step->traits().blocked_write;
    if (v != kNoValue && plan_.root[v] == v && plan_.storage[v] == Storage::kArena &&
        shapes1[v].size() >= 3 && shapes1[v].size() <= 5) {
      plan_.blocked[v] = true;
    }
  }
  for (ValueId v = 0; v < num_values; ++v) {
    if (plan_.root[v] != v) plan_.blocked[plan_.root[v]] = false;  // a view reads it plain
  }
  for (bool changed = true; changed;) {
    changed = false;
    auto unblock = [&](ValueId v) {
      if (v != kNoValue && plan_.blocked[v]) {
        plan_.blocked[v] = false;
        changed = true;
      }
    };
    for (const auto& step : plan_.steps) {
      const std::vector<ValueId>& ok = step->traits().blocked_reads;
      for (ValueId r : step->traits().reads) {
        if (r != kNoValue && std::find(ok.begin(), ok.end(), r) == ok.end()) unblock(r);
      }
    }
  }
  for (const auto& step : plan_.steps) step->SetLayouts(plan_.blocked);
}

// Roots produced by a step write straight into the caller's output buffer
// when exactly one graph output resolves to them; outputs that are views of
// inputs or constants, or that share a root, are copied at the end of Run.
void CompiledModelImpl::AssignStorage() {
  const int num_values = graph_.num_values();
  plan_.storage.assign(num_values, Storage::kArena);
  plan_.output_slot.assign(num_values, -1);
  for (ValueId v : graph_.inputs()) plan_.storage[v] = Storage::kInput;
  for (const auto& [v, c] : graph_.constants()) plan_.storage[v] = Storage::kConstant;
  std::vector<int> outputs_per_root(num_values, 0);
  for (ValueId v : graph_.outputs()) ++outputs_per_root[plan_.root[v]];
  for (size_t j = 0; j < graph_.outputs().size(); ++j) {
    const ValueId r = plan_.root[graph_.outputs()[j]];
    if (plan_.storage[r] == Storage::kArena && outputs_per_root[r] == 1) {
      plan_.storage[r] = Storage::kOutput;
      plan_.output_slot[r] = static_cast<int>(j);
    }
  }
}

}  // namespace numaserve::engine::internal
