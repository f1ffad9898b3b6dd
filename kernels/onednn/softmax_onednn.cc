#include "kernels/onednn/softmax_onednn.h"

#include <algorithm>

#include "kernels/shape_ops.h"

namespace numaserve::kernels {

absl::Status SoftmaxOnednn::Execute(dnnl::stream& stream, const Shape& shape, const float* src,
                                    float* dst) {
  BoundPrimitive* call = per_shape_.Find(shape);
  if (call == nullptr) {
    auto axis = NormalizeAxis(axis_, std::max<int64_t>(static_cast<int64_t>(shape.size()), 1));
    if (!axis.ok()) return axis.status();
    // Viewed as [outer, len, inner]; inner is 1 when flattening.
    int64_t outer = 1, len = 1, inner = 1;
    for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
      if (i < *axis) {
        outer *= shape[i];
      } else if (i == *axis || flatten_to_2d_) {
        len *= shape[i];
      } else {
        inner *= shape[i];
      }
    }
    try {
      dnnl::memory::desc md({outer, len, inner}, dnnl::memory::data_type::f32,
                            dnnl::memory::format_tag::abc);
      dnnl::softmax_forward::primitive_desc pd(engine_, dnnl::prop_kind::forward_inference,
                                               dnnl::algorithm::softmax_accurate, md, md, 1);
      BoundPrimitive created;
      created.primitive = dnnl::softmax_forward(pd);
      created.args[DNNL_ARG_SRC] = UnboundMemory(md, engine_);
      created.args[DNNL_ARG_DST] = UnboundMemory(md, engine_);
      call = &per_shape_.Emplace(shape, std::move(created));
    } catch (const dnnl::error& e) {
      return DnnlErrorToStatus(e, "creating softmax for " + ShapeToString(shape));
    }
  }
  try {
    call->SetHandle(DNNL_ARG_SRC, src);
    call->SetHandle(DNNL_ARG_DST, dst);
    call->Execute(stream);
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, "executing softmax");
  }
  return absl::OkStatus();
}

std::string SoftmaxOnednn::ImplementationName(const Shape& shape) const {
  const BoundPrimitive* call = per_shape_.Peek(shape);
  return call == nullptr ? "" : call->ImplementationName();
}

}  // namespace numaserve::kernels
