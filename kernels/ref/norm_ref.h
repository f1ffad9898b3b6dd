// Scalar references for normalisations and reductions: BatchNormalization
// (inference), LayerNormalization, LogSoftmax and the Reduce* family.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace numaserve::kernels {

// y = (x - mean) / sqrt(var + epsilon) * scale + bias, per channel (dim 1).
absl::StatusOr<Tensor> BatchNormRef(const Tensor& x, const Tensor& scale, const Tensor& bias,
                                    const Tensor& mean, const Tensor& var, float epsilon);

// Normalises over dims [axis, rank); scale/bias (bias may be null)
// broadcast to those dims. mean/inv_std_dev (may be null) receive the
// statistics with the normalised dims set to 1.
absl::StatusOr<Tensor> LayerNormRef(const Tensor& x, const Tensor& scale, const Tensor* bias,
                                    int64_t axis, float epsilon, Tensor* mean, Tensor* inv_std_dev);

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSum, kLogSumExp };

// Reduces over `axes` (already normalised, any order; empty = all dims).
Tensor ReduceRef(ReduceKind kind, const Tensor& x, const std::vector<int64_t>& axes, bool keepdims);

}  // namespace numaserve::kernels
