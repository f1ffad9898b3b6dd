// The quantized operands of an INT8 conv (ConvOnednnOptions::int8) or GEMM
// (GemmOptions::int8), in ONNX QDQ semantics:
//   x ~ (q_x - src_zero_point) * src_scale, q_x uint8: the kernel quantizes
//       its FP32 input as q_x = saturate_0_255(nearbyint(x * (1 / src_scale))
//       + src_zero_point), rounding half to even (oneDNN's reorder; it
//       multiplies by the reciprocal, which may differ from ONNX's x / scale
//       by one unit in the last place, so at an exact tie once in a while)
//   w = q_w * weight_scales[c]: symmetric int8, c the output channel (conv:
//       M; gemm: the column n of W[K,N]), or one scale for all
// The kernel's output is FP32: the FP32 op on the dequantized x and w (bias,
// residual and activations in FP32), up to float rounding.
#pragma once

#include <cstdint>
#include <vector>

namespace numaserve::kernels {

struct Int8Params {
  // Finite and nonzero.
  float src_scale = 1.0f;
  int32_t src_zero_point = 0;  // 0..255
  // 1 value, or one per output channel (conv: M; gemm: N); finite, nonzero.
  std::vector<float> weight_scales;
  // Int8 weights in the layout the FP32 weights would have; the kernel
  // keeps or packs them at creation.
  std::vector<int8_t> weights;
};

}  // namespace numaserve::kernels
