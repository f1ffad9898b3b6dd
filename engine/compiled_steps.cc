#include "engine/compiled_steps.h"

#include <cstring>

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

}  // namespace numaserve::engine
