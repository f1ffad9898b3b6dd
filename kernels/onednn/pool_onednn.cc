#include "kernels/onednn/pool_onednn.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "kernels/onednn/conv_onednn.h"

namespace numaserve::kernels {
namespace {

using dt = dnnl::memory::data_type;

// A pool's window as oneDNN takes it (dilation 0 = dense).
struct PoolDims {
  dnnl::memory::dims strides, kernel, dilation, pl, pr;
};

// The window for src_shape -> dst_shape: the whole spatial extent when
// `global`, and the end padding that gives dst's extent.
PoolDims PoolWindowDims(const WindowParams& window, bool global, const Shape& src_shape,
                        const Shape& dst_shape) {
  WindowParams w = window;
  const size_t spatial = src_shape.size() - 2;
  if (global) {
    w.kernel.assign(src_shape.begin() + 2, src_shape.end());
    w.strides.assign(spatial, 1);
    w.dilations.assign(spatial, 1);
    w.pads_begin.assign(spatial, 0);
    w.pads_end.assign(spatial, 0);
  }
  PoolDims out;
  dnnl::memory::dims& strides = out.strides;
  dnnl::memory::dims& kernel = out.kernel;
  dnnl::memory::dims& dilation = out.dilation;
  dnnl::memory::dims& pl = out.pl;
  dnnl::memory::dims& pr = out.pr;
  for (size_t d = 0; d < spatial; ++d) {
    strides.push_back(w.strides[d]);
    kernel.push_back(w.kernel[d]);
    dilation.push_back(w.dilations[d] - 1);
    pl.push_back(w.pads_begin[d]);
    // End padding that makes oneDNN's floor formula give dst's extent.
    const int64_t eff = (w.kernel[d] - 1) * w.dilations[d] + 1;
    pr.push_back((dst_shape[d + 2] - 1) * w.strides[d] + eff - src_shape[d + 2] - w.pads_begin[d]);
  }
  return out;
}

// Says on stderr that oneDNN has only `reference` for the pool's layouts,
// and what runs instead: *impl, which gains the reordering note when it is
// not a reference itself.
void LogReferencePool(const Shape& src_shape, bool src_blocked, BlockedLayout layout,
                      const std::string& reference, std::string* impl) {
  const bool away = !IsReferenceImplementation(*impl);
  if (away) *impl = absl::StrCat(*impl, " (reordered: no ", BlockedLayoutName(layout), " kernel)");
  base::Log(base::LogLevel::kWarning, "onednn",
            absl::StrCat("pool, input ", ShapeToString(src_shape), ": oneDNN has only ", reference,
                         " for ", src_blocked ? BlockedLayoutName(layout) : "plain",
                         away ? "; running " : " on this CPU, and nothing else: it runs there",
                         away ? *impl : ""),
            {{"reference", reference}});
}

}  // namespace

absl::StatusOr<PoolOnednn::PerShape*> PoolOnednn::Prepare(const Shape& src_shape,
                                                          const Shape& dst_shape, bool src_blocked,
                                                          bool dst_blocked) {
  if (PerShape* found = per_shape_.Find(src_shape)) return found;
  const auto [strides, kernel, dilation, pl, pr] =
      PoolWindowDims(window_, global_, src_shape, dst_shape);
  const dnnl::memory::desc src_md = ActivationDesc(src_shape, src_blocked, dt::f32, layout_);
  const dnnl::memory::desc dst_md = ActivationDesc(dst_shape, dst_blocked, dt::f32, layout_);
  // src's own layout first (the pool writes it, reordered into dst's when
  // they differ); where oneDNN has only its reference kernel for that,
  // plain and then channels-last, reordered at both ends.
  const std::pair<dnnl::memory::desc, dnnl::memory::desc> candidates[] = {
      {src_md, ActivationDesc(dst_shape, src_blocked, dt::f32, layout_)},
      {ActivationDesc(src_shape, false), ActivationDesc(dst_shape, false)},
      {ActivationDesc(src_shape, true, dt::f32, BlockedLayout::kChannelsLast),
       ActivationDesc(dst_shape, true, dt::f32, BlockedLayout::kChannelsLast)},
  };
  PerShape entry;
  std::string reference;
  try {
    for (const auto& [pool_src, pool_dst] : candidates) {
      dnnl::pooling_forward::primitive_desc pd;
      try {
        pd = dnnl::pooling_forward::primitive_desc(engine_, dnnl::prop_kind::forward_inference,
                                                   algorithm_, pool_src, pool_dst, strides, kernel,
                                                   dilation, pl, pr);
      } catch (const dnnl::error&) {
        continue;
      }
      const std::string impl = pd.impl_info_str();
      if (IsReferenceImplementation(impl)) {
        if (reference.empty()) reference = impl;
        if (entry.call.primitive) continue;  // keep the first as the last resort
      } else {
        entry = PerShape();
      }
      entry.call.primitive = dnnl::pooling_forward(pd);
      entry.call.args[DNNL_ARG_SRC] = UnboundMemory(pool_src, engine_);
      entry.call.args[DNNL_ARG_DST] = UnboundMemory(pool_dst, engine_);
      entry.impl = impl;
      entry.src_reordered = pool_src != src_md;
      entry.dst_reordered = pool_dst != dst_md;
      if (entry.src_reordered) entry.to_pool_src = BoundReorder(engine_, src_md, pool_src);
      if (entry.dst_reordered) entry.from_pool_dst = BoundReorder(engine_, pool_dst, dst_md);
      entry.dst_offset =
          entry.src_reordered ? (pool_src.get_size() / sizeof(float) + 15) / 16 * 16 : 0;
      entry.scratch_floats =
          entry.dst_offset + (entry.dst_reordered ? pool_dst.get_size() / sizeof(float) : 0);
      if (!IsReferenceImplementation(impl)) break;
    }
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, absl::StrCat("creating pooling for ", ShapeToString(src_shape)));
  }
  if (!entry.call.primitive) {
    return absl::UnimplementedError(
        absl::StrCat("oneDNN has no pooling for ", ShapeToString(src_shape)));
  }
  if (!reference.empty()) {
    LogReferencePool(src_shape, src_blocked, layout_, reference, &entry.impl);
  }
  return &per_shape_.Emplace(src_shape, std::move(entry));
}

absl::Status PoolOnednn::Execute(dnnl::stream& stream, const Shape& src_shape,
                                 const Shape& dst_shape, const float* src, float* dst,
                                 bool src_blocked, bool dst_blocked) {
  auto entry = Prepare(src_shape, dst_shape, src_blocked, dst_blocked);
  if (!entry.ok()) return entry.status();
  PerShape& e = **entry;
  float* scratch = nullptr;
  if (e.scratch_floats > 0) {
    if (scratch_.size() < e.scratch_floats) scratch_.resize(e.scratch_floats);
    scratch = scratch_.data();
  }
  const float* pool_src = e.src_reordered ? scratch : src;
  float* pool_dst = e.dst_reordered ? scratch + e.dst_offset : dst;
  try {
    if (e.src_reordered) RunReorder(e.to_pool_src, stream, src, scratch);
    e.call.SetHandle(DNNL_ARG_SRC, pool_src);
    e.call.SetHandle(DNNL_ARG_DST, pool_dst);
    e.call.Execute(stream);
    if (e.dst_reordered) RunReorder(e.from_pool_dst, stream, pool_dst, dst);
  } catch (const dnnl::error& err) {
    return DnnlErrorToStatus(err, "executing pooling");
  }
  return absl::OkStatus();
}

std::string PoolOnednn::ImplementationName(const Shape& src_shape) const {
  const PerShape* entry = per_shape_.Peek(src_shape);
  return entry == nullptr ? "" : entry->impl;
}

}  // namespace numaserve::kernels
