// Scalar references for ONNX element-wise ops: unary activations and math,
// numpy-broadcasting binary ops, Where, and variadic Min/Max/Sum/Mean.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace numaserve::kernels {

enum class UnaryKind {
  kRelu,
  kLeakyRelu,  // alpha
  kSigmoid,
  kTanh,
  kElu,   // alpha
  kSelu,  // alpha, gamma (beta)
  kCelu,  // alpha
  kSoftplus,
  kSoftsign,
  kHardSigmoid,  // alpha, beta
  kHardSwish,
  kThresholdedRelu,  // alpha
  kErf,
  kGelu,      // exact (erf) form
  kGeluTanh,  // the tanh approximation (ONNX Gelu, approximate "tanh")
  kSqrt,
  kExp,
  kLog,
  kAbs,
  kNeg,
  kReciprocal,
  kCeil,
  kFloor,
  kRound,
  kSign,
  kSin,
  kCos,
  kTan,
  kAsin,
  kAcos,
  kAtan,
  kSinh,
  kCosh,
  kAsinh,
  kAcosh,
  kAtanh,
  kClip,  // alpha = min, beta = max
  kIdentity,
};

struct UnaryParams {
  UnaryKind kind = UnaryKind::kIdentity;
  float alpha = 0.0f;
  float beta = 0.0f;
};

float ApplyUnary(const UnaryParams& p, float x);
void UnaryRef(const UnaryParams& p, const float* x, int64_t count, float* y);
Tensor UnaryRef(const UnaryParams& p, const Tensor& x);

enum class BinaryKind { kAdd, kSub, kMul, kDiv, kPow, kMin, kMax, kPRelu, kMod, kFmod };

// Inline, so that a loop over one kind compiles to that operation alone.
inline float ApplyBinary(BinaryKind kind, float a, float b) {
  switch (kind) {
    case BinaryKind::kAdd:
      return a + b;
    case BinaryKind::kSub:
      return a - b;
    case BinaryKind::kMul:
      return a * b;
    case BinaryKind::kDiv:
      return a / b;
    case BinaryKind::kPow:
      return static_cast<float>(std::pow(static_cast<double>(a), static_cast<double>(b)));
    case BinaryKind::kMin:
      return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    case BinaryKind::kMax:
      return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case BinaryKind::kPRelu:
      return a >= 0.0f ? a : a * b;
    case BinaryKind::kFmod:
      return std::fmod(a, b);
    case BinaryKind::kMod: {
      float r = std::fmod(a, b);
      if (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) r += b;
      return r;
    }
  }
  return a;
}

// For every element of `out_shape` (row-major), the offset of the element of
// `in_shape` (broadcastable to it) that maps to it.
std::vector<int64_t> BroadcastOffsets(const Shape& in_shape, const Shape& out_shape);

// out = a (op) b with numpy broadcasting.
absl::StatusOr<Tensor> BinaryRef(BinaryKind kind, const Tensor& a, const Tensor& b);

// out = cond != 0 ? x : y, all three broadcast together.
absl::StatusOr<Tensor> WhereRef(const Tensor& cond, const Tensor& x, const Tensor& y);

}  // namespace numaserve::kernels
