#include "engine/compiler/concat_step.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/tensor.h"

namespace numaserve::engine {

absl::Status ConcatStep::Run(const StepContext& ctx) {
  const Shape& out = ctx.shapes[dst_];
  const size_t axis = static_cast<size_t>(axis_);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis && d < out.size(); ++d) outer *= out[d];
  for (size_t d = axis + 1; d < out.size(); ++d) inner *= out[d];
  const int64_t out_block = axis < out.size() ? out[axis] * inner : 0;
  // Each input's block per outer index and where it starts in the output's.
  std::vector<int64_t> block(inputs_.size()), start(inputs_.size());
  int64_t at = 0;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const Shape& in = ctx.shapes[inputs_[i]];
    block[i] = axis < in.size() ? in[axis] * inner : 0;
    start[i] = at;
    at += block[i];
  }
  float* y = ctx.data[dst_];
  if (outer == 0 || out_block == 0) return absl::OkStatus();
#pragma omp parallel
  {
    const int threads = omp_get_num_threads(), id = omp_get_thread_num();
    if (outer >= threads) {
      const int64_t begin = outer * id / threads, end = outer * (id + 1) / threads;
      for (int64_t o = begin; o < end; ++o) {
        for (size_t i = 0; i < inputs_.size(); ++i) {
          std::memcpy(y + o * out_block + start[i], ctx.data[inputs_[i]] + o * block[i],
                      static_cast<size_t>(block[i]) * sizeof(float));
        }
      }
    } else {
      // Few outer indices (a concat along dim 0 or 1 of a small batch):
      // each thread its share of every block.
      for (int64_t o = 0; o < outer; ++o) {
        for (size_t i = 0; i < inputs_.size(); ++i) {
          const int64_t begin = block[i] * id / threads, end = block[i] * (id + 1) / threads;
          if (end > begin) {
            std::memcpy(y + o * out_block + start[i] + begin,
                        ctx.data[inputs_[i]] + o * block[i] + begin,
                        static_cast<size_t>(end - begin) * sizeof(float));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace numaserve::engine
