// A dense FP32 tensor: a shape and its row-major elements. Deliberately
// plain; it is what reference kernels and tests trade in. Fast paths work on
// raw pointers plus shapes instead.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace numaserve::kernels {

using Shape = std::vector<int64_t>;

// Product of the dimensions (1 for a scalar shape {}).
int64_t NumElements(const Shape& shape);

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
