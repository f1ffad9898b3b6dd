// Elementwise ops on oneDNN: broadcasting Add (binary_add) and the eltwise
// algorithms (Relu, SiLU, HardSwish, ...), one primitive per shape (the kShapeCacheCapacity most
// recently run kept, others created again when they come back).
#pragma once

#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>

#include "absl/status/statusor.h"
#include "kernels/bounded_cache.h"
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
  // Shape pairs whose primitive is kept.
  size_t cached_shapes() const { return per_shape_.size(); }

 private:
  struct Entry {
    bool swapped = false;
    bool use_loop = false;
    BoundPrimitive call;
  };
  // Valid until the next entry is created.
  absl::StatusOr<Entry*> GetEntry(const Shape& a_shape, const Shape& b_shape,
                                  const Shape& out_shape);

  dnnl::engine engine_;
  // Keyed by a's shape and b's, looked up through std::tie: neither copied.
  BoundedCache<std::tuple<Shape, Shape>, Entry> per_shape_{kShapeCacheCapacity};
};

// One oneDNN eltwise algorithm (with its alpha and beta) over `count`
// contiguous floats: a plain tensor, or a blocked one with its channel
// padding (which stays zero where the function maps 0 to 0).
class EltwiseOnednn {
 public:
  EltwiseOnednn(const dnnl::engine& engine, dnnl::algorithm algorithm, float alpha, float beta)
      : engine_(engine), algorithm_(algorithm), alpha_(alpha), beta_(beta) {}

  // src and dst may be the same buffer.
  absl::Status Execute(dnnl::stream& stream, int64_t count, const float* src, float* dst);
  std::string ImplementationName(int64_t count) const;
  // Element counts whose primitive is kept.
  size_t cached_shapes() const { return per_count_.size(); }

 private:
  dnnl::engine engine_;
  dnnl::algorithm algorithm_;
  float alpha_, beta_;
  BoundedCache<int64_t, BoundPrimitive> per_count_{kShapeCacheCapacity};
};

class ReluOnednn : public EltwiseOnednn {
 public:
  explicit ReluOnednn(const dnnl::engine& engine)
      : EltwiseOnednn(engine, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f) {}
};

}  // namespace numaserve::kernels
