#include "engine/training/batch_prefetcher.h"

#include <gtest/gtest.h>

namespace numaserve::training {
namespace {

Dataset MakeData(int64_t n) {
  Dataset d;
  d.size = n;
  d.example_dims = {2, 2};
  for (int64_t i = 0; i < n * 4; ++i) d.images.push_back(static_cast<uint8_t>(i % 251));
  for (int64_t i = 0; i < n; ++i) d.labels.push_back(static_cast<uint8_t>(i % 10));
  return d;
}

TEST(BatchPrefetcherTest, SameBatchesAsDirectGatherAcrossEpochsAndJumps) {
  const Dataset data = MakeData(50);  // 6 steps of 8 per epoch
  BatchPrefetcher prefetcher(&data, {.seed = 5, .global_batch = 8, .rank = 1, .ranks = 2});
  for (int64_t step : {0, 1, 2, 5, 6, 7, 13, 3, 4}) {  // epoch boundary, then jumps back
    kernels::Tensor got, want;
    std::vector<uint8_t> got_labels, want_labels;
    prefetcher.Get(step, &got, &got_labels);
    const std::vector<int64_t> order = EpochOrder(50, 5, step / 6);
    GatherBatch(data, &order[(step % 6) * 8 + 4], 4, &want, &want_labels);
    EXPECT_EQ(got.shape, want.shape) << "step " << step;
    EXPECT_EQ(got.data, want.data) << "step " << step;
    EXPECT_EQ(got_labels, want_labels) << "step " << step;
  }
}

}  // namespace
}  // namespace numaserve::training
