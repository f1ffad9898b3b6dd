#include "training/record_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

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

Dataset Numbered(int64_t n) {
  Dataset d;
  d.size = n;
  d.example_dims = {3};
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 3; ++k) d.images.push_back(static_cast<uint8_t>((i * 3 + k) % 256));
    d.labels.push_back(static_cast<uint8_t>(i % 10));
  }
  return d;
}

TEST(RecordFileReaderTest, GathersOnlyTheRecordsAskedForOneReadPerAdjacentRun) {
  const std::string path = Temp("reader.nsrec");
  const Dataset data = Numbered(10);
  ASSERT_TRUE(WriteRecordFile(path, data).ok());
  absl::StatusOr<std::unique_ptr<RecordFileReader>> reader = RecordFileReader::Open(path, 0);
  ASSERT_TRUE(reader.ok()) << reader.status();
  RecordFileReader& r = **reader;
  EXPECT_EQ(r.size(), 10);
  EXPECT_EQ(r.example_dims(), data.example_dims);
  EXPECT_EQ(r.record_bytes(), 4);
  const RecordFileReader::Stats opened = r.stats();
  EXPECT_EQ(opened.records, 0);  // Open reads the header and the index only
  EXPECT_LT(opened.bytes, 12 + 8 + 8 + 1);

  const int64_t indices[] = {7, 3, 5, 4};  // runs 3..5 and 7: two reads
  kernels::Tensor got, want;
  std::vector<uint8_t> got_labels, want_labels;
  ASSERT_TRUE(r.Gather(indices, 4, &got, &got_labels).ok());
  GatherBatch(data, indices, 4, &want, &want_labels);
  EXPECT_EQ(got.shape, want.shape);
  EXPECT_EQ(got.data, want.data);
  EXPECT_EQ(got_labels, want_labels);
  const RecordFileReader::Stats after = r.stats();
  EXPECT_EQ(after.records - opened.records, 4);
  EXPECT_EQ(after.bytes - opened.bytes, 4 * r.record_bytes());
  EXPECT_EQ(after.reads - opened.reads, 2);

  const int64_t out_of_range[] = {10};
  EXPECT_FALSE(r.Gather(out_of_range, 1, &got, &got_labels).ok());
}

TEST(RecordFileReaderTest, LimitAndAFileTruncatedAfterOpenNameTheOffset) {
  const std::string path = Temp("cut.nsrec");
  ASSERT_TRUE(WriteRecordFile(path, Numbered(10)).ok());
  absl::StatusOr<std::unique_ptr<RecordFileReader>> limited = RecordFileReader::Open(path, 6);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ((*limited)->size(), 6);
  absl::StatusOr<std::unique_ptr<RecordFileReader>> reader = RecordFileReader::Open(path, 0);
  ASSERT_TRUE(reader.ok());
  const uintmax_t size = fs::file_size(path);
  fs::resize_file(path, size - 6);  // record 9 and half of record 8
  const int64_t indices[] = {1, 8, 9};
  kernels::Tensor batch;
  std::vector<uint8_t> labels;
  absl::Status s = (*reader)->Gather(indices, 3, &batch, &labels);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find(path + ": truncated at offset " + std::to_string(size - 6)),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("from record 8"), std::string::npos) << s;
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

// A record file's header: magic, u32 rank, u64 dims, u64 count.
std::string RecordHeader(const std::vector<uint64_t>& dims, uint64_t count) {
  std::string h = "NSREC001";
  const uint32_t rank = static_cast<uint32_t>(dims.size());
  h.append(reinterpret_cast<const char*>(&rank), 4);
  for (uint64_t d : dims) h.append(reinterpret_cast<const char*>(&d), 8);
  h.append(reinterpret_cast<const char*>(&count), 8);
  return h;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(RecordFileTest, ExampleDimsWhoseProductWrapsAreAnError) {
  // 2^32 x 2^32 wrapped to 0, a record of 1 byte, and 0 records matched an
  // empty body: the reader opened, promising 2^64-byte examples.
  const std::string path = Temp("wrap.nsrec");
  WriteFile(path, RecordHeader({uint64_t{1} << 32, uint64_t{1} << 32}, 0));
  WriteFile(path + ".idx", std::string("NSIDX001") + std::string(8, '\0'));
  auto r = RecordFileReader::Open(path, 0);
  ASSERT_FALSE(r.ok()) << "opened with dims of " << (*r)->example_dims().size();
  EXPECT_NE(r.status().message().find("example dims"), std::string::npos) << r.status();
  // A dim above INT64_MAX.
  WriteFile(path, RecordHeader({~uint64_t{0}}, 0));
  EXPECT_FALSE(RecordFileReader::Open(path, 0).ok());
}

TEST(RecordFileTest, CountWhoseSizeWrapsIsAnError) {
  // count * record + header wraps around 2^64 to the file's own size.
  const std::string path = Temp("count.nsrec");
  const std::string header = RecordHeader({3}, 0);
  // record = 4 bytes; count = 2^62 + k makes count * 4 = 2^64 + 4k ≡ 4k.
  const uint64_t count = (uint64_t{1} << 62) + 2;
  WriteFile(path, RecordHeader({3}, count) + std::string(8, '\x05'));  // 2 records' worth
  WriteFile(path + ".idx", std::string("NSIDX001"));
  auto r = RecordFileReader::Open(path, 0);
  ASSERT_FALSE(r.ok()) << "opened with " << (*r)->size() << " records";
  EXPECT_NE(r.status().message().find("truncated at offset"), std::string::npos) << r.status();
}

TEST(RecordFileTest, AnOversizedIndexIsNotRead) {
  const std::string path = Temp("bigidx.nsrec");
  ASSERT_TRUE(WriteRecordFile(path, Sample()).ok());
  std::ofstream(path + ".idx", std::ios::binary | std::ios::app) << std::string(1 << 16, '\0');
  auto r = RecordFileReader::Open(path, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than the 40"), std::string::npos) << r.status();
}

// The files left in `path`'s directory whose names start with its name.
std::vector<std::string> FilesBeside(const std::string& path) {
  std::vector<std::string> names;
  const std::string stem = fs::path(path).filename().string();
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    const std::string name = e.path().filename().string();
    if (name.rfind(stem, 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A symbolic link planted at the temporary names the writer once used
// (FILE.tmp, FILE.idx.tmp) is not followed: the file it points to keeps
// its contents, FILE and FILE.idx are regular files of their own, and no
// temporary file is left.
TEST(RecordFileTest, ALinkPlantedAtTheOldTemporaryNameIsNotFollowed) {
  const std::string path = Temp("planted.nsrec");
  const std::string target = Temp("planted_target");
  std::ofstream(target, std::ios::binary | std::ios::trunc) << "precious";
  for (const std::string& link : {path + ".tmp", path + ".idx.tmp"}) {
    fs::remove(link);
    fs::create_symlink(target, link);
  }
  ASSERT_TRUE(WriteRecordFile(path, Sample()).ok());
  std::ifstream in(target, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "precious");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path)));
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path + ".idx")));
  absl::StatusOr<Dataset> d = ReadRecordFile(path, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->labels, Sample().labels);
  EXPECT_EQ(FilesBeside(path),
            (std::vector<std::string>{fs::path(path).filename().string(),
                                      fs::path(path).filename().string() + ".idx",
                                      fs::path(path).filename().string() + ".idx.tmp",
                                      fs::path(path).filename().string() + ".tmp"}));
  for (const std::string& f : {path, path + ".idx", path + ".tmp", path + ".idx.tmp", target}) {
    fs::remove(f);
  }
}
}  // namespace
}  // namespace numaserve::training
