#include "kernels/ref/elementwise_ref.h"

#include <algorithm>
#include <cmath>

#include "kernels/shape_ops.h"

namespace numaserve::kernels {

namespace {

// GELU in its exact (erf) form, or the tanh approximation.
float Gelu(bool tanh_form, float x) {
  if (!tanh_form) return static_cast<float>(0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))));
  const double u = std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x);
  return static_cast<float>(0.5 * x * (1.0 + std::tanh(u)));
}

// The trigonometric and hyperbolic functions and their inverses.
float Trigonometric(UnaryKind kind, float x) {
  switch (kind) {
    case UnaryKind::kSin:
      return std::sin(x);
    case UnaryKind::kCos:
      return std::cos(x);
    case UnaryKind::kTan:
      return std::tan(x);
    case UnaryKind::kAsin:
      return std::asin(x);
    case UnaryKind::kAcos:
      return std::acos(x);
    case UnaryKind::kAtan:
      return std::atan(x);
    case UnaryKind::kSinh:
      return std::sinh(x);
    case UnaryKind::kCosh:
      return std::cosh(x);
    case UnaryKind::kAsinh:
      return std::asinh(x);
    case UnaryKind::kAcosh:
      return std::acosh(x);
    case UnaryKind::kAtanh:
      return std::atanh(x);
    default:
      return x;
  }
}

}  // namespace

float ApplyUnary(const UnaryParams& p, float x) {
  switch (p.kind) {
    case UnaryKind::kRelu:
      return x > 0.0f ? x : 0.0f;
    case UnaryKind::kLeakyRelu:
      return x >= 0.0f ? x : p.alpha * x;
    case UnaryKind::kSigmoid:
      return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x))));
    case UnaryKind::kTanh:
      return std::tanh(x);
    case UnaryKind::kElu:
      return x >= 0.0f ? x : static_cast<float>(p.alpha * std::expm1(static_cast<double>(x)));
    case UnaryKind::kSelu:
      return x > 0.0f ? p.beta * x
                      : static_cast<float>(p.beta * p.alpha * std::expm1(static_cast<double>(x)));
    case UnaryKind::kCelu:
      return std::max(0.0f, x) +
             std::min(0.0f, static_cast<float>(p.alpha * std::expm1(x / p.alpha)));
    case UnaryKind::kSoftplus:
      return static_cast<float>(std::log1p(std::exp(static_cast<double>(x))));
    case UnaryKind::kSoftsign:
      return x / (1.0f + std::fabs(x));
    case UnaryKind::kHardSigmoid:
      return std::clamp(p.alpha * x + p.beta, 0.0f, 1.0f);
    case UnaryKind::kHardSwish:
      return x * std::clamp(x / 6.0f + 0.5f, 0.0f, 1.0f);
    case UnaryKind::kThresholdedRelu:
      return x > p.alpha ? x : 0.0f;
    case UnaryKind::kErf:
      return std::erf(x);
    case UnaryKind::kGelu:
    case UnaryKind::kGeluTanh:
      return Gelu(p.kind == UnaryKind::kGeluTanh, x);
    case UnaryKind::kSqrt:
      return std::sqrt(x);
    case UnaryKind::kExp:
      return std::exp(x);
    case UnaryKind::kLog:
      return std::log(x);
    case UnaryKind::kAbs:
      return std::fabs(x);
    case UnaryKind::kNeg:
      return -x;
    case UnaryKind::kReciprocal:
      return 1.0f / x;
    case UnaryKind::kCeil:
      return std::ceil(x);
    case UnaryKind::kFloor:
      return std::floor(x);
    case UnaryKind::kRound:
      return std::nearbyint(x);  // round half to even (default rounding mode)
    case UnaryKind::kSign:
      return static_cast<float>((x > 0.0f) - (x < 0.0f));
    case UnaryKind::kSin:
    case UnaryKind::kCos:
    case UnaryKind::kTan:
    case UnaryKind::kAsin:
    case UnaryKind::kAcos:
    case UnaryKind::kAtan:
    case UnaryKind::kSinh:
    case UnaryKind::kCosh:
    case UnaryKind::kAsinh:
    case UnaryKind::kAcosh:
    case UnaryKind::kAtanh:
      return Trigonometric(p.kind, x);
    case UnaryKind::kClip:
      return std::min(std::max(x, p.alpha), p.beta);
    case UnaryKind::kIdentity:
      return x;
  }
  return x;
}

void UnaryRef(const UnaryParams& p, const float* x, int64_t count, float* y) {
  for (int64_t i = 0; i < count; ++i) y[i] = ApplyUnary(p, x[i]);
}

Tensor UnaryRef(const UnaryParams& p, const Tensor& x) {
  Tensor y(x.shape);
  UnaryRef(p, x.data.data(), x.size(), y.data.data());
  return y;
}

std::vector<int64_t> BroadcastOffsets(const Shape& in_shape, const Shape& out_shape) {
  const size_t rank = out_shape.size();
  const Shape padded = PadShapeLeft(in_shape, rank);
  std::vector<int64_t> in_strides = RowMajorStrides(padded);
  for (size_t d = 0; d < rank; ++d) {
    if (padded[d] == 1) in_strides[d] = 0;
  }
  const int64_t count = NumElements(out_shape);
  std::vector<int64_t> offsets(count);
  std::vector<int64_t> index(rank, 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < count; ++i) {
    offsets[i] = offset;
    for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
      if (++index[d] < out_shape[d]) {
        offset += in_strides[d];
        break;
      }
      offset -= in_strides[d] * (out_shape[d] - 1);
      index[d] = 0;
    }
  }
  return offsets;
}

absl::StatusOr<Tensor> BinaryRef(BinaryKind kind, const Tensor& a, const Tensor& b) {
  auto shape = BroadcastShapes(a.shape, b.shape);
  if (!shape.ok()) return shape.status();
  Tensor out(*shape);
  const std::vector<int64_t> oa = BroadcastOffsets(a.shape, *shape);
  const std::vector<int64_t> ob = BroadcastOffsets(b.shape, *shape);
  for (int64_t i = 0; i < out.size(); ++i) {
    out.data[i] = ApplyBinary(kind, a.data[oa[i]], b.data[ob[i]]);
  }
  return out;
}

absl::StatusOr<Tensor> WhereRef(const Tensor& cond, const Tensor& x, const Tensor& y) {
  auto s1 = BroadcastShapes(cond.shape, x.shape);
  if (!s1.ok()) return s1.status();
  auto shape = BroadcastShapes(*s1, y.shape);
  if (!shape.ok()) return shape.status();
  Tensor out(*shape);
  const std::vector<int64_t> oc = BroadcastOffsets(cond.shape, *shape);
  const std::vector<int64_t> ox = BroadcastOffsets(x.shape, *shape);
  const std::vector<int64_t> oy = BroadcastOffsets(y.shape, *shape);
  for (int64_t i = 0; i < out.size(); ++i) {
    out.data[i] = cond.data[oc[i]] != 0.0f ? x.data[ox[i]] : y.data[oy[i]];
  }
  return out;
}

}  // namespace numaserve::kernels
