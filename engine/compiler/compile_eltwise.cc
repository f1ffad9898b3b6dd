// CompiledModelImpl (compiled_model_impl.h): gated activations (SiLU as
// x * Sigmoid(x), HardSwish as x * HardSigmoid(x)), Sigmoid, HardSigmoid and
// HardSwish as oneDNN eltwise steps, and the per-channel Mul of a
// squeeze-excitation block, each in the layout of the convs around it
// (eltwise_steps.h).
#include "engine/compiler/compiled_model_impl.h"

namespace numaserve::engine::internal {

std::optional<CompiledModelImpl::GatedActivation> CompiledModelImpl::GatedActivationAt(
    int gate, const std::vector<std::vector<int>>& consumers) const {
  using dnnl::algorithm;
  const Node& g = graph_.nodes()[gate];
  if ((g.op_type != "Sigmoid" && g.op_type != "HardSigmoid") || g.inputs.size() != 1 ||
      g.outputs.size() != 1) {
    return std::nullopt;
  }
  const ValueId x = g.inputs[0], gated = g.outputs[0];
  if (x == kNoValue || graph_.IsConstant(x) || is_output_[gated] || consumers[gated].size() != 1) {
    return std::nullopt;
  }
  const int mul = consumers[gated][0];
  const Node& m = graph_.nodes()[mul];
  const bool pair =
      m.op_type == "Mul" && m.inputs.size() == 2 && m.outputs.size() == 1 &&
      ((m.inputs[0] == x && m.inputs[1] == gated) || (m.inputs[0] == gated && m.inputs[1] == x));
  if (!pair) return std::nullopt;
  if (g.op_type == "Sigmoid") return GatedActivation{gate, mul, {algorithm::eltwise_swish, 1.0f}};
  // x * max(0, min(1, alpha * x + beta)): oneDNN 3's hardswish with the
  // HardSigmoid's alpha and beta.
  return GatedActivation{
      gate,
      mul,
      {algorithm::eltwise_hardswish, g.GetFloat("alpha", 0.2f), g.GetFloat("beta", 0.5f)}};
}

std::optional<CompiledModelImpl::GatedActivation> CompiledModelImpl::GatedActivationOf(
    ValueId value, const std::vector<std::vector<int>>& consumers) const {
  if (is_output_[value] || consumers[value].size() != 2) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    const int gate = consumers[value][k];
    const std::optional<GatedActivation> found = GatedActivationAt(gate, consumers);
    if (found.has_value() && found->mul == consumers[value][1 - k]) return found;
  }
  return std::nullopt;
}

absl::StatusOr<bool> CompiledModelImpl::LowerGate(const LowerContext& c) {
  const Node& node = graph_.nodes()[c.node_index];
  if (node.inputs.size() != 1 || node.outputs.size() != 1) return false;
  ValueId out = node.outputs[0];
  std::string name = node.name;
  std::optional<kernels::EltwisePostOp> op = ActivationPostOp(graph_, node);
  if (!op.has_value()) return false;
  // x * gate(x): one step, the gate's output never stored.
  if (const auto gated = GatedActivationAt(c.node_index, c.consumers);
      gated.has_value() && !c.fused[gated->mul]) {
    op = gated->op;
    c.fused[gated->mul] = true;
    out = graph_.nodes()[gated->mul].outputs[0];
    absl::StrAppend(&name, "+", graph_.nodes()[gated->mul].name);
  }
  // swish and hardswish map 0 to 0 (a blocked tensor's padding stays 0);
  // logistic and hardsigmoid do not, and run on plain tensors.
  const bool zero_preserving = op->algorithm == dnnl::algorithm::eltwise_swish ||
                               op->algorithm == dnnl::algorithm::eltwise_hardswish;
  plan_.steps.push_back(std::make_unique<EltwiseStep>(
      engine_, plan_.blocked_layout, *op, zero_preserving, node.inputs[0], out, std::move(name)));
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerMul(const LowerContext& c) {
  const Node& node = graph_.nodes()[c.node_index];
  if (node.inputs.size() != 2 || node.outputs.size() != 1) return false;
  const ValueId out = node.outputs[0];
  // The shapes at the second probe (batch 2, other dynamic dims at 96): the
  // scale must fit there too (a scale whose rows follow the batch while x's
  // stay 1 would broadcast x instead).
  if (!polymorphic_ && !shapes2_.has_value()) {
    auto at2 = PropagateShapes(graph_, ProbeInputShapes(graph_, 1));
    shapes2_ = at2.ok() ? *std::move(at2) : std::vector<Shape>();
  }
  const std::vector<Shape>& shapes2 = polymorphic_ ? probe2_ : *shapes2_;
  if (shapes2.empty()) return false;
  for (int k = 0; k < 2; ++k) {
    const ValueId x = node.inputs[k], scale = node.inputs[1 - k];
    if (x == kNoValue || scale == kNoValue || c.shapes1[x] != c.shapes1[out] ||
        shapes2[x] != shapes2[out]) {
      continue;
    }
    if (!ChannelScaleStep::Fits(c.shapes1[x], c.shapes1[scale]) ||
        !ChannelScaleStep::Fits(shapes2[x], shapes2[scale])) {
      continue;
    }
    plan_.steps.push_back(std::make_unique<ChannelScaleStep>(engine_, plan_.blocked_layout, x,
                                                             scale, out, node.name));
    return true;
  }
  return false;
}

}  // namespace numaserve::engine::internal
