// Elementwise ops on oneDNN: broadcasting Add (binary_add) and Relu
// (eltwise_relu), one primitive per shape.
#pragma once

#include <map>
#include <oneapi/dnnl/dnnl.hpp>

#include "absl/status/statusor.h"
#include "kernels/onednn/onednn_common.h"

namespace numaserve::kernels {

class AddOnednn {
 public:
  explicit AddOnednn(const dnnl::engine& engine) : engine_(engine) {}

  // out = a + b, numpy broadcasting; out_shape is the broadcast shape.
  // oneDNN broadcasts only its second source, so the operands are swapped
  // when a is the broadcast one; when both are, a plain loop runs instead.
  absl::Status Execute(dnnl::stream& stream, const Shape& a_shape, const float* a,
                       const Shape& b_shape, const float* b, const Shape& out_shape, float* out);
  // oneDNN's implementation for these shapes, "loop" where both operands
  // broadcast ("" before their first run).
  std::string ImplementationName(const Shape& a_shape, const Shape& b_shape) const;

 private:
  struct Entry {
    bool swapped = false;
    bool use_loop = false;
    BoundPrimitive call;
  };
  absl::StatusOr<Entry*> GetEntry(const Shape& a_shape, const Shape& b_shape,
                                  const Shape& out_shape);

  dnnl::engine engine_;
  // Keyed by a's shape, then b's: looked up without copying either.
  std::map<Shape, std::map<Shape, Entry>> per_shape_;
};

class ReluOnednn {
 public:
  explicit ReluOnednn(const dnnl::engine& engine) : engine_(engine) {}

  absl::Status Execute(dnnl::stream& stream, int64_t count, const float* src, float* dst);
  std::string ImplementationName(int64_t count) const;

 private:
  dnnl::engine engine_;
  std::map<int64_t, BoundPrimitive> per_count_;
};

}  // namespace numaserve::kernels
