// ONNX Softmax on oneDNN's softmax_forward, one primitive per input shape
// (the kShapeCacheCapacity most recently run kept).
#pragma once

#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/bounded_cache.h"
#include "kernels/onednn/onednn_common.h"

namespace numaserve::kernels {

class SoftmaxOnednn {
 public:
  // axis may be negative. flatten_to_2d selects opset < 13 semantics (the
  // input viewed as [prod(dims[:axis]), prod(dims[axis:])]).
  SoftmaxOnednn(const dnnl::engine& engine, int64_t axis, bool flatten_to_2d)
      : engine_(engine), axis_(axis), flatten_to_2d_(flatten_to_2d) {}

  absl::Status Execute(dnnl::stream& stream, const Shape& shape, const float* src, float* dst);
  // oneDNN's implementation for this shape ("" before its first run).
  std::string ImplementationName(const Shape& shape) const;
  // Shapes whose primitive is kept.
  size_t cached_shapes() const { return per_shape_.size(); }

 private:
  dnnl::engine engine_;
  int64_t axis_;
  bool flatten_to_2d_;
  BoundedCache<Shape, BoundPrimitive> per_shape_{kShapeCacheCapacity};
};

}  // namespace numaserve::kernels
