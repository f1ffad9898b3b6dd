// EltwiseStep and ChannelScaleStep (eltwise_steps.h).
#include "engine/compiler/eltwise_steps.h"

#include <omp.h>

#include "absl/strings/str_cat.h"
#include "kernels/onednn/onednn_common.h"
#include "kernels/tensor.h"

namespace numaserve::engine {

int64_t EltwiseStep::Count(const Shape& shape) const {
  return dst_blocked_
             ? kernels::ActivationBytes(shape, true, layout_) / static_cast<int64_t>(sizeof(float))
             : kernels::NumElements(shape);
}

absl::Status EltwiseStep::Run(const StepContext& ctx) {
  const Shape& shape = ctx.shapes[dst_];
  const float* x = ctx.data[src_];
  float* y = ctx.data[dst_];
  if (kernels::NumElements(shape) == 0) return absl::OkStatus();
  if (src_blocked_ != dst_blocked_) {
    if (absl::Status s = reorder_.Execute(ctx.stream, shape, x, src_blocked_, y, dst_blocked_);
        !s.ok()) {
      return s;
    }
    x = y;
  }
  return kernel_.Execute(ctx.stream, Count(shape), x, y);
}

bool ChannelScaleStep::Fits(const Shape& x, const Shape& scale) {
  if (x.size() < 3 || x.size() > 5 || scale.size() != x.size() || scale[1] != x[1]) return false;
  if (scale[0] != 1 && scale[0] != x[0]) return false;
  for (size_t d = 2; d < scale.size(); ++d) {
    if (scale[d] != 1) return false;
  }
  return true;
}

namespace {

// The channel-blocked case: `rows` x `blocks` blocks of `spatial` x Block
// floats; channel c of row r scaled by s[r * s_row + c] (0 in the padding
// past `channels`, which holds zeros).
template <int Block>
void ScaleBlocked(const float* x, const float* s, float* y, int64_t rows, int64_t channels,
                  int64_t spatial, int64_t s_row) {
  const int64_t blocks = (channels + Block - 1) / Block;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows * blocks; ++i) {
    const int64_t row = i / blocks, first = (i % blocks) * Block;
    float k[Block];
    for (int l = 0; l < Block; ++l) k[l] = first + l < channels ? s[row * s_row + first + l] : 0.0f;
    const float* xi = x + i * spatial * Block;
    float* yi = y + i * spatial * Block;
    for (int64_t p = 0; p < spatial; ++p) {
      for (int l = 0; l < Block; ++l) yi[p * Block + l] = xi[p * Block + l] * k[l];
    }
  }
}

}  // namespace

absl::Status ChannelScaleStep::Run(const StepContext& ctx) {
  const Shape& xs = ctx.shapes[x_];
  const Shape& ss = ctx.shapes[scale_];
  if (!Fits(xs, ss) || ctx.shapes[dst_] != xs) {
    return absl::InvalidArgumentError(
        absl::StrCat("a per-channel scale of shape ", kernels::ShapeToString(ss),
                     " does not fit the tensor of shape ", kernels::ShapeToString(xs)));
  }
  const int64_t rows = xs[0], channels = xs[1];
  const int64_t spatial = kernels::NumElements(xs) / std::max<int64_t>(rows * channels, 1);
  // A scale row's floats: its channels, padded to the block where it is
  // channel-blocked (nhwc's [N, 1, 1, C] is the plain order).
  const int64_t block = kernels::ActivationChannelBlock();
  const int64_t padded = scale_blocked_ && layout_ == kernels::BlockedLayout::kChannelBlocked
                             ? (channels + block - 1) / block * block
                             : channels;
  const int64_t s_row = ss[0] == 1 ? 0 : padded;
  const float* x = ctx.data[x_];
  const float* s = ctx.data[scale_];
  float* y = ctx.data[dst_];
  if (kernels::NumElements(xs) == 0) return absl::OkStatus();
  if (x_blocked_ != dst_blocked_) {
    if (absl::Status st = reorder_.Execute(ctx.stream, xs, x, x_blocked_, y, dst_blocked_);
        !st.ok()) {
      return st;
    }
    x = y;
  }
  if (!dst_blocked_) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows * channels; ++i) {
      const float k = s[(i / channels) * s_row + i % channels];
      const float* xi = x + i * spatial;
      float* yi = y + i * spatial;
      for (int64_t p = 0; p < spatial; ++p) yi[p] = xi[p] * k;
    }
  } else if (layout_ == kernels::BlockedLayout::kChannelsLast) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows * spatial; ++i) {
      const float* si = s + (i / spatial) * s_row;
      const float* xi = x + i * channels;
      float* yi = y + i * channels;
      for (int64_t c = 0; c < channels; ++c) yi[c] = xi[c] * si[c];
    }
  } else if (block == 16) {
    ScaleBlocked<16>(x, s, y, rows, channels, spatial, s_row);
  } else {
    ScaleBlocked<8>(x, s, y, rows, channels, spatial, s_row);
  }
  return absl::OkStatus();
}

}  // namespace numaserve::engine
