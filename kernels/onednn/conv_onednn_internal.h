// Helpers shared by ConvOnednn's two files (conv_onednn.h):
// conv_onednn.cc (FP32/BF16) and conv_onednn_int8.cc (INT8). Internal to
// kernels/onednn/: nothing else includes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

namespace numaserve::kernels {

// Per spatial dim, v's value less `minus`, as oneDNN dims (0 for strides
// and pads; 1 for dilations: ONNX's 1 is oneDNN's 0).
inline dnnl::memory::dims ToDnnlDimsMinus(const std::vector<int64_t>& v, int64_t minus) {
  dnnl::memory::dims out;
  for (int64_t x : v) out.push_back(x - minus);
  return out;
}

// `bytes` rounded up to a multiple of 64: where the sections of a conv's
// reordering scratch start.
inline size_t Align64(size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace numaserve::kernels
