#include "engine/training/idx_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>

namespace numaserve::training {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/idx_" + std::to_string(getpid()) + "_" + name;
}

IdxArray Sample() {
  IdxArray a;
  a.dims = {3, 2, 2};
  for (int i = 0; i < 12; ++i) a.data.push_back(static_cast<uint8_t>(i * 20));
  return a;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

TEST(IdxFileTest, RoundTripPlainAndGzipped) {
  for (bool gzip : {false, true}) {
    const std::string path = TempPath(gzip ? "a.gz" : "a");
    ASSERT_TRUE(WriteIdxFile(path, Sample(), gzip).ok());
    absl::StatusOr<IdxArray> read = ReadIdxFile(path);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->dims, Sample().dims);
    EXPECT_EQ(read->data, Sample().data);
  }
}

TEST(IdxFileTest, TruncatedBodyNamesFileAndOffset) {
  const std::string path = TempPath("trunc");
  ASSERT_TRUE(WriteIdxFile(path, Sample(), false).ok());
  WriteBytes(path, ReadBytes(path).substr(0, 20));  // header 16 + 4 of 12 data bytes
  absl::StatusOr<IdxArray> read = ReadIdxFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status();
  EXPECT_NE(read.status().message().find("truncated at offset 20"), std::string::npos)
      << read.status();
}

TEST(IdxFileTest, TruncatedGzipStreamIsAnError) {
  const std::string path = TempPath("trunc.gz");
  ASSERT_TRUE(WriteIdxFile(path, Sample(), true).ok());
  const std::string bytes = ReadBytes(path);
  WriteBytes(path, bytes.substr(0, bytes.size() - 12));  // cut the gzip trailer and some data
  absl::StatusOr<IdxArray> read = ReadIdxFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status();
  EXPECT_NE(read.status().message().find("offset"), std::string::npos) << read.status();
}

TEST(IdxFileTest, CorruptGzipDataIsAnError) {
  const std::string path = TempPath("corrupt.gz");
  ASSERT_TRUE(WriteIdxFile(path, Sample(), true).ok());
  std::string bytes = ReadBytes(path);
  for (size_t i = 12; i < bytes.size() - 8; ++i) bytes[i] = static_cast<char>(0xff ^ bytes[i]);
  WriteBytes(path, bytes);
  absl::StatusOr<IdxArray> read = ReadIdxFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status();
}

TEST(IdxFileTest, BadMagicAndTypeAreNamed) {
  const std::string path = TempPath("magic");
  WriteBytes(path, std::string("\x01\x00\x08\x01\x00\x00\x00\x01\x05", 9));
  absl::StatusOr<IdxArray> read = ReadIdxFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("offset 0"), std::string::npos) << read.status();
  WriteBytes(path, std::string("\x00\x00\x0d\x01\x00\x00\x00\x01\x05\x00\x00\x00", 12));
  read = ReadIdxFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("offset 2"), std::string::npos) << read.status();
}

TEST(IdxFileTest, MissingFileIsNotFound) {
  absl::StatusOr<IdxArray> read = ReadIdxFile(TempPath("does-not-exist"));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
}

TEST(IdxFileTest, ReadsFashionMnistWhenInstalled) {
  const std::string path = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
  if (access(path.c_str(), R_OK) != 0) GTEST_SKIP() << path << " not installed";
  absl::StatusOr<IdxArray> read = ReadIdxFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->dims, (std::vector<int64_t>{10000}));
  for (uint8_t label : read->data) ASSERT_LT(label, 10);
}

}  // namespace
}  // namespace numaserve::training
