#include "kernels/gemm/gemm_backend.h"

#include "absl/strings/str_cat.h"
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

}  // namespace

const char* GemmBackendName(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::kOnednn:
      return "onednn";
    case GemmBackend::kBlis:
      return "blis";
    case GemmBackend::kOpenblas:
      return "openblas";
  }
  return "unknown";
}

std::optional<GemmBackend> GemmBackendFromName(std::string_view name) {
  for (GemmBackend b : kAllGemmBackends) {
    if (name == GemmBackendName(b)) return b;
  }
  return std::nullopt;
}

absl::Status GemmBackendAvailable(GemmBackend backend) {
  if (backend == GemmBackend::kOnednn) return absl::OkStatus();
  return blas::Available(backend);
}

std::string GemmBackendDetails(GemmBackend backend) {
  if (backend == GemmBackend::kOnednn) {
    const dnnl_version_t* v = dnnl_version();
    return absl::StrCat("oneDNN ", v->major, ".", v->minor, ".", v->patch,
                        " matmul on prepacked weights");
  }
  return blas::Details(backend);
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
  if (backend != GemmBackend::kOnednn) return blas::CreateKernel(backend, options);
  auto mm = MatMulOnednn::Create(engine, options);
  if (!mm.ok()) return mm.status();
  try {
    return std::unique_ptr<GemmKernel>(new OnednnKernel(*std::move(mm), engine, options));
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, "creating a stream for the matmul");
  }
}

absl::Status CheckGemmLibrary(GemmBackend backend, const std::string& path) {
  if (backend == GemmBackend::kOnednn) {
    return absl::InvalidArgumentError("onednn is linked in, not loaded from a file");
  }
  return blas::CheckLibrary(backend, path);
}

}  // namespace numaserve::kernels
