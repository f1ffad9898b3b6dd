#include "engine/training/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace numaserve::training {
namespace {

TEST(CheckpointTest, RoundTripAndNoTemporaryLeft) {
  const std::string path = ::testing::TempDir() + "/ckpt_" + std::to_string(getpid());
  Checkpoint c;
  c.step = 17;
  c.tensors = {{"fc1.weight", {1.5f, -2.0f, 3.0f}}, {"optimizer/0", {}}};
  ASSERT_TRUE(WriteCheckpoint(path, c).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  absl::StatusOr<Checkpoint> r = ReadCheckpoint(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 17);
  EXPECT_EQ(r->tensors, c.tensors);
}

TEST(CheckpointTest, TruncatedFileNamesOffset) {
  const std::string path = ::testing::TempDir() + "/ckpt_t_" + std::to_string(getpid());
  Checkpoint c;
  c.tensors = {{"w", std::vector<float>(100, 1.0f)}};
  ASSERT_TRUE(WriteCheckpoint(path, c).ok());
  std::filesystem::resize_file(path, 200);
  absl::StatusOr<Checkpoint> r = ReadCheckpoint(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("truncated at offset 200"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("'w'"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace numaserve::training
