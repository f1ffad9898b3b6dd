#include "kernels/ref/softmax_ref.h"

#include <algorithm>
#include <cmath>

#include "kernels/shape_ops.h"

namespace numaserve::kernels {

namespace {

// Softmax or log-softmax over `axis` (with flatten_to_2d, over every axis
// from `axis` on, as opsets before 13 define it), computed in double.
absl::StatusOr<Tensor> NormalizedExpRef(const Tensor& x, int64_t axis, bool flatten_to_2d,
                                        bool log_output) {
  auto ax = NormalizeAxis(axis, std::max<int64_t>(x.rank(), 1));
  if (!ax.ok()) return ax.status();
  int64_t outer = 1, len = 1, inner = 1;
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (i < *ax) {
      outer *= x.shape[i];
    } else if (i == *ax || flatten_to_2d) {
      len *= x.shape[i];
    } else {
      inner *= x.shape[i];
    }
  }
  Tensor y(x.shape);
  if (y.data.empty()) return y;  // no elements (`outer` alone may be huge)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t in = 0; in < inner; ++in) {
      const float* src = x.data.data() + o * len * inner + in;
      float* dst = y.data.data() + o * len * inner + in;
      float max_v = -INFINITY;
      for (int64_t j = 0; j < len; ++j) max_v = std::max(max_v, src[j * inner]);
      double sum = 0.0;
      for (int64_t j = 0; j < len; ++j) {
        sum += std::exp(static_cast<double>(src[j * inner]) - max_v);
      }
      const double log_sum = std::log(sum);
      for (int64_t j = 0; j < len; ++j) {
        const double shifted = static_cast<double>(src[j * inner]) - max_v;
        dst[j * inner] =
            static_cast<float>(log_output ? shifted - log_sum : std::exp(shifted) / sum);
      }
    }
  }
  return y;
}

}  // namespace

absl::StatusOr<Tensor> SoftmaxRef(const Tensor& x, int64_t axis, bool flatten_to_2d) {
  return NormalizedExpRef(x, axis, flatten_to_2d, /*log_output=*/false);
}

absl::StatusOr<Tensor> LogSoftmaxRef(const Tensor& x, int64_t axis, bool flatten_to_2d) {
  return NormalizedExpRef(x, axis, flatten_to_2d, /*log_output=*/true);
}

}  // namespace numaserve::kernels
