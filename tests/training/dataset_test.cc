#include "training/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>

#include "training/idx_file.h"

namespace numaserve::training {
namespace {

TEST(EpochOrderTest, IsAPermutationFixedBySeedAndEpoch) {
  const std::vector<int64_t> a = EpochOrder(1000, 42, 0);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(a, EpochOrder(1000, 42, 0));
  EXPECT_NE(a, EpochOrder(1000, 42, 1));
  EXPECT_NE(a, EpochOrder(1000, 43, 0));
}

TEST(DatasetTest, LoadLimitAndGather) {
  const std::string dir = ::testing::TempDir() + "/ds_" + std::to_string(getpid());
  IdxArray images{{4, 2, 2}, {}}, labels{{4}, {3, 1, 4, 1}};
  for (int i = 0; i < 16; ++i) images.data.push_back(static_cast<uint8_t>(i * 17));
  ASSERT_TRUE(WriteIdxFile(dir + "-img.gz", images, true).ok());
  ASSERT_TRUE(WriteIdxFile(dir + "-lbl.gz", labels, true).ok());
  absl::StatusOr<Dataset> data = LoadIdxDataset(dir + "-img.gz", dir + "-lbl.gz", 3);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size, 3);
  EXPECT_EQ(data->example_dims, (std::vector<int64_t>{2, 2}));
  const int64_t idx[2] = {2, 0};
  kernels::Tensor batch;
  std::vector<uint8_t> y;
  GatherBatch(*data, idx, 2, &batch, &y);
  EXPECT_EQ(batch.shape, (kernels::Shape{2, 1, 2, 2}));
  EXPECT_FLOAT_EQ(batch.data[0], 8 * 17 / 255.0f);
  EXPECT_FLOAT_EQ(batch.data[4], 0.0f);
  EXPECT_EQ(y, (std::vector<uint8_t>{4, 3}));
}

TEST(DatasetTest, LabelCountMismatchNamesBothFiles) {
  const std::string dir = ::testing::TempDir() + "/dsm_" + std::to_string(getpid());
  IdxArray images{{2, 1, 1}, {1, 2}}, labels{{3}, {0, 1, 2}};
  ASSERT_TRUE(WriteIdxFile(dir + "-img", images, false).ok());
  ASSERT_TRUE(WriteIdxFile(dir + "-lbl", labels, false).ok());
  absl::StatusOr<Dataset> data = LoadIdxDataset(dir + "-img", dir + "-lbl", 0);
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.status().message().find("3 labels for 2 images"), std::string::npos)
      << data.status();
}

}  // namespace
}  // namespace numaserve::training
