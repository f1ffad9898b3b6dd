// Scalar references for data-movement ops: Transpose, Concat, Split, Slice,
// Gather, Pad, Expand, Tile, Resize, and broadcasting batched MatMul.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace numaserve::kernels {

Tensor TransposeRef(const Tensor& x, const std::vector<int64_t>& perm);

// Concatenates along `axis` (normalised); all other dims must match.
Tensor ConcatRef(const std::vector<const Tensor*>& inputs, int64_t axis);

// Splits along `axis` (normalised) into pieces of the given sizes.
std::vector<Tensor> SplitRef(const Tensor& x, int64_t axis, const std::vector<int64_t>& sizes);

// Per-dim start and step for every dim of the output (out_shape given).
Tensor StridedSliceRef(const Tensor& x, const std::vector<int64_t>& starts,
                       const std::vector<int64_t>& steps, const Shape& out_shape);

// ONNX Gather: indices already normalised to [0, dim).
Tensor GatherRef(const Tensor& x, int64_t axis, const std::vector<int64_t>& indices,
                 const Shape& indices_shape);

enum class PadMode { kConstant, kReflect, kEdge };
// pads: begin for every dim, then end for every dim (may be negative).
absl::StatusOr<Tensor> PadRef(const Tensor& x, const std::vector<int64_t>& pads, PadMode mode,
                              float value);

Tensor ExpandRef(const Tensor& x, const Shape& out_shape);
Tensor TileRef(const Tensor& x, const std::vector<int64_t>& repeats);

struct ResizeParams {
  std::string mode = "nearest";  // nearest | linear | cubic
  std::string coordinate_transformation_mode = "half_pixel";
  std::string nearest_mode = "round_prefer_floor";
  std::vector<float> scales;  // per dim, out/in
  float cubic_coeff_a = -0.75f;
  bool exclude_outside = false;  // drop taps outside the input, renormalise the rest
  // linear, cubic: where a dim shrinks (scale < 1), stretch the filter by
  // 1 / scale so that every input point within its reach contributes.
  bool antialias = false;
  // tf_crop_and_resize: the region of interest, starts for every dim then
  // ends (normalised to [0, 1]), and the value of output points whose
  // source lies outside the input.
  std::vector<float> roi;
  float extrapolation_value = 0.0f;
};
// ONNX Resize of x to out_shape (one dim at a time). INVALID_ARGUMENT where
// the output dims, scales or roi do not match x's rank, where a non-empty
// output is asked of an empty input, or where an antialiased scale is far
// below what gives a non-empty output.
absl::StatusOr<Tensor> ResizeRef(const Tensor& x, const ResizeParams& p, const Shape& out_shape);

// ONNX MatMul with numpy broadcasting of the batch dims (1-D operands are
// promoted and the promoted dim removed, as numpy.matmul).
absl::StatusOr<Tensor> BatchedMatMulRef(const Tensor& a, const Tensor& b);

// MatMul's output shape for the given operand shapes.
absl::StatusOr<Shape> MatMulShape(const Shape& a, const Shape& b);

}  // namespace numaserve::kernels
