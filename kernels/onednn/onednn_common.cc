#include "kernels/onednn/onednn_common.h"

#include <cstdlib>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kernels/dispatch.h"

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

std::string BoundPrimitive::ImplementationName() const {
  if (!primitive) return "";
  const char* name = nullptr;
  try {
    if (dnnl_primitive_desc_query(primitive.get_primitive_desc(), dnnl_query_impl_info_str, 0,
                                  &name) != dnnl_success) {
      return "";
    }
  } catch (const dnnl::error&) {
    return "";
  }
  return name != nullptr ? name : "";
}

BoundPrimitive BoundReorder(const dnnl::engine& engine, const dnnl::memory::desc& from,
                            const dnnl::memory::desc& to) {
  BoundPrimitive r;
  r.primitive = dnnl::reorder(dnnl::reorder::primitive_desc(engine, from, engine, to));
  r.args[DNNL_ARG_FROM] = UnboundMemory(from, engine);
  r.args[DNNL_ARG_TO] = UnboundMemory(to, engine);
  return r;
}

char* ThreadScratch(size_t bytes) {
  thread_local std::unique_ptr<char, void (*)(void*)> buffer{nullptr, &std::free};
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    buffer.reset();
    capacity = 0;
    buffer.reset(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
    if (buffer) capacity = bytes;
  }
  return buffer.get();
}

int ActivationChannelBlock() {
  static const int block = [] {
    GetDispatchDecision();  // applies the oneDNN cap before oneDNN reads its ISA
    const unsigned isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const unsigned avx512_core = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
    return (isa & avx512_core) == avx512_core ? 16 : 8;
  }();
  return block;
}

const char* BlockedLayoutName() { return ActivationChannelBlock() == 16 ? "nChw16c" : "nChw8c"; }

bool IsReferenceImplementation(absl::string_view impl) {
  // oneDNN's ref_fused_convolution chains other primitives (a 1x1 conv and
  // its depthwise post-op: "ref_fused_convolution:any:jit_1x1:avx2:jit_dw:
  // avx2"); it is a reference only where one of them is.
  constexpr absl::string_view kChain = "ref_fused_convolution:any:";
  if (absl::ConsumePrefix(&impl, kChain)) return absl::StrContains(impl, "ref");
  return absl::StartsWith(impl, "ref") || absl::StartsWith(impl, "numaserve:reference");
}

}  // namespace numaserve::kernels
