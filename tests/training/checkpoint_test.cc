#include "training/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "base/atomic_file.h"

namespace numaserve::training {
namespace {

TEST(CheckpointTest, RoundTripAndNoTemporaryLeft) {
  const std::string path = ::testing::TempDir() + "/ckpt_" + std::to_string(getpid());
  Checkpoint c;
  c.step = 17;
  c.tensors = {{"fc1.weight", {1.5f, -2.0f, 3.0f}}, {"optimizer/0", {}}};
  ASSERT_TRUE(WriteCheckpoint(path, c).ok());
  const std::string tmp_prefix = std::filesystem::path(path).filename().string() + ".tmp";
  for (const auto& entry : std::filesystem::directory_iterator(::testing::TempDir())) {
    EXPECT_FALSE(entry.path().filename().string().starts_with(tmp_prefix)) << entry.path();
  }
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

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

TEST(CheckpointTest, NameLengthNearTwoToThe32DoesNotWrap) {
  // name_len + 8 in uint32 wrapped to a few bytes, the check passed, and the
  // reader went on past the end of the file.
  for (uint32_t name_len : {0xfffffff8u, 0xfffffffcu, 0xffffffffu}) {
    const std::string path = ::testing::TempDir() + "/ckpt_wrap_" + std::to_string(getpid());
    std::string bytes = "NSCKPT01";
    Put<uint64_t>(bytes, 3);  // step
    Put<uint64_t>(bytes, 1);  // one tensor
    Put<uint32_t>(bytes, name_len);
    bytes += "w";
    Put<uint64_t>(bytes, 1);
    Put<float>(bytes, 1.0f);
    ASSERT_TRUE(base::WriteFileAtomically(path, bytes).ok());
    absl::StatusOr<Checkpoint> r = ReadCheckpoint(path);
    ASSERT_FALSE(r.ok()) << name_len;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find("a tensor name"), std::string::npos) << r.status();
  }
}

TEST(CheckpointTest, ElementCountNearTwoToThe62IsNotAllocated) {
  // n * 4 wraps for n = 2^62: compared as a count, nothing is allocated.
  const std::string path = ::testing::TempDir() + "/ckpt_count_" + std::to_string(getpid());
  std::string bytes = "NSCKPT01";
  Put<uint64_t>(bytes, 3);
  Put<uint64_t>(bytes, 1);
  Put<uint32_t>(bytes, 1);
  bytes += "w";
  Put<uint64_t>(bytes, uint64_t{1} << 62);
  Put<float>(bytes, 1.0f);
  ASSERT_TRUE(base::WriteFileAtomically(path, bytes).ok());
  absl::StatusOr<Checkpoint> r = ReadCheckpoint(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("needs 4611686018427387904 float32 elements"),
            std::string::npos)
      << r.status();
}
}  // namespace
}  // namespace numaserve::training
