#include <algorithm>
#include <cmath>

#include "kernels/cpu/row_kernels.h"

namespace numaserve::kernels::cpu {

void softmax_rows__scalar(const float* x, float* y, int64_t rows, int64_t len) {
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

void layer_norm_rows__scalar(const float* x, const float* scale, const float* bias, float eps,
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

void add_row_broadcast__scalar(const float* x, const float* v, float* y, int64_t rows,
                               int64_t len) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < len; ++i) y[r * len + i] = x[r * len + i] + v[i];
  }
}

void mul_row_broadcast__scalar(const float* x, const float* v, float* y, int64_t rows,
                               int64_t len) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < len; ++i) y[r * len + i] = x[r * len + i] * v[i];
  }
}

void reduce_rows__scalar(const float* x, float* out, int64_t rows, int64_t len, ReduceOp op) {
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

void transpose_2d__scalar(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols) {
  for (int64_t b = 0; b < batch; ++b) {
    const float* xb = x + b * rows * cols;
    float* yb = y + b * rows * cols;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) yb[c * rows + r] = xb[r * cols + c];
    }
  }
}

}  // namespace numaserve::kernels::cpu
