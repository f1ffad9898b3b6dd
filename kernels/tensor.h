// A dense FP32 tensor: a shape and its row-major elements. Deliberately
// plain; it is what reference kernels and tests trade in. Fast paths work on
// raw pointers plus shapes instead.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace numaserve::kernels {

using Shape = std::vector<int64_t>;

// Product of the dimensions (1 for a scalar shape {}). Unchecked: for
// shapes already checked by NumElementsChecked (every shape the engine
// computes at load and at run time is).
int64_t NumElements(const Shape& shape);

// The most elements one tensor may have (2^31: 8 GiB of FP32). A model whose
// initializer, folded constant or computed value (at the batch being run)
// would hold more, or any single dim above it, is refused with the shape in
// the error instead of failing an allocation. It also bounds every dim, so
// the product or sum of two checked dims never overflows int64.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 31;

// a * b and a + b, or OUT_OF_RANGE when the result does not fit int64.
absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b);
absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b);

// Product of the dimensions, checked: INVALID_ARGUMENT for a negative dim,
// OUT_OF_RANGE when a dim or the product of the non-zero dims exceeds
// `max_elements`, with the shape in the message ("shape [1099511627776]
// exceeds the limit of 2147483648 elements per tensor"). Any product of the
// dims of a shape that passes fits int64.
absl::StatusOr<int64_t> NumElementsChecked(const Shape& shape,
                                           int64_t max_elements = kMaxTensorElements);

// NumElementsChecked times `element_bytes`, checked the same way.
absl::StatusOr<int64_t> ByteSizeChecked(const Shape& shape, int64_t element_bytes,
                                        int64_t max_elements = kMaxTensorElements);

// "[2,3,4]"; "[]" for a scalar.
std::string ShapeToString(const Shape& shape);

// Row-major strides in elements.
std::vector<int64_t> RowMajorStrides(const Shape& shape);

struct Tensor {
  Shape shape;
  std::vector<float> data;

  Tensor() = default;
  explicit Tensor(Shape s) : shape(std::move(s)), data(NumElements(shape), 0.0f) {}
  Tensor(Shape s, std::vector<float> values) : shape(std::move(s)), data(std::move(values)) {}

  int64_t size() const { return static_cast<int64_t>(data.size()); }
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
};

}  // namespace numaserve::kernels
