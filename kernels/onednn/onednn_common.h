// Shared plumbing for the oneDNN kernels: error translation (oneDNN's C++
// API throws; nothing thrown may leave kernels/) and a primitive plus its
// bound argument memories, reused across calls of the same shape.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/tensor.h"

namespace numaserve::kernels {

absl::Status DnnlErrorToStatus(const dnnl::error& e, absl::string_view what);

dnnl::memory::dims ToDnnlDims(const Shape& shape);

// A primitive with memory objects for each argument created once with no
// data handle; Execute points them at the caller's buffers and runs.
struct BoundPrimitive {
  dnnl::primitive primitive;
  std::unordered_map<int, dnnl::memory> args;

  void SetHandle(int arg, const void* ptr) { args.at(arg).set_data_handle(const_cast<void*>(ptr)); }
  void Execute(dnnl::stream& stream) { primitive.execute(stream, args); }
};

// A memory object of `md` without a data handle (bound later).
inline dnnl::memory UnboundMemory(const dnnl::memory::desc& md, const dnnl::engine& engine) {
  return dnnl::memory(md, engine, DNNL_MEMORY_NONE);
}

}  // namespace numaserve::kernels
