#include "kernels/onednn/onednn_common.h"

#include "absl/strings/str_cat.h"

namespace numaserve::kernels {

absl::Status DnnlErrorToStatus(const dnnl::error& e, absl::string_view what) {
  const std::string message =
      absl::StrCat(what, ": oneDNN error ", static_cast<int>(e.status), ": ", e.what());
  if (e.status == dnnl_unimplemented) return absl::UnimplementedError(message);
  if (e.status == dnnl_out_of_memory) return absl::ResourceExhaustedError(message);
  if (e.status == dnnl_invalid_arguments) return absl::InvalidArgumentError(message);
  return absl::InternalError(message);
}

dnnl::memory::dims ToDnnlDims(const Shape& shape) {
  return dnnl::memory::dims(shape.begin(), shape.end());
}

}  // namespace numaserve::kernels
