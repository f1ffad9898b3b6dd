#include "kernels/onednn/pool_onednn.h"

#include "absl/strings/str_cat.h"
#include "kernels/onednn/conv_onednn.h"

namespace numaserve::kernels {

absl::Status PoolOnednn::Execute(dnnl::stream& stream, const Shape& src_shape,
                                 const Shape& dst_shape, const float* src, float* dst,
                                 bool src_blocked, bool dst_blocked) {
  const bool blocked = src_blocked;
  float* out = dst;
  if (src_blocked != dst_blocked) {
    scratch_.resize(ActivationBytes(dst_shape, src_blocked) / sizeof(float));
    out = scratch_.data();
    if (reorder_ == nullptr) reorder_ = std::make_unique<ActivationReorder>(engine_);
  }
  auto it = per_shape_.find(src_shape);
  if (it == per_shape_.end()) {
    WindowParams w = window_;
    const size_t spatial = src_shape.size() - 2;
    if (global_) {
      w.kernel.assign(src_shape.begin() + 2, src_shape.end());
      w.strides.assign(spatial, 1);
      w.dilations.assign(spatial, 1);
      w.pads_begin.assign(spatial, 0);
      w.pads_end.assign(spatial, 0);
    }
    dnnl::memory::dims strides, kernel, dilation, pl, pr;
    for (size_t d = 0; d < spatial; ++d) {
      strides.push_back(w.strides[d]);
      kernel.push_back(w.kernel[d]);
      dilation.push_back(w.dilations[d] - 1);
      pl.push_back(w.pads_begin[d]);
      // End padding that makes oneDNN's floor formula give dst's extent.
      const int64_t eff = (w.kernel[d] - 1) * w.dilations[d] + 1;
      pr.push_back((dst_shape[d + 2] - 1) * w.strides[d] + eff - src_shape[d + 2] -
                   w.pads_begin[d]);
    }
    BoundPrimitive call;
    try {
      dnnl::pooling_v2_forward::desc desc(
          dnnl::prop_kind::forward_inference, algorithm_, ActivationDesc(src_shape, blocked),
          ActivationDesc(dst_shape, blocked), strides, kernel, dilation, pl, pr);
      dnnl::pooling_v2_forward::primitive_desc pd(desc, engine_);
      call.primitive = dnnl::pooling_v2_forward(pd);
      call.args[DNNL_ARG_SRC] = UnboundMemory(pd.src_desc(), engine_);
      call.args[DNNL_ARG_DST] = UnboundMemory(pd.dst_desc(), engine_);
    } catch (const dnnl::error& e) {
      return DnnlErrorToStatus(e, absl::StrCat("creating pooling for ", ShapeToString(src_shape)));
    }
    it = per_shape_.emplace(src_shape, std::move(call)).first;
  }
  try {
    it->second.SetHandle(DNNL_ARG_SRC, src);
    it->second.SetHandle(DNNL_ARG_DST, out);
    it->second.Execute(stream);
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, "executing pooling");
  }
  if (out != dst) return reorder_->Execute(stream, dst_shape, out, src_blocked, dst, dst_blocked);
  return absl::OkStatus();
}

}  // namespace numaserve::kernels
