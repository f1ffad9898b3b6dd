// ONNX MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool on
// oneDNN's pooling_forward (plain NC[D]HW), one primitive per input shape
// (the kShapeCacheCapacity most recently run kept). ceil_mode is expressed
// as extra end padding, which oneDNN never reads for max and
// excludes for average-without-padding; the caller keeps count_include_pad
// with ceil_mode on the reference.
#pragma once

#include <cstdint>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/bounded_cache.h"
#include "kernels/onednn/conv_onednn.h"
#include "kernels/onednn/onednn_common.h"
#include "kernels/ref/conv_ref.h"

namespace numaserve::kernels {

class PoolOnednn {
 public:
  PoolOnednn(const dnnl::engine& engine, dnnl::algorithm algorithm, WindowParams window,
             bool global, BlockedLayout layout = BlockedLayout::kChannelBlocked)
      : engine_(engine),
        algorithm_(algorithm),
        window_(std::move(window)),
        global_(global),
        layout_(layout) {}

  // *_blocked: the blocked layout `layout` (ActivationDesc) instead of
  // plain. When the
  // layouts differ, the pool writes src's layout into a scratch buffer that
  // is then reordered.
  absl::Status Execute(dnnl::stream& stream, const Shape& src_shape, const Shape& dst_shape,
                       const float* src, float* dst, bool src_blocked = false,
                       bool dst_blocked = false);
  // oneDNN's implementation for this input shape ("" before its first run).
  std::string ImplementationName(const Shape& src_shape) const;
  // Input shapes whose primitive is kept.
  size_t cached_shapes() const { return per_shape_.size(); }
  BlockedLayout layout() const { return layout_; }

 private:
  // The pool for one input shape. It runs in src's layout and writes that
  // layout, reordered into dst's when they differ; where oneDNN has only its
  // reference kernel for src's layout, in plain or channels-last layouts,
  // reordered at both ends through scratch_.
  struct PerShape {
    BoundPrimitive call;
    std::string impl;
    bool src_reordered = false, dst_reordered = false;
    BoundPrimitive to_pool_src, from_pool_dst;
    size_t dst_offset = 0;      // floats into the scratch
    size_t scratch_floats = 0;  // 0: none needed
  };
  // Valid until the next entry is created.
  absl::StatusOr<PerShape*> Prepare(const Shape& src_shape, const Shape& dst_shape,
                                    bool src_blocked, bool dst_blocked);

  dnnl::engine engine_;
  dnnl::algorithm algorithm_;
  WindowParams window_;
  bool global_;
  BlockedLayout layout_;
  BoundedCache<Shape, PerShape> per_shape_{kShapeCacheCapacity};
  std::vector<float> scratch_;  // the largest entry's
};

}  // namespace numaserve::kernels
