// numaserve's own Winograd convolution, F(4x4, 3x3) (Lavin and Gray, 2016),
// for the AVX2 tier, where oneDNN has no Winograd kernel (2.6's were
// AVX-512 only; 3.7 has none on CPUs): 3x3, stride-1, undilated, ungrouped 2D convs between
// nChw8c activations whose channel counts are multiples of 8.
//
// Each 4x4 tile of the output comes from a 6x6 tile of the input: the input
// tile is transformed (B^T d B), multiplied channel by channel with the
// transformed weights (G g G^T) as 36 GEMMs of [tiles x C] x [C x K], one
// per point of the 6x6 tile, and the products are transformed back
// (A^T m A). That is 36 multiply-adds per 16 outputs and input channel
// against the direct conv's 144 (4x fewer), less the transforms and the
// part of the edge tiles that falls outside the output. The points are
// 0, +-1, +-2 and infinity; the result differs from the direct conv's by
// rounding only (about 1e-5 of the output's scale, growing with C).
//
// The work is split into chunks of tiles, one chunk per OpenMP thread at a
// time; a chunk's transformed input and products stay in the thread's part
// of the caller's scratch (cache-resident for small C), so the only shared
// data are the input, the output and the transformed weights.
#pragma once

#include <cstdint>
#include <vector>

namespace numaserve::kernels::cpu {

struct WinogradConvShape {
  int64_t batch = 0;
  int64_t in_channels = 0;   // C, a multiple of 8
  int64_t out_channels = 0;  // K, a multiple of 8
  int64_t in_h = 0, in_w = 0;
  int64_t out_h = 0, out_w = 0;  // in + pads - 2 (stride 1)
  int64_t pad_top = 0, pad_left = 0;
};

// Output tiles of 4x4 pixels over the whole batch.
int64_t WinogradF4x3Tiles(const WinogradConvShape& s);

// The weights G g G^T, computed once in double precision and packed for
// the kernel's GEMMs: [36][Kp / 16][C][16], K padded with zeros to Kp (a
// multiple of 16). 4 x the direct weights' size.
struct WinogradF4x3Weights {
  int64_t in_channels = 0, out_channels = 0, padded_out_channels = 0;
  std::vector<float> packed;
};

// `weights`: [K][C][3][3] row-major (ONNX's Conv weights).
WinogradF4x3Weights TransformWinogradF4x3Weights(const float* weights, int64_t out_channels,
                                                 int64_t in_channels);

// What follows the conv, in oneDNN's post-op order: + bias[k] (null: none),
// + dst's value on entry (sum: a residual), then ReLU, then a fake-quantize
// (a QuantizeLinear -> DequantizeLinear pair run in FP32): y = scale *
// min(max(round(y * inverse_scale), lo), hi), rounding half to even, as
// oneDNN's linear, round, clip and pow(scale, 1) post-ops compute it.
struct WinogradFakeQuantize {
  float inverse_scale = 1.0f;
  float lo = 0.0f, hi = 0.0f;  // the integer range less the zero point
  float scale = 1.0f;
};
struct WinogradEpilogue {
  const float* bias = nullptr;
  bool sum = false;
  bool relu = false;
  const WinogradFakeQuantize* fake_quantize = nullptr;  // null: none
};

// How the conv's tiles are split over the calling thread's OpenMP team
// (all of it, or one thread inside a parallel region) and the scratch that
// takes: a chunk of tiles per thread in buffers of its own, or, with fewer
// than 16 tiles per thread, chunks the team shares.
struct WinogradF4x3Plan {
  int64_t threads = 1;
  bool per_thread = true;
  int64_t chunk_tiles = 0;     // tiles per chunk
  int64_t scratch_floats = 0;  // 64-byte aligned scratch the conv needs
};
WinogradF4x3Plan PlanWinogradF4x3(const WinogradF4x3Weights& w, const WinogradConvShape& s);

// dst[N][K/8][OH][OW][8] = conv(src[N][C/8][H][W][8]), zero padding beyond
// the input's edges, as `plan` (PlanWinogradF4x3 on this thread, for this
// shape) says, in `scratch` (plan.scratch_floats). `w` must have been
// transformed for s.in_channels and s.out_channels. Call only on a CPU with
// AVX2 and FMA (kernels/dispatch.h).
void winograd_f4x3_conv_avx2(const WinogradF4x3Weights& w, const WinogradConvShape& s,
                             const WinogradF4x3Plan& plan, const WinogradEpilogue& epilogue,
                             const float* src, float* dst, float* scratch);

}  // namespace numaserve::kernels::cpu
