// Scalar references for ONNX element-wise ops: unary activations and math,
// numpy-broadcasting binary ops, Where, and variadic Min/Max/Sum/Mean.
#pragma once

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

float ApplyBinary(BinaryKind kind, float a, float b);

// For every element of `out_shape` (row-major), the offset of the element of
// `in_shape` (broadcastable to it) that maps to it.
std::vector<int64_t> BroadcastOffsets(const Shape& in_shape, const Shape& out_shape);

// out = a (op) b with numpy broadcasting.
absl::StatusOr<Tensor> BinaryRef(BinaryKind kind, const Tensor& a, const Tensor& b);

// out = cond != 0 ? x : y, all three broadcast together.
absl::StatusOr<Tensor> WhereRef(const Tensor& cond, const Tensor& x, const Tensor& y);

}  // namespace numaserve::kernels
