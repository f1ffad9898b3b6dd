#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/row_kernels.h"

namespace numaserve::kernels::cpu {

void softmax_rows_scalar(const float* x, float* y, int64_t rows, int64_t len) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * len;
    float* yr = y + r * len;
    float max_v = -INFINITY;
    for (int64_t i = 0; i < len; ++i) max_v = std::max(max_v, xr[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < len; ++i) {
      yr[i] = std::exp(xr[i] - max_v);
      sum += yr[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < len; ++i) yr[i] *= inv;
  }
}

void layer_norm_rows_scalar(const float* x, const float* scale, const float* bias, float eps,
                            float* y, int64_t rows, int64_t len) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * len;
    float* yr = y + r * len;
    float sum = 0.0f;
    for (int64_t i = 0; i < len; ++i) sum += xr[i];
    const float mean = sum / len;
    float sq = 0.0f;
    for (int64_t i = 0; i < len; ++i) sq += (xr[i] - mean) * (xr[i] - mean);
    const float inv = 1.0f / std::sqrt(sq / len + eps);
    for (int64_t i = 0; i < len; ++i) yr[i] = (xr[i] - mean) * inv * scale[i] + bias[i];
  }
}

void add_row_broadcast_scalar(const float* x, const float* v, float* y, int64_t rows, int64_t len) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < len; ++i) y[r * len + i] = x[r * len + i] + v[i];
  }
}

void bias_activation_rows_scalar(float* y, const float* bias, int64_t rows, int64_t len,
                                 RowActivation act) {
  constexpr float kInvSqrt2 = 0.70710678118654752f;
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * len;
    for (int64_t i = 0; i < len; ++i) {
      float v = yr[i] + (bias != nullptr ? bias[i] : 0.0f);
      if (act == RowActivation::kRelu) v = std::max(v, 0.0f);
      if (act == RowActivation::kGeluErf) v = 0.5f * v * (1.0f + std::erf(v * kInvSqrt2));
      yr[i] = v;
    }
  }
}

void mul_row_broadcast_scalar(const float* x, const float* v, float* y, int64_t rows, int64_t len) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < len; ++i) y[r * len + i] = x[r * len + i] * v[i];
  }
}

void reduce_rows_scalar(const float* x, float* out, int64_t rows, int64_t len, ReduceOp op) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * len;
    float acc = op == ReduceOp::kSum ? 0.0f : xr[0];
    for (int64_t i = 0; i < len; ++i) {
      if (op == ReduceOp::kSum) {
        acc += xr[i];
      } else if (op == ReduceOp::kMax) {
        acc = std::max(acc, xr[i]);
      } else {
        acc = std::min(acc, xr[i]);
      }
    }
    out[r] = acc;
  }
}

void transpose_2d_scalar(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols) {
  for (int64_t b = 0; b < batch; ++b) {
    const float* xb = x + b * rows * cols;
    float* yb = y + b * rows * cols;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) yb[c * rows + r] = xb[r * cols + c];
    }
  }
}

// One query at a time: its scores in scratch, softmax, then the weighted
// sum of v's rows.
void attention_head_scalar(const AttentionHead& h, float* scratch) {
  float* s = scratch;
  for (int64_t i = 0; i < h.sq; ++i) {
    const float* qi = h.q + i * h.q_row;
    float max_v = -INFINITY;
    for (int64_t j = 0; j < h.sk; ++j) {
      const float* kj = h.k + j * h.k_row;
      float dot = 0.0f;
      for (int64_t c = 0; c < h.d; ++c) dot += qi[c * h.q_col] * kj[c * h.k_col];
      s[j] = h.alpha * dot;
      max_v = std::max(max_v, s[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < h.sk; ++j) {
      s[j] = std::exp(s[j] - max_v);
      sum += s[j];
    }
    float* oi = h.out + i * h.out_row;
    for (int64_t c = 0; c < h.dv; ++c) oi[c] = 0.0f;
    for (int64_t j = 0; j < h.sk; ++j) {
      const float p = s[j] / sum;
      const float* vj = h.v + j * h.v_row;
      for (int64_t c = 0; c < h.dv; ++c) oi[c] += p * vj[c];
    }
  }
}

}  // namespace numaserve::kernels::cpu
