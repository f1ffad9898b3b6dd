#include "kernels/ref/gemm_ref.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/ref/add_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::kernels {

absl::StatusOr<Tensor> GemmRef(const Tensor& a, const Tensor& b, const Tensor* c,
                               const GemmAttrs& attrs) {
  if (a.rank() != 2 || b.rank() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gemm needs 2-D A and B, got ", ShapeToString(a.shape), " and ", ShapeToString(b.shape)));
  }
  const int64_t m = attrs.trans_a ? a.shape[1] : a.shape[0];
  const int64_t k = attrs.trans_a ? a.shape[0] : a.shape[1];
  const int64_t kb = attrs.trans_b ? b.shape[1] : b.shape[0];
  const int64_t n = attrs.trans_b ? b.shape[0] : b.shape[1];
  if (k != kb) {
    return absl::InvalidArgumentError(absl::StrCat("Gemm inner dims differ: ", k, " vs ", kb));
  }
  Tensor y({m, n});
  if (c != nullptr) {
    auto bc = BroadcastShapes(c->shape, y.shape);
    if (!bc.ok() || *bc != y.shape) {
      return absl::InvalidArgumentError(absl::StrCat("Gemm C ", ShapeToString(c->shape),
                                                     " does not broadcast to [", m, ",", n, "]"));
    }
    BroadcastTo(c->data.data(), c->shape, y.data.data(), y.shape);
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const float av = attrs.trans_a ? a.data[p * m + i] : a.data[i * k + p];
        const float bv = attrs.trans_b ? b.data[j * k + p] : b.data[p * n + j];
        acc += static_cast<double>(av) * bv;
      }
      float& out = y.data[i * n + j];
      out = static_cast<float>(attrs.alpha * acc + (c != nullptr ? attrs.beta * out : 0.0f));
    }
  }
  return y;
}

absl::StatusOr<Tensor> MatMulRef(const Tensor& a, const Tensor& b) {
  if (a.rank() < 2 || b.rank() != 2 || a.shape.back() != b.shape[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMul needs A of rank >= 2 and a 2-D B "
                     "with matching inner dims, got ",
                     ShapeToString(a.shape), " and ", ShapeToString(b.shape)));
  }
  const int64_t k = a.shape.back();
  const int64_t n = b.shape[1];
  const int64_t m = a.size() / k;
  Shape out_shape = a.shape;
  out_shape.back() = n;
  Tensor y(out_shape);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; ++p)
        acc += static_cast<double>(a.data[i * k + p]) * b.data[p * n + j];
      y.data[i * n + j] = static_cast<float>(acc);
    }
  }
  return y;
}

}  // namespace numaserve::kernels
