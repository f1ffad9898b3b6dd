#include "kernels/ref/norm_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/ref/elementwise_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::kernels {

absl::StatusOr<Tensor> BatchNormRef(const Tensor& x, const Tensor& scale, const Tensor& bias,
                                    const Tensor& mean, const Tensor& var, float epsilon) {
  if (x.rank() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchNormalization input must have rank >= 2, got ", ShapeToString(x.shape)));
  }
  const int64_t n = x.shape[0], c = x.shape[1], inner = x.size() / std::max<int64_t>(n * c, 1);
  for (const Tensor* t : {&scale, &bias, &mean, &var}) {
    if (t->size() != c) {
      return absl::InvalidArgumentError(absl::StrCat("BatchNormalization parameters must have ", c,
                                                     " elements, got ", t->size()));
    }
  }
  Tensor y(x.shape);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t ch = 0; ch < c; ++ch) {
      const double a = scale.data[ch] / std::sqrt(static_cast<double>(var.data[ch]) + epsilon);
      const double s = bias.data[ch] - a * mean.data[ch];
      const int64_t base = (b * c + ch) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        y.data[base + i] = static_cast<float>(a * x.data[base + i] + s);
      }
    }
  }
  return y;
}

absl::StatusOr<Tensor> LayerNormRef(const Tensor& x, const Tensor& scale, const Tensor* bias,
                                    int64_t axis, float epsilon, Tensor* mean,
                                    Tensor* inv_std_dev) {
  auto ax = NormalizeAxis(axis, x.rank());
  if (!ax.ok()) return ax.status();
  const Shape norm_shape(x.shape.begin() + *ax, x.shape.end());
  const int64_t len = NumElements(norm_shape), rows = x.size() / std::max<int64_t>(len, 1);
  const std::vector<int64_t> so = BroadcastOffsets(scale.shape, norm_shape);
  std::vector<int64_t> bo;
  if (bias != nullptr) bo = BroadcastOffsets(bias->shape, norm_shape);
  Shape stat_shape = x.shape;
  for (size_t d = *ax; d < stat_shape.size(); ++d) stat_shape[d] = 1;
  if (mean != nullptr) *mean = Tensor(stat_shape);
  if (inv_std_dev != nullptr) *inv_std_dev = Tensor(stat_shape);
  Tensor y(x.shape);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x.data.data() + r * len;
    double sum = 0.0;
    for (int64_t i = 0; i < len; ++i) sum += src[i];
    const double mu = sum / len;
    double sq = 0.0;
    for (int64_t i = 0; i < len; ++i) sq += (src[i] - mu) * (src[i] - mu);
    const double inv = 1.0 / std::sqrt(sq / len + epsilon);
    for (int64_t i = 0; i < len; ++i) {
      double v = (src[i] - mu) * inv * scale.data[so[i]];
      if (bias != nullptr) v += bias->data[bo[i]];
      y.data[r * len + i] = static_cast<float>(v);
    }
    if (mean != nullptr) mean->data[r] = static_cast<float>(mu);
    if (inv_std_dev != nullptr) inv_std_dev->data[r] = static_cast<float>(inv);
  }
  return y;
}

namespace {

// The per-output accumulators of a reduction: acc (the sum, product, max, ...
// before the final step), and with LogSumExp the max each output subtracts.
struct ReduceAccumulators {
  std::vector<double> acc;
  std::vector<double> max_for_lse;
};

// Accumulates every element of `x` into its output (the index with the
// `reduced` dims dropped from kept_shape): one pass, two with LogSumExp.
ReduceAccumulators AccumulateReduce(ReduceKind kind, const Tensor& x,
                                    const std::vector<bool>& reduced, const Shape& kept_shape,
                                    int64_t out_count) {
  const int64_t rank = x.rank();
  const double init = kind == ReduceKind::kMax    ? -INFINITY
                      : kind == ReduceKind::kMin  ? INFINITY
                      : kind == ReduceKind::kProd ? 1.0
                                                  : 0.0;
  ReduceAccumulators out;
  std::vector<double>& acc = out.acc;
  std::vector<double>& max_for_lse = out.max_for_lse;
  acc.assign(out_count, init);
  if (kind == ReduceKind::kLogSumExp) {
    // Two passes: the max per output, then sum(exp(x - max)).
    max_for_lse.assign(out_count, -INFINITY);
  }
  const std::vector<int64_t> out_strides = RowMajorStrides(kept_shape);
  std::vector<int64_t> index(rank, 0);
  auto for_each = [&](auto&& fn) {
    std::fill(index.begin(), index.end(), 0);
    for (int64_t i = 0; i < x.size(); ++i) {
      int64_t o = 0;
      for (int64_t d = 0; d < rank; ++d) {
        if (!reduced[d]) o += index[d] * out_strides[d];
      }
      fn(o, static_cast<double>(x.data[i]));
      for (int64_t d = rank - 1; d >= 0; --d) {
        if (++index[d] < x.shape[d]) break;
        index[d] = 0;
      }
    }
  };
  if (kind == ReduceKind::kLogSumExp) {
    for_each([&](int64_t o, double v) { max_for_lse[o] = std::max(max_for_lse[o], v); });
  }
  for_each([&](int64_t o, double v) {
    switch (kind) {
      case ReduceKind::kSum:
      case ReduceKind::kMean:
      case ReduceKind::kLogSum:
        acc[o] += v;
        break;
      case ReduceKind::kMax:
        acc[o] = std::max(acc[o], v);
        break;
      case ReduceKind::kMin:
        acc[o] = std::min(acc[o], v);
        break;
      case ReduceKind::kProd:
        acc[o] *= v;
        break;
      case ReduceKind::kL1:
        acc[o] += std::fabs(v);
        break;
      case ReduceKind::kL2:
      case ReduceKind::kSumSquare:
        acc[o] += v * v;
        break;
      case ReduceKind::kLogSumExp:
        acc[o] += std::exp(v - max_for_lse[o]);
        break;
    }
  });
  return out;
}

}  // namespace

Tensor ReduceRef(ReduceKind kind, const Tensor& x, const std::vector<int64_t>& axes,
                 bool keepdims) {
  const int64_t rank = x.rank();
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t a : axes) reduced[a] = true;
  Shape kept_shape = x.shape;  // reduced dims set to 1
  for (int64_t d = 0; d < rank; ++d) {
    if (reduced[d]) kept_shape[d] = 1;
  }
  const int64_t out_count = NumElements(kept_shape);
  const ReduceAccumulators sums = AccumulateReduce(kind, x, reduced, kept_shape, out_count);
  const std::vector<double>& acc = sums.acc;
  const std::vector<double>& max_for_lse = sums.max_for_lse;
  const double count = static_cast<double>(std::max<int64_t>(x.size(), 1)) /
                       static_cast<double>(std::max<int64_t>(out_count, 1));
  Shape out_shape;
  if (keepdims) {
    out_shape = kept_shape;
  } else {
    for (int64_t d = 0; d < rank; ++d) {
      if (!reduced[d]) out_shape.push_back(x.shape[d]);
    }
  }
  Tensor y(out_shape);
  for (int64_t o = 0; o < out_count; ++o) {
    double v = acc[o];
    if (kind == ReduceKind::kMean) v /= count;
    if (kind == ReduceKind::kL2) v = std::sqrt(v);
    if (kind == ReduceKind::kLogSum) v = std::log(v);
    if (kind == ReduceKind::kLogSumExp) v = std::log(v) + max_for_lse[o];
    y.data[o] = static_cast<float>(v);
  }
  return y;
}

}  // namespace numaserve::kernels
