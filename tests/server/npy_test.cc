#include "server/npy.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace numaserve::server {
namespace {

std::string WriteFile(const std::string& name, const std::string& bytes) {
  std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string NpyBytes(const std::string& dict, const std::string& data) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + data;
}

TEST(NpyTest, ReadsFloat32CArray) {
  float v[6] = {1, 2, 3, 4, 5, 6};
  std::string path =
      WriteFile("a.npy", NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                                  std::string(reinterpret_cast<char*>(v), sizeof v)));
  auto a = ReadNpy(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, "<f4");
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->data.size(), sizeof v);
}

TEST(NpyTest, ErrorsNameTheFile) {
  auto missing = ReadNpy("/nonexistent/x.npy");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/x.npy"), absl::string_view::npos);
  std::string truncated = WriteFile(
      "t.npy", NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", "abc"));
  auto t = ReadNpy(truncated);
  EXPECT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("t.npy"), absl::string_view::npos) << t.status();
  std::string fortran = WriteFile(
      "f.npy", NpyBytes("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", "abcd"));
  EXPECT_FALSE(ReadNpy(fortran).ok());
  EXPECT_FALSE(ReadNpy(WriteFile("g.npy", "garbage")).ok());
}

}  // namespace
}  // namespace numaserve::server
