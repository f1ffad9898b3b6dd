#include "kernels/gemm/gemm_backend.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/sgemm.h"
#include "kernels/dispatch.h"
#include "kernels/gemm/blas_gemm.h"
#include "kernels/onednn/matmul_onednn.h"

namespace numaserve::kernels {
namespace {

// MatMulOnednn on its own in-order stream, waited on after each call so a
// Run is complete when it returns (as the BLAS calls are).
class OnednnKernel final : public GemmKernel {
 public:
  OnednnKernel(std::unique_ptr<MatMulOnednn> mm, const dnnl::engine& engine, GemmOptions options)
      : mm_(std::move(mm)), stream_(engine), options_(std::move(options)) {
    options_.weights = nullptr;  // only read at creation
    if (options_.int8.has_value()) options_.int8->weights = std::vector<int8_t>();
  }
  GemmBackend backend() const override { return GemmBackend::kOnednn; }
  const GemmOptions& options() const override { return options_; }
  int64_t weight_bytes() const override { return mm_->packed_weight_bytes(); }
  absl::Status Prepare(int64_t m) override { return mm_->Prepare(m); }
  std::string ImplementationName(int64_t m) const override { return mm_->ImplementationName(m); }
  absl::Status Run(int64_t m, const float* src, float* dst) override {
    if (absl::Status s = mm_->Execute(stream_, m, src, dst); !s.ok()) return s;
    try {
      stream_.wait();
    } catch (const dnnl::error& e) {
      return DnnlErrorToStatus(e, "waiting for the matmul");
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<MatMulOnednn> mm_;
  dnnl::stream stream_;
  GemmOptions options_;
};

// numaserve's own AVX2 SGEMM on weights packed once into its panels; the
// epilogue as the BLAS backends apply it. A transposed A (Gemm transA) is
// transposed into the kernel's own buffer first.
class NumaserveKernel final : public GemmKernel {
 public:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  NumaserveKernel(GemmOptions options, std::unique_ptr<float, Free> packed)
      : options_(std::move(options)), packed_(std::move(packed)) {
    options_.weights = nullptr;  // only read at creation
  }
  GemmBackend backend() const override { return GemmBackend::kNumaserve; }
  const GemmOptions& options() const override { return options_; }
  int64_t weight_bytes() const override {
    return cpu::SgemmPackedFloats(options_.k, options_.n) * static_cast<int64_t>(sizeof(float));
  }
  std::string ImplementationName(int64_t m) const override {
    return m == 1 ? "numaserve:sgemv avx2" : "numaserve:sgemm_6x16 avx2";
  }
  absl::Status Run(int64_t m, const float* src, float* dst) override {
    const int64_t k = options_.k, n = options_.n;
    if (m <= 0 || m > (int64_t{1} << 40) / k) {
      return absl::InvalidArgumentError(absl::StrCat("numaserve gemm: M = ", m));
    }
    const float* a = src;
    if (options_.src_transposed) {
      if (static_cast<int64_t>(transposed_.size()) < m * k) transposed_.resize(m * k);
      GetKernelTable().transpose_2d(src, transposed_.data(), 1, k, m);  // [K, M] -> [M, K]
      a = transposed_.data();
    }
    cpu::sgemm_packed_avx2(m, n, k, a, k, packed_.get(),
                           options_.accumulate ? options_.sum_scale : 0.0f, dst, n);
    blas::ApplyEpilogue(options_, m, dst);
    return absl::OkStatus();
  }

 private:
  GemmOptions options_;
  std::unique_ptr<float, Free> packed_;  // 64-byte aligned: a panel row is a cache line
  std::vector<float> transposed_;
};

absl::Status NumaserveAvailable() {
  const DispatchDecision& d = GetDispatchDecision();
  if (d.max_tier == IsaTier::kAvx2) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "numaserve is unavailable: the own GEMM has an AVX2 kernel only, and this process runs ",
      IsaTierName(d.max_tier),
      d.max_tier == IsaTier::kAvx512 ? " (oneDNN, BLIS and OpenBLAS have its kernels)" : ""));
}

absl::StatusOr<std::unique_ptr<GemmKernel>> CreateNumaserveKernel(const GemmOptions& options) {
  if (absl::Status s = NumaserveAvailable(); !s.ok()) return s;
  if (options.k <= 0 || options.n <= 0 || options.weights == nullptr) {
    return absl::InvalidArgumentError("numaserve gemm: K, N and weights are required");
  }
  if (options.k > INT32_MAX || options.n > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("numaserve gemm: K=", options.k, " N=", options.n, " are too large"));
  }
  if (!options.bias.empty() && static_cast<int64_t>(options.bias.size()) != options.n) {
    return absl::InvalidArgumentError(absl::StrCat("numaserve gemm: bias has ", options.bias.size(),
                                                   " values, N is ", options.n));
  }
  const int64_t floats = cpu::SgemmPackedFloats(options.k, options.n);
  const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64;
  std::unique_ptr<float, NumaserveKernel::Free> packed(
      static_cast<float*>(std::aligned_alloc(64, bytes)));
  if (packed == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("numaserve gemm: cannot allocate ", floats * 4, " bytes of weights"));
  }
  cpu::PackSgemmWeights(options.weights, options.k, options.n, options.weights_transposed,
                        options.weights_scale, packed.get());
  return std::unique_ptr<GemmKernel>(new NumaserveKernel(options, std::move(packed)));
}

}  // namespace

const char* GemmBackendName(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::kOnednn:
      return "onednn";
    case GemmBackend::kBlis:
      return "blis";
    case GemmBackend::kOpenblas:
      return "openblas";
    case GemmBackend::kNumaserve:
      return "numaserve";
  }
  return "unknown";
}

std::optional<GemmBackend> GemmBackendFromName(std::string_view name) {
  for (GemmBackend b : kAllGemmBackends) {
    if (name == GemmBackendName(b)) return b;
  }
  return std::nullopt;
}

absl::Status CheckGemmBackendOptions(const GemmBackendOptions& options) {
  static constexpr const char* kBlisArchs[] = {"skx",  "knl",  "haswell", "sandybridge", "penryn",
                                               "zen3", "zen2", "zen",     "generic"};
  if (!options.blis_arch.empty() && std::find(std::begin(kBlisArchs), std::end(kBlisArchs),
                                              options.blis_arch) == std::end(kBlisArchs)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "blis arch '", options.blis_arch, "' is not one of ", absl::StrJoin(kBlisArchs, ", ")));
  }
  const std::string& core = options.openblas_core;
  if (core.size() > 32 || !std::all_of(core.begin(), core.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c));
      })) {
    return absl::InvalidArgumentError(
        absl::StrCat("openblas core '", absl::CHexEscape(core),
                     "' is not a core name (letters and digits, at most 32: SkylakeX, Zen, "
                     "Haswell, ...)"));
  }
  return absl::OkStatus();
}

absl::Status SetGemmBackendOptions(const GemmBackendOptions& options) {
  if (absl::Status s = CheckGemmBackendOptions(options); !s.ok()) return s;
  return blas::SetOptions(options);
}

absl::Status GemmBackendAvailable(GemmBackend backend) {
  if (backend == GemmBackend::kOnednn) return absl::OkStatus();
  if (backend == GemmBackend::kNumaserve) return NumaserveAvailable();
  return blas::Available(backend);
}

std::string GemmBackendDetails(GemmBackend backend) {
  if (backend == GemmBackend::kOnednn) {
    const dnnl_version_t* v = dnnl_version();
    return absl::StrCat("oneDNN ", v->major, ".", v->minor, ".", v->patch,
                        " matmul on prepacked weights");
  }
  if (backend == GemmBackend::kNumaserve) {
    if (absl::Status s = NumaserveAvailable(); !s.ok()) return std::string(s.message());
    return "numaserve's own AVX2 SGEMM (6x16 FMA micro-kernel, one-row kernel with 8 FMA chains) "
           "on weights packed once";
  }
  return blas::Details(backend);
}

std::string AvailableGemmBackends() {
  std::string out;
  for (GemmBackend b : kAllGemmBackends) {
    if (!GemmBackendAvailable(b).ok()) continue;
    absl::StrAppend(&out, out.empty() ? "" : "; ", GemmBackendName(b), ": ", GemmBackendDetails(b));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<GemmKernel>> CreateGemmKernel(GemmBackend backend,
                                                             const GemmOptions& options,
                                                             const dnnl::engine& engine) {
  if (backend != GemmBackend::kOnednn && options.bf16) {
    return absl::InvalidArgumentError(
        absl::StrCat(GemmBackendName(backend), " has no BF16 GEMM: precision bf16 runs on onednn"));
  }
  if (backend != GemmBackend::kOnednn && options.int8.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(GemmBackendName(backend), " has no INT8 GEMM: precision int8 runs on onednn"));
  }
  if (backend == GemmBackend::kNumaserve) return CreateNumaserveKernel(options);
  if (backend != GemmBackend::kOnednn) return blas::CreateKernel(backend, options);
  auto mm = MatMulOnednn::Create(engine, options);
  if (!mm.ok()) return mm.status();
  try {
    return std::unique_ptr<GemmKernel>(new OnednnKernel(*std::move(mm), engine, options));
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, "creating a stream for the matmul");
  }
}

int GemmLibraryThreads(GemmBackend backend) {
  if (backend == GemmBackend::kOnednn || backend == GemmBackend::kNumaserve) return -1;
  return blas::LibraryThreads(backend);
}

void SetGemmCallHookForTesting(GemmCallHook hook) { blas::SetCallHook(hook); }

absl::Status CheckGemmLibrary(GemmBackend backend, const std::string& path) {
  if (backend == GemmBackend::kOnednn || backend == GemmBackend::kNumaserve) {
    return absl::InvalidArgumentError(
        absl::StrCat(GemmBackendName(backend), " is linked in, not loaded from a file"));
  }
  return blas::CheckLibrary(backend, path);
}

}  // namespace numaserve::kernels
