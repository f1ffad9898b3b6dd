#include "training/idx_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/prerequisites.h"

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
  if (access(path.c_str(), R_OK) != 0) NUMASERVE_MISSING_PREREQUISITE() << path << " not installed";
  absl::StatusOr<IdxArray> read = ReadIdxFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->dims, (std::vector<int64_t>{10000}));
  for (uint8_t label : read->data) ASSERT_LT(label, 10);
}

// An IDX header: magic for unsigned bytes, then big-endian dims.
std::string Header(const std::vector<uint32_t>& dims) {
  std::string h = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8)
      h.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  return h;
}

TEST(IdxFileTest, DimsWhoseProductWrapsAreAnError) {
  // 65536^4 = 2^64 wrapped to 0 in size_t: an empty body matched it and the
  // dims described 2^64 bytes that were not there.
  const std::string path = TempPath("wrap");
  WriteBytes(path, Header({65536, 65536, 65536, 65536}));
  absl::StatusOr<IdxArray> read = ReadIdxFile(path);
  ASSERT_FALSE(read.ok()) << "dims " << read->dims.size() << ", " << read->data.size() << " bytes";
  EXPECT_NE(read.status().message().find("dims 65536x65536x65536x65536"), std::string::npos)
      << read.status();
  // 8 dims of 2^32 - 1 (the largest header there is).
  WriteBytes(path, Header(std::vector<uint32_t>(8, 0xffffffffu)) + std::string(64, '\x01'));
  read = ReadIdxFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << read.status();
}

TEST(IdxFileTest, SizesNearTwoToThe32AreCheckedAgainstTheBody) {
  const std::string path = TempPath("near32");
  // 2^32 - 1 bytes claimed, 16 present: truncated, nothing allocated for it.
  WriteBytes(path, Header({0xffffffffu}) + std::string(16, '\x02'));
  absl::StatusOr<IdxArray> read = ReadIdxFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_NE(read.status().message().find("4294967295 elements"), std::string::npos)
      << read.status();
  // 65536 x 65537 = 2^32 + 65536: above the default cap of 4 GiB, refused
  // from the header alone.
  WriteBytes(path, Header({65536, 65537}));
  read = ReadIdxFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << read.status();
  EXPECT_NE(read.status().message().find("describe more than 4294967296 bytes"), std::string::npos)
      << read.status();
  // No images, but rows of 3275520 x 65535 x 4278190080 bytes: 0 bytes in
  // all, yet no caller can size a row (a dataset's row size overflowed).
  WriteBytes(path, Header({0, 3275520u, 65535u, 4278190080u}));
  read = ReadIdxFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << read.status();
  EXPECT_NE(read.status().message().find("dims 0x3275520x65535x4278190080 describe more than"),
            std::string::npos)
      << read.status();
  // An empty file of sane rows is still an empty array.
  WriteBytes(path, Header({0, 28, 28}));
  read = ReadIdxFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->dims, (std::vector<int64_t>{0, 28, 28}));
  EXPECT_TRUE(read->data.empty());
}

TEST(IdxFileTest, ReadsAtMostTheCap) {
  const std::string path = TempPath("cap.gz");
  IdxArray big;
  big.dims = {4096, 1024};
  big.data.assign(4096 * 1024, 7);  // 4 MiB, a few KiB gzipped
  ASSERT_TRUE(WriteIdxFile(path, big, /*gzip=*/true).ok());
  absl::StatusOr<IdxArray> read = ReadIdxFile(path, /*max_bytes=*/1 << 20);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kResourceExhausted) << read.status();
  read = ReadIdxFile(path, /*max_bytes=*/4 << 20);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->data.size(), 4u << 20);
}

// A symbolic link planted at the temporary name the writer once used
// (FILE.tmp) is not followed, plain or gzipped: the file it points to
// keeps its contents and FILE is a regular file of its own.
TEST(IdxFileTest, ALinkPlantedAtTheOldTemporaryNameIsNotFollowed) {
  for (bool gzip : {false, true}) {
    SCOPED_TRACE(gzip ? "gzip" : "plain");
    const std::string path = TempPath(gzip ? "planted.gz" : "planted");
    const std::string target = TempPath("planted_target");
    WriteBytes(target, "precious");
    std::remove((path + ".tmp").c_str());
    ASSERT_EQ(symlink(target.c_str(), (path + ".tmp").c_str()), 0);
    ASSERT_TRUE(WriteIdxFile(path, Sample(), gzip).ok());
    EXPECT_EQ(ReadBytes(target), "precious");
    struct stat st{};
    ASSERT_EQ(lstat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    absl::StatusOr<IdxArray> read = ReadIdxFile(path);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->data, Sample().data);
    // The link is where it was, pointing where it did.
    ASSERT_EQ(lstat((path + ".tmp").c_str(), &st), 0);
    EXPECT_TRUE(S_ISLNK(st.st_mode));
    for (const std::string& f : {path, path + ".tmp", target}) std::remove(f.c_str());
  }
}
}  // namespace
}  // namespace numaserve::training
