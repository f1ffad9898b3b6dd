#include "engine/compiled_steps.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/ref/add_ref.h"

namespace numaserve::engine {
namespace {

int64_t RowsOf(const Shape& dst, int64_t n) { return kernels::NumElements(dst) / n; }

}  // namespace

absl::Status MatMulStep::Prepare(const std::vector<Shape>& shapes) {
  return kernel_->Prepare(RowsOf(shapes[dst_], kernel_->n()));
}

absl::Status MatMulStep::Run(const StepContext& ctx) {
  const int64_t m = RowsOf(ctx.shapes[dst_], kernel_->n());
  float* dst = ctx.data[dst_];
  if (accumulate_from_ != kNoValue) {
    // Gemm's C goes into the output first; the matmul adds beta * it.
    const Shape& c_shape = ctx.shapes[accumulate_from_];
    if (kernels::NumElements(c_shape) == m * kernel_->n()) {
      std::memcpy(dst, ctx.data[accumulate_from_], m * kernel_->n() * sizeof(float));
    } else {
      kernels::BroadcastTo(ctx.data[accumulate_from_], c_shape, dst, {m, kernel_->n()});
    }
  }
  return kernel_->Execute(ctx.stream, m, ctx.data[src_], dst);
}

absl::Status AddStep::Run(const StepContext& ctx) {
  return kernel_.Execute(ctx.stream, ctx.shapes[a_], ctx.data[a_], ctx.shapes[b_], ctx.data[b_],
                         ctx.shapes[dst_], ctx.data[dst_]);
}

absl::Status ReluStep::Run(const StepContext& ctx) {
  return kernel_.Execute(ctx.stream, kernels::NumElements(ctx.shapes[dst_]), ctx.data[src_],
                         ctx.data[dst_]);
}

absl::Status SoftmaxStep::Run(const StepContext& ctx) {
  return kernel_.Execute(ctx.stream, ctx.shapes[src_], ctx.data[src_], ctx.data[dst_]);
}

absl::Status ReferenceStep::Run(const StepContext& ctx) {
  const Node& node = graph_->nodes()[node_index_];
  inputs_.resize(node.inputs.size());
  std::vector<const kernels::Tensor*> in(node.inputs.size(), nullptr);
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ValueId v = node.inputs[i];
    if (v == kNoValue) continue;
    if (const Constant* c = graph_->FindConstant(v); c != nullptr) {
      if (c->f32.shape == c->shape) in[i] = &c->f32;
      continue;
    }
    const int64_t count = kernels::NumElements(ctx.shapes[v]);
    inputs_[i].shape = ctx.shapes[v];
    inputs_[i].data.assign(ctx.data[v], ctx.data[v] + count);
    in[i] = &inputs_[i];
  }
  auto out = schema_->reference(*graph_, node, in);
  if (!out.ok()) return out.status();
  for (size_t j = 0; j < node.outputs.size() && j < out->size(); ++j) {
    const ValueId v = node.outputs[j];
    const int64_t count = kernels::NumElements(ctx.shapes[v]);
    if ((*out)[j].size() != count) {
      return absl::InternalError(absl::StrCat(node.Describe(), ": output ", j, " has ",
                                              (*out)[j].size(), " elements, planned ", count));
    }
    std::memcpy(ctx.data[v], (*out)[j].data.data(), count * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace numaserve::engine
