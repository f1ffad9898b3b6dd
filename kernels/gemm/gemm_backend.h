// GEMM backends for Y = op(A) x W with constant weights (GemmOptions):
//   onednn    oneDNN's matmul primitive on weights packed once (MatMulOnednn)
//   blis      BLIS's OpenMP build (libblis.so.4), typed API bli_sgemm, and
//             bli_sgemv for one row (its sgemm packs even then)
//   openblas  OpenBLAS's OpenMP build (libopenblas.so.0), cblas_sgemm, and
//             cblas_sgemv for one row (0.3.21's sgemm does not switch to it)
//   numaserve numaserve's own SGEMM on weights packed once
//             (kernels/cpu/sgemm.h), and its own matrix-vector kernel on
//             the same panels for one row, on the AVX2 tier only: where the
//             libraries' AVX2 kernels ran at 0.6-0.75 of a Zen 1's peak on
//             BERT-base's shapes (unavailable, with the reason, elsewhere)
// BLIS and OpenBLAS both export the BLAS/CBLAS symbols, so linking both would
// make one shadow the other: each is dlopen'ed (RTLD_LOCAL | RTLD_DEEPBIND)
// from its Debian path (then by soname) and called through its own pointers.
// A library that is missing, or lacks a symbol, makes its backend
// unavailable with the reason; nothing crashes.
//
// Both libraries pick their kernels from CPUID tables that predate this
// machine (BLIS 0.9.0 falls back to 'generic' on an AMD Zen 5, OpenBLAS
// 0.3.21 to 'Haswell'), so the configuration comes from numaserve's own
// feature probe (affinity/cpu_features.h) before the library initialises:
// BLIS_ARCH_TYPE and OPENBLAS_CORETYPE, unless the user set them.
// GemmBackendOptions (numaserve's --blis-arch and --openblas-core, or
// NUMASERVE_BLIS_ARCH and NUMASERVE_OPENBLAS_CORE, read by its main)
// override the choice.
//
// Threads: the BLAS backends run with omp_get_max_threads() threads at each
// call (the worker's cores: OMP_NUM_THREADS, or CompileOptions.num_threads;
// an instance's share of them), whatever other threads of the process ask
// for meanwhile. BLIS 1.x (built with thread-local storage, as Debian 13's)
// keeps a count per calling thread, set by each thread for itself.
// OpenBLAS (and BLIS 0.9) keep one count per process: a call sets it and
// computes while no call with another count does; calls with the same
// count run together, and the other counts take turns.
#pragma once

#include <cstdint>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/gemm/gemm_options.h"

namespace numaserve::kernels {

enum class GemmBackend { kOnednn, kBlis, kOpenblas, kNumaserve };
inline constexpr GemmBackend kAllGemmBackends[] = {GemmBackend::kOnednn, GemmBackend::kBlis,
                                                   GemmBackend::kOpenblas, GemmBackend::kNumaserve};

// The BLAS libraries' kernel configuration in this process; empty: chosen
// from the CPU's features (above). To time other kernels, or where the
// choice is wrong.
struct GemmBackendOptions {
  // A BLIS sub-configuration: skx, knl, haswell, sandybridge, penryn, zen3,
  // zen2, zen or generic.
  std::string blis_arch;
  // An OpenBLAS core (SkylakeX, Zen, Haswell, ...): letters and digits, at
  // most 32.
  std::string openblas_core;
};

// OK, or INVALID_ARGUMENT naming the field and what it accepts.
absl::Status CheckGemmBackendOptions(const GemmBackendOptions& options);

// Sets this process's options, read when a library is loaded (its first
// use). Call at the start of main: FAILED_PRECONDITION once a library a
// changed option configures is loaded; INVALID_ARGUMENT as above.
absl::Status SetGemmBackendOptions(const GemmBackendOptions& options);

// "onednn", "blis", "openblas", "numaserve".
const char* GemmBackendName(GemmBackend backend);
std::optional<GemmBackend> GemmBackendFromName(std::string_view name);

// OK when the backend can run here; FAILED_PRECONDITION with the reason
// otherwise ("blis: cannot load /usr/lib/...: No such file or directory").
// The first call for a BLAS backend loads its library.
absl::Status GemmBackendAvailable(GemmBackend backend);

// The library and the kernels it runs ("BLIS 0.9.0, sub-configuration skx
// (from the CPU's AVX-512)"); the reason when unavailable.
std::string GemmBackendDetails(GemmBackend backend);

// The backends available here with what each runs, in kAllGemmBackends'
// order ("onednn: oneDNN 3.7.2 ...; blis: BLIS 0.9.0 ..."): part of the
// "auto" choice cache's key, so that a choice made before a backend
// existed or changed (a library installed or upgraded, a new own kernel)
// is made again.
std::string AvailableGemmBackends();

// One GEMM with its weights prepared in the backend's layout.
class GemmKernel {
 public:
  virtual ~GemmKernel() = default;
  virtual GemmBackend backend() const = 0;
  virtual const GemmOptions& options() const = 0;
  int64_t k() const { return options().k; }
  int64_t n() const { return options().n; }
  // One-time setup for m rows (oneDNN creates its primitive); Run does it
  // lazily, so this only moves the cost earlier.
  virtual absl::Status Prepare(int64_t m) { return absl::OkStatus(); }
  // src: [M,K] (or [K,M] if src_transposed); dst: [M,N], holding the tensor
  // to add when options().accumulate. Not thread-safe.
  virtual absl::Status Run(int64_t m, const float* src, float* dst) = 0;
  // Bytes of the prepared weights.
  virtual int64_t weight_bytes() const = 0;
  // What runs m rows, once prepared: oneDNN's implementation name
  // ("brg:avx512_core", "gemm:jit"), or the BLAS routine and the library's
  // kernel configuration ("blis sgemv, skx"); "" before the first Prepare/Run
  // of m on oneDNN.
  virtual std::string ImplementationName(int64_t m) const = 0;
};

// The weights are read only during the call. `engine` is used by oneDNN.
absl::StatusOr<std::unique_ptr<GemmKernel>> CreateGemmKernel(GemmBackend backend,
                                                             const GemmOptions& options,
                                                             const dnnl::engine& engine);

// For tests of the BLAS backends' thread counts: the count that the
// backend's library holds now for a call from the calling thread (BLIS:
// bli_thread_get_num_threads, OpenBLAS: openblas_get_num_threads); -1 for
// onednn and numaserve, and where the library is unavailable.
int GemmLibraryThreads(GemmBackend backend);

// For tests: called on the calling thread inside each BLIS and OpenBLAS
// GEMM, right before the library computes (nullptr: nothing is called).
using GemmCallHook = void (*)(GemmBackend backend);
void SetGemmCallHookForTesting(GemmCallHook hook);

// Whether `path` is a usable library for a BLAS backend (it loads, and has
// every entry point the backend calls); for tests and diagnostics.
absl::Status CheckGemmLibrary(GemmBackend backend, const std::string& path);

}  // namespace numaserve::kernels
