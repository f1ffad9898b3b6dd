// ONNX external data: weights in a file beside the model are read, and
// only from there. Every location that would leave the model's folder, a
// region past a file's end or named twice, and every malformed entry is an
// error naming the tensor; none is followed or allocated.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/import/onnx_import.h"
#include "engine/ir/graph.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::OnnxModelBuilder;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// A folder of its own per test, removed after it.
class ExternalDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = absl::StrCat(::testing::TempDir(), "/numaserve_external_XXXXXX");
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void WriteFile(const std::string& name, const std::string& bytes) const {
    fs::create_directories((fs::path(dir_) / name).parent_path());
    std::ofstream out(fs::path(dir_) / name, std::ios::binary | std::ios::trunc);
    out << bytes;
  }

  std::string SaveModel(const OnnxModelBuilder& b, const std::string& name = "model.onnx") const {
    const std::string path = (fs::path(dir_) / name).string();
    OnnxModelBuilder copy = b;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    copy.proto().SerializeToOstream(&out);
    return path;
  }

  std::string dir_;
};

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// y = x + w, w [2] FP32 in external data at LOCATION with KEYS added.
OnnxModelBuilder AddModel(const std::string& location,
                          const std::vector<std::pair<std::string, std::string>>& keys) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 2}).Output("y", {-1, 2});
  onnx::TensorProto* w = b.proto().mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(2);
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* entry = w->add_external_data();
  entry->set_key("location");
  entry->set_value(location);
  for (const auto& [k, v] : keys) {
    auto* e = w->add_external_data();
    e->set_key(k);
    e->set_value(v);
  }
  b.Node("Add", {"x", "w"}, {"y"}, "add");
  return b;
}

std::vector<float> ConstantValues(const Graph& graph, const std::string& name) {
  const auto id = graph.FindValue(name);
  if (!id) return {};
  const Constant* c = graph.FindConstant(*id);
  if (c == nullptr) return {};
  return c->f32.data;
}

TEST_F(ExternalDataTest, WeightsBesideTheModelAreReadAtTheirOffset) {
  WriteFile("model.onnx.data", "8 bytes." + Floats({1.5f, -2.0f}) + "tail");
  auto graph =
      ImportOnnxModel(SaveModel(AddModel("model.onnx.data", {{"offset", "8"}, {"length", "8"}})));
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_THAT(ConstantValues(*graph, "w"), ElementsAre(1.5f, -2.0f));
}

TEST_F(ExternalDataTest, ALocationInASubfolderAndAConstantsTensorAreRead) {
  WriteFile("weights/all.bin", Floats({3.0f, 4.0f}) + Floats({0.5f, 0.25f}));
  OnnxModelBuilder b = AddModel("weights/all.bin", {{"length", "8"}});
  // A Constant node's value in the same file, after w.
  b.proto().mutable_graph()->mutable_node()->Clear();
  onnx::NodeProto& c = b.Node("Constant", {}, {"k"}, "k");
  auto* a = c.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  onnx::TensorProto* t = a->mutable_t();
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_dims(2);
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"location", "weights/all.bin"}, {"offset", "8"}, {"checksum", "ignored"}}) {
    auto* e = t->add_external_data();
    e->set_key(k);
    e->set_value(v);
  }
  b.Node("Add", {"x", "w"}, {"xw"}, "add");
  b.Node("Mul", {"xw", "k"}, {"y"}, "mul");
  auto graph = ImportOnnxModel(SaveModel(b));
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_THAT(ConstantValues(*graph, "w"), ElementsAre(3.0f, 4.0f));
  EXPECT_THAT(ConstantValues(*graph, "k"), ElementsAre(0.5f, 0.25f));
}

class ExternalDataRefusalTest : public ExternalDataTest {
 protected:
  std::string Error(const std::string& location,
                    const std::vector<std::pair<std::string, std::string>>& keys = {},
                    absl::StatusCode expected = absl::StatusCode::kOk) {
    auto graph = ImportOnnxModel(SaveModel(AddModel(location, keys)));
    EXPECT_FALSE(graph.ok()) << location;
    if (graph.ok()) return "";
    if (expected != absl::StatusCode::kOk) EXPECT_EQ(graph.status().code(), expected);
    const std::string message = Message(graph.status());
    EXPECT_THAT(message, HasSubstr("tensor 'w' in external data"));
    return message;
  }
};

TEST_F(ExternalDataRefusalTest, PathsLeavingTheModelsFolderAreNotFollowed) {
  WriteFile("inside.bin", Floats({1, 2}));
  EXPECT_THAT(Error("/etc/passwd", {}, absl::StatusCode::kPermissionDenied),
              HasSubstr("an absolute path"));
  EXPECT_THAT(Error("../inside.bin", {}, absl::StatusCode::kPermissionDenied), HasSubstr("'..'"));
  EXPECT_THAT(Error("sub/../../x.bin", {}, absl::StatusCode::kPermissionDenied), HasSubstr("'..'"));
  // A link inside the folder to a file outside it.
  const std::string outside = absl::StrCat(dir_, "_outside.bin");
  {
    std::ofstream(outside, std::ios::binary) << Floats({1, 2});
  }
  fs::create_symlink(outside, fs::path(dir_) / "link.bin");
  EXPECT_THAT(Error("link.bin", {}, absl::StatusCode::kPermissionDenied),
              HasSubstr("outside the model's folder"));
  fs::remove(outside);
  // A link inside to a file inside is followed.
  fs::create_symlink(fs::path(dir_) / "inside.bin", fs::path(dir_) / "inner_link.bin");
  auto graph = ImportOnnxModel(SaveModel(AddModel("inner_link.bin", {})));
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_THAT(ConstantValues(*graph, "w"), ElementsAre(1.0f, 2.0f));
}

TEST_F(ExternalDataRefusalTest, MissingFilesAndFoldersAreClearErrors) {
  EXPECT_THAT(Error("absent.bin", {}, absl::StatusCode::kNotFound),
              HasSubstr("no such file beside the model"));
  fs::create_directories(fs::path(dir_) / "folder");
  EXPECT_THAT(Error("folder"), HasSubstr("not a regular file"));
  EXPECT_THAT(Error(""), HasSubstr("no location"));
}

TEST_F(ExternalDataRefusalTest, RegionsPastTheEndOrOfTheWrongLengthAreRefused) {
  WriteFile("w.bin", Floats({1, 2}));
  EXPECT_THAT(Error("w.bin", {{"offset", "4"}}, absl::StatusCode::kOutOfRange),
              HasSubstr("8 bytes at offset 4 pass the end of a file of 8 bytes"));
  EXPECT_THAT(Error("w.bin", {{"offset", "9223372036854775807"}}, absl::StatusCode::kOutOfRange),
              HasSubstr("pass the end"));
  EXPECT_THAT(Error("w.bin", {{"length", "4"}}), HasSubstr("length 4 where its dims need 8"));
  EXPECT_THAT(Error("w.bin", {{"offset", "-1"}}), HasSubstr("not a byte count"));
  EXPECT_THAT(Error("w.bin", {{"length", "8x"}}), HasSubstr("not a byte count"));
  EXPECT_THAT(Error("w.bin", {{"basepath", "/"}}), HasSubstr("unknown key 'basepath'"));
}

TEST_F(ExternalDataRefusalTest, ARegionNamedManyTimesCannotReadMoreThanTheFileHolds) {
  // 1000 tensors of 8 bytes, all from the same 8-byte file: the first is
  // read, the second would make the weights larger than the file.
  WriteFile("w.bin", Floats({1, 2}));
  OnnxModelBuilder b = AddModel("w.bin", {});
  onnx::GraphProto* g = b.proto().mutable_graph();
  const onnx::TensorProto w = g->initializer(0);
  for (int i = 1; i < 1000; ++i) {
    onnx::TensorProto* copy = g->add_initializer();
    *copy = w;
    copy->set_name(absl::StrCat("w", i));
  }
  auto graph = ImportOnnxModel(SaveModel(b));
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(graph.status()), HasSubstr("tensor 'w1' in external data 'w.bin'"));
  EXPECT_THAT(Message(graph.status()), HasSubstr("16 bytes from a file of 8"));
}

TEST_F(ExternalDataRefusalTest, AHugeDeclaredTensorIsRefusedBeforeAnyRead) {
  WriteFile("w.bin", Floats({1, 2}));
  OnnxModelBuilder b = AddModel("w.bin", {});
  b.proto().mutable_graph()->mutable_initializer(0)->set_dims(0, int64_t{1} << 40);
  auto graph = ImportOnnxModel(SaveModel(b));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()), HasSubstr("tensor 'w' in external data"));
  EXPECT_THAT(Message(graph.status()), HasSubstr("[1099511627776]"));
}

}  // namespace
}  // namespace numaserve::engine
