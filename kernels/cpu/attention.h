// numaserve's own scaled dot-product attention for one head, fused:
//   out[i, :] = sum_j softmax_j(alpha * q[i, :] . k[j, :]) * v[j, :]
// The scores of a block of queries live in a scratch buffer that stays in
// L1/L2 between the two products and the softmax, where the unfused graph
// (MatMul, Mul, Softmax, MatMul) writes and reads them whole, once per op.
// One implementation per ISA tier as in row_kernels.h: the *_scalar one is
// the reference, *_avx2 and *_avx512 live in the files compiled with those
// flags (row_kernels_avx2.cc, row_kernels_avx512.cc).
#pragma once

#include <cstdint>

namespace numaserve::kernels::cpu {

// One head's operands, addressed through strides (in floats) so that the
// [B, S, H, D] tensors of a transformer are read in place, without the
// [B, H, S, D] copies:
//   q(i, c) = q[i * q_row + c * q_col]   i < sq, c < d
//   k(j, c) = k[j * k_row + c * k_col]   j < sk, c < d
//   v(j, c) = v[j * v_row + c]           j < sk, c < dv
//   out(i, c) = out[i * out_row + c]     i < sq, c < dv
struct AttentionHead {
  const float* q = nullptr;
  int64_t q_row = 0, q_col = 1;
  const float* k = nullptr;
  int64_t k_row = 0, k_col = 1;
  const float* v = nullptr;
  int64_t v_row = 0;
  float* out = nullptr;
  int64_t out_row = 0;
  int64_t sq = 0, sk = 0, d = 0, dv = 0;
  float alpha = 1.0f;
};

// Queries handled per block: the block's scores (kAttentionBlockRows x sk
// floats) are what the scratch holds besides k transposed.
constexpr int64_t kAttentionBlockRows = 24;

// Floats of scratch one call needs (k transposed, one block of scores and
// the block's softmax sums).
inline int64_t AttentionScratchFloats(int64_t sk, int64_t d) {
  return d * sk + kAttentionBlockRows * sk + kAttentionBlockRows;
}

// `scratch` holds AttentionScratchFloats(h.sk, h.d) floats; the output may
// not overlap the inputs. sk >= 1.
void attention_head_scalar(const AttentionHead& h, float* scratch);
void attention_head_avx2(const AttentionHead& h, float* scratch);
void attention_head_avx512(const AttentionHead& h, float* scratch);

}  // namespace numaserve::kernels::cpu
