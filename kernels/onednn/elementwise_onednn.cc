#include "kernels/onednn/elementwise_onednn.h"

#include <algorithm>
#include <tuple>

#include "kernels/ref/add_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::kernels {
namespace {

using dt = dnnl::memory::data_type;

dnnl::memory::desc PlainDesc(const Shape& shape) {
  // oneDNN has no 0-d memory: a scalar is a 1-element 1-D tensor.
  Shape dims = shape.empty() ? Shape{1} : shape;
  return dnnl::memory::desc(ToDnnlDims(dims), dt::f32, ToDnnlDims(RowMajorStrides(dims)));
}

}  // namespace

absl::StatusOr<AddOnednn::Entry*> AddOnednn::GetEntry(const Shape& a_shape, const Shape& b_shape,
                                                      const Shape& out_shape) {
  if (Entry* found = per_shape_.Find(std::tie(a_shape, b_shape))) return found;
  Entry entry;
  const size_t rank = std::max<size_t>(out_shape.size(), 1);
  const Shape out = PadShapeLeft(out_shape, rank);
  Shape src0 = PadShapeLeft(a_shape, rank);
  Shape src1 = PadShapeLeft(b_shape, rank);
  if (src0 != out) {
    std::swap(src0, src1);
    entry.swapped = true;
  }
  if (src0 != out) {
    entry.use_loop = true;
  } else {
    try {
      dnnl::binary::primitive_desc pd(engine_, dnnl::algorithm::binary_add, PlainDesc(src0),
                                      PlainDesc(src1), PlainDesc(out));
      entry.call.primitive = dnnl::binary(pd);
      entry.call.args[DNNL_ARG_SRC_0] = UnboundMemory(pd.src0_desc(), engine_);
      entry.call.args[DNNL_ARG_SRC_1] = UnboundMemory(pd.src1_desc(), engine_);
      entry.call.args[DNNL_ARG_DST] = UnboundMemory(pd.dst_desc(), engine_);
    } catch (const dnnl::error& e) {
      return DnnlErrorToStatus(
          e, "creating binary add for " + ShapeToString(a_shape) + " + " + ShapeToString(b_shape));
    }
  }
  return &per_shape_.Emplace(std::make_tuple(a_shape, b_shape), std::move(entry));
}

absl::Status AddOnednn::Execute(dnnl::stream& stream, const Shape& a_shape, const float* a,
                                const Shape& b_shape, const float* b, const Shape& out_shape,
                                float* out) {
  auto entry = GetEntry(a_shape, b_shape, out_shape);
  if (!entry.ok()) return entry.status();
  Entry& e = **entry;
  if (e.use_loop) {
    AddBroadcast(a, a_shape, b, b_shape, out, out_shape);
    return absl::OkStatus();
  }
  try {
    e.call.SetHandle(DNNL_ARG_SRC_0, e.swapped ? b : a);
    e.call.SetHandle(DNNL_ARG_SRC_1, e.swapped ? a : b);
    e.call.SetHandle(DNNL_ARG_DST, out);
    e.call.Execute(stream);
  } catch (const dnnl::error& err) {
    return DnnlErrorToStatus(err, "executing binary add");
  }
  return absl::OkStatus();
}

absl::Status EltwiseOnednn::Execute(dnnl::stream& stream, int64_t count, const float* src,
                                    float* dst) {
  BoundPrimitive* call = per_count_.Find(count);
  try {
    if (call == nullptr) {
      dnnl::memory::desc md({count}, dt::f32, dnnl::memory::format_tag::a);
      dnnl::eltwise_forward::primitive_desc pd(engine_, dnnl::prop_kind::forward_inference,
                                               algorithm_, md, md, alpha_, beta_);
      BoundPrimitive created;
      created.primitive = dnnl::eltwise_forward(pd);
      created.args[DNNL_ARG_SRC] = UnboundMemory(md, engine_);
      created.args[DNNL_ARG_DST] = UnboundMemory(md, engine_);
      call = &per_count_.Emplace(count, std::move(created));
    }
    call->SetHandle(DNNL_ARG_SRC, src);
    call->SetHandle(DNNL_ARG_DST, dst);
    call->Execute(stream);
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, "eltwise");
  }
  return absl::OkStatus();
}

std::string AddOnednn::ImplementationName(const Shape& a_shape, const Shape& b_shape) const {
  const Entry* entry = per_shape_.Peek(std::tie(a_shape, b_shape));
  if (entry == nullptr) return "";
  return entry->use_loop ? "loop" : entry->call.ImplementationName();
}

std::string EltwiseOnednn::ImplementationName(int64_t count) const {
  const BoundPrimitive* call = per_count_.Peek(count);
  return call == nullptr ? "" : call->ImplementationName();
}

}  // namespace numaserve::kernels
