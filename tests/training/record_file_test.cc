#include "engine/training/record_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace numaserve::training {
namespace {

namespace fs = std::filesystem;

std::string Temp(const std::string& name) {
  return ::testing::TempDir() + "/rec_" + std::to_string(getpid()) + "_" + name;
}

Dataset Sample() {
  Dataset d;
  d.size = 3;
  d.example_dims = {2, 3};
  for (int i = 0; i < 18; ++i) d.images.push_back(static_cast<uint8_t>(i * 7));
  d.labels = {4, 0, 9};
  return d;
}

TEST(RecordFileTest, RoundTripAndLimit) {
  const std::string path = Temp("a.nsrec");
  ASSERT_TRUE(WriteRecordFile(path, Sample()).ok());
  EXPECT_TRUE(fs::exists(path + ".idx"));
  absl::StatusOr<Dataset> d = ReadRecordFile(path, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 3);
  EXPECT_EQ(d->example_dims, Sample().example_dims);
  EXPECT_EQ(d->images, Sample().images);
  EXPECT_EQ(d->labels, Sample().labels);
  absl::StatusOr<Dataset> two = ReadRecordFile(path, 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->size, 2);
  EXPECT_EQ(two->labels, (std::vector<uint8_t>{4, 0}));
}

TEST(RecordFileTest, TruncatedDataAndWrongIndexAreNamed) {
  const std::string path = Temp("b.nsrec");
  ASSERT_TRUE(WriteRecordFile(path, Sample()).ok());
  const uintmax_t size = fs::file_size(path);
  fs::resize_file(path, size - 5);
  absl::StatusOr<Dataset> d = ReadRecordFile(path, 0);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(path + ": truncated at offset " + std::to_string(size - 5)),
            std::string::npos)
      << d.status();
  ASSERT_TRUE(WriteRecordFile(path, Sample()).ok());
  Dataset other = Sample();
  other.size = 2;
  ASSERT_TRUE(WriteRecordFile(Temp("c.nsrec"), other).ok());
  fs::copy_file(Temp("c.nsrec") + ".idx", path + ".idx", fs::copy_options::overwrite_existing);
  d = ReadRecordFile(path, 0);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(".idx: lists 2 records"), std::string::npos) << d.status();
}

TEST(RecordFileTest, RawTensorDirectory) {
  const std::string dir = Temp("raw");
  fs::create_directories(dir + "/1");
  fs::create_directories(dir + "/0");
  auto write = [](const std::string& p, std::string bytes) {
    std::ofstream(p, std::ios::binary) << bytes;
  };
  write(dir + "/1/b.raw", "\x05\x06\x07\x08");
  write(dir + "/1/a.raw", "\x01\x02\x03\x04");
  write(dir + "/0/z.raw", "\x09\x09\x09\x09");
  absl::StatusOr<Dataset> d = ReadRawTensorDirectory(dir, {2, 2});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 3);
  EXPECT_EQ(d->labels, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(d->images[4], 1);  // label 1's files in name order: a before b
  write(dir + "/0/short.raw", "\x01");
  d = ReadRawTensorDirectory(dir, {2, 2});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("short.raw: 1 bytes, expected 4"), std::string::npos)
      << d.status();
}

}  // namespace
}  // namespace numaserve::training
