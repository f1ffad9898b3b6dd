#include "base/atomic_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace numaserve::base {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("atomic_file_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string Read(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // The names in dir_, sorted.
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

TEST_F(AtomicFileTest, WritesAndReplacesWithTheModeAskedFor) {
  const std::string path = dir_ / "data";
  ASSERT_TRUE(WriteFileAtomically(path, "first", 0640).ok());
  EXPECT_EQ(Read(path), "first");
  struct stat st{};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  ASSERT_TRUE(WriteFileAtomically(path, std::string(1 << 20, 'x')).ok());
  EXPECT_EQ(Read(path), std::string(1 << 20, 'x'));
  EXPECT_EQ(Names(), std::vector<std::string>{"data"});  // no temporary file left
}

// The temporary file gets a fresh random name: links planted at the names
// a writer might have used are not followed, and a link at the target is
// replaced, never written through.
TEST_F(AtomicFileTest, PlantedLinksAreNotFollowed) {
  const fs::path target = dir_ / "precious";
  std::ofstream(target) << "precious";
  const std::string path = dir_ / "data";
  for (const char* suffix : {".tmp", ".tmp.XXXXXX", ".tmp.0"}) {
    fs::create_symlink(target, path + suffix);
  }
  fs::create_symlink(target, path);
  ASSERT_TRUE(WriteFileAtomically(path, "new").ok());
  EXPECT_EQ(Read(target), "precious");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path)));
  EXPECT_EQ(Read(path), "new");
  EXPECT_EQ(Names(), (std::vector<std::string>{"data", "data.tmp", "data.tmp.0", "data.tmp.XXXXXX",
                                               "precious"}));
}

TEST_F(AtomicFileTest, FailuresNameTheFileAndLeaveNothing) {
  const std::string missing = dir_ / "no" / "such" / "data";
  absl::Status s = WriteFileAtomically(missing, "x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(missing), std::string::npos) << s;
  // A directory in the way of the rename: the temporary file is removed.
  fs::create_directories(dir_ / "dir" / "inside");
  s = WriteFileAtomically(dir_ / "dir", "x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rename"), std::string::npos) << s;
  EXPECT_EQ(Names(), std::vector<std::string>{"dir"});
}

TEST_F(AtomicFileTest, DiscardRemovesTheTemporaryFile) {
  const std::string path = dir_ / "data";
  absl::StatusOr<TempFile> tmp = CreateTempFileBeside(path, 0644);
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  EXPECT_EQ(tmp->path.rfind(path + ".tmp.", 0), 0u) << tmp->path;
  EXPECT_NE(fcntl(tmp->fd, F_GETFD) & FD_CLOEXEC, 0);
  DiscardTempFile(*tmp);
  EXPECT_EQ(tmp->fd, -1);
  EXPECT_TRUE(Names().empty());
}

}  // namespace
}  // namespace numaserve::base
