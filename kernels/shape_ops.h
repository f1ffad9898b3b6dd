// Shape arithmetic shared by reference kernels, the engine's shape
// propagation and the fast path: numpy broadcasting, Flatten and Reshape.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace numaserve::kernels {

// Numpy-style broadcast of two shapes (right-aligned; dims equal or 1).
absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b);

// `shape` left-padded with 1s to `rank` dims (rank >= shape.size()).
Shape PadShapeLeft(const Shape& shape, size_t rank);

// ONNX Flatten: [prod(dims[:axis]), prod(dims[axis:])]; axis may be negative.
absl::StatusOr<Shape> FlattenShape(const Shape& input, int64_t axis);

// ONNX Reshape's target: 0 copies the input dim (unless allowzero), -1 is
// inferred from the element count (at most one).
absl::StatusOr<Shape> ReshapeShape(const Shape& input, const std::vector<int64_t>& target,
                                   bool allowzero);

// Normalizes a possibly negative axis into [0, rank).
absl::StatusOr<int64_t> NormalizeAxis(int64_t axis, int64_t rank);

}  // namespace numaserve::kernels
