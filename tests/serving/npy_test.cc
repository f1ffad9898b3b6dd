#include "tools/numaserve/npy.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace numaserve::cli {
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

TEST(NpyTest, ReadsEveryNumericDtype) {
  struct Case {
    std::string descr, normalized;
    size_t item;
  };
  for (const Case& c :
       {Case{"<i8", "<i8", 8}, Case{"<u8", "<u8", 8}, Case{"<f8", "<f8", 8}, Case{"<i4", "<i4", 4},
        Case{"<u4", "<u4", 4}, Case{"<f4", "<f4", 4}, Case{"<i2", "<i2", 2}, Case{"<u2", "<u2", 2},
        Case{"<f2", "<f2", 2}, Case{"|i1", "|i1", 1}, Case{"|u1", "|u1", 1}, Case{"|b1", "|b1", 1},
        Case{"=i8", "<i8", 8}, Case{"<u1", "|u1", 1}, Case{"=b1", "|b1", 1}}) {
    SCOPED_TRACE(c.descr);
    std::string data(3 * c.item, '\x01');
    std::string path = WriteFile(
        "typed.npy",
        NpyBytes("{'descr': '" + c.descr + "', 'fortran_order': False, 'shape': (3,), }", data));
    auto a = ReadNpy(path);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->dtype, c.normalized);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{3}));
    EXPECT_EQ(a->data, data);
  }
}

TEST(NpyTest, RefusesOtherDtypesNamingThem) {
  for (const std::string descr : {">f4", ">i8", "<c8", "<f16", "|S5", "<U3", "<b2", "<i3", "O"}) {
    SCOPED_TRACE(descr);
    std::string path =
        WriteFile("bad_dtype.npy",
                  NpyBytes("{'descr': '" + descr + "', 'fortran_order': False, 'shape': (1,), }",
                           std::string(16, '\0')));
    auto a = ReadNpy(path);
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.status().message().find("bad_dtype.npy"), absl::string_view::npos) << a.status();
    EXPECT_NE(a.status().message().find(descr), absl::string_view::npos) << a.status();
  }
  std::string big = ">f4";
  auto s = NormalizeDescr(&big);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("'<f4'"), absl::string_view::npos) << s.status();
}

}  // namespace
}  // namespace numaserve::cli
