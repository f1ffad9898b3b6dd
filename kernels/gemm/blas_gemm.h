// BLIS and OpenBLAS behind GemmKernel (see gemm_backend.h for how the
// libraries are loaded and configured). Internal to kernels/gemm.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/gemm/gemm_backend.h"

namespace numaserve::kernels::blas {

// SetGemmBackendOptions (gemm_backend.h).
absl::Status SetOptions(const GemmBackendOptions& options);

// For GemmBackend::kBlis and kOpenblas only.
absl::Status Available(GemmBackend backend);
std::string Details(GemmBackend backend);
absl::StatusOr<std::unique_ptr<GemmKernel>> CreateKernel(GemmBackend backend,
                                                         const GemmOptions& options);
absl::Status CheckLibrary(GemmBackend backend, const std::string& path);

// GemmLibraryThreads and SetGemmCallHookForTesting (gemm_backend.h).
int LibraryThreads(GemmBackend backend);
void SetCallHook(GemmCallHook hook);

// The part of GemmOptions a BLAS call does not do itself, applied in place to
// dst[m, n] after dst = op(A) x W + beta * dst: + bias, relu, erf-GELU.
void ApplyEpilogue(const GemmOptions& options, int64_t m, float* dst);

}  // namespace numaserve::kernels::blas
