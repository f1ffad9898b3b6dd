// The exported model is the inference graph with the trained weights: the
// engine's CompiledModel runs it and matches the training forward + Softmax.
#include "training/onnx_export.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "tests/engine/onnx_model_builder.h"
#include "training/optimizer.h"
#include "training/training_net.h"

namespace numaserve::training {
namespace {

namespace fs = std::filesystem;

std::string GenerateDefaultModel(const std::string& repo) {
  const std::string cmd = std::string(NUMASERVE_PYTHON) + " " + NUMASERVE_MODEL_GENERATOR +
                          " --out " + repo + " > /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return repo + "/fashion_classifier/1/model.onnx";
}

TEST(NextVersionPathTest, NumbersAfterTheHighestVersion) {
  const std::string repo = ::testing::TempDir() + "/nv_" + std::to_string(getpid());
  fs::create_directories(repo + "/m/1");
  fs::create_directories(repo + "/m/7");
  fs::create_directories(repo + "/m/notes");
  absl::StatusOr<std::string> p = NextVersionPath(repo, "m");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, repo + "/m/8/model.onnx");
  EXPECT_TRUE(fs::is_directory(repo + "/m/8"));
  absl::StatusOr<std::string> fresh = NextVersionPath(repo, "new_model");
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(*fresh, repo + "/new_model/1/model.onnx");
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(NextVersionPathTest, AnOwnerExportsOnlyIntoModelDirectoriesItMade) {
  const std::string repo = ::testing::TempDir() + "/owner_" + std::to_string(getpid());
  fs::create_directories(repo + "/operators/1");
  // A model directory made by an export is marked with its owner.
  absl::StatusOr<std::string> p = NextVersionPath(repo, "m", "alice");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, repo + "/m/1/model.onnx");
  EXPECT_EQ(ReadText(repo + "/m/" + kExportOwnerFile), "alice\n");
  // Its owner goes on exporting there; another owner is refused, and so is
  // a directory without an owner file (an operator's model).
  p = NextVersionPath(repo, "m", "alice");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, repo + "/m/2/model.onnx");
  p = NextVersionPath(repo, "m", "bob");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << p.status();
  EXPECT_FALSE(fs::exists(repo + "/m/3"));
  p = NextVersionPath(repo, "operators", "alice");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << p.status();
  EXPECT_NE(p.status().message().find("has no .numaserve-owner"), std::string::npos) << p.status();
  EXPECT_FALSE(fs::exists(repo + "/operators/2"));
  EXPECT_TRUE(CheckExportOwner(repo + "/m", "alice").ok());
  EXPECT_TRUE(CheckExportOwner(repo + "/missing", "bob").ok());
  // Without an owner (`numaserve train` by hand) any directory, as before.
  p = NextVersionPath(repo, "operators");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, repo + "/operators/2/model.onnx");
  // A link in place of a model directory, a link as the owner file, and an
  // owner that is no name.
  fs::create_directory_symlink(repo + "/m", repo + "/link");
  EXPECT_EQ(NextVersionPath(repo, "link", "alice").status().code(),
            absl::StatusCode::kInvalidArgument);
  fs::create_directories(repo + "/linked_owner");
  fs::create_symlink(repo + "/m/" + kExportOwnerFile, repo + "/linked_owner/" + kExportOwnerFile);
  EXPECT_EQ(CheckExportOwner(repo + "/linked_owner", "alice").code(),
            absl::StatusCode::kPermissionDenied);
  for (const std::string& owner : std::vector<std::string>{"a/b", "a\nb", std::string(129, 'a')}) {
    EXPECT_EQ(NextVersionPath(repo, "x", owner).status().code(), absl::StatusCode::kInvalidArgument)
        << owner;
  }
  EXPECT_FALSE(fs::exists(repo + "/x"));
  fs::remove_all(repo);
}

TEST(OnnxExportTest, ExportedModelRunsInTheEngineAndMatchesTraining) {
  const std::string repo = ::testing::TempDir() + "/exp_" + std::to_string(getpid());
  const std::string source = GenerateDefaultModel(repo);
  absl::StatusOr<engine::Graph> graph = engine::ImportOnnxModel(source);
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<std::unique_ptr<TrainingNet>> net = TrainingNet::Create(std::move(*graph));
  ASSERT_TRUE(net.ok()) << net.status();

  // A few SGD steps on random data so the weights differ from the source.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Tensor x({8, 1, 28, 28});
  for (float& v : x.data) v = u(rng);
  std::vector<uint8_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int64_t> sizes;
  for (const Parameter& p : (*net)->parameters()) sizes.push_back(p.data->size());
  Optimizer opt({}, sizes);
  Tensor dlogits;
  double first_loss = 0, last_loss = 0;
  for (int step = 1; step <= 5; ++step) {
    absl::StatusOr<const Tensor*> logits = (*net)->Forward(x);
    ASSERT_TRUE(logits.ok());
    const double loss = SoftmaxCrossEntropy(**logits, labels.data(), 1.0f / 8, &dlogits).loss_sum;
    if (step == 1) first_loss = loss;
    last_loss = loss;
    ASSERT_TRUE((*net)->Backward(dlogits, nullptr).ok());
    for (size_t i = 0; i < sizes.size(); ++i) {
      opt.Update(static_cast<int>(i), step, 0.05f, (*net)->parameters()[i].data,
                 *(*net)->parameters()[i].grad);
    }
  }
  EXPECT_LT(last_loss, first_loss);

  absl::StatusOr<std::string> out = NextVersionPath(repo, "fashion_classifier");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, repo + "/fashion_classifier/2/model.onnx");
  std::vector<NamedWeights> weights;
  for (const Parameter& p : (*net)->parameters()) weights.push_back({p.name, &p.data->data});
  ASSERT_TRUE(ExportOnnx(source, weights, *out).ok());

  absl::StatusOr<engine::ModelInfo> info = engine::InspectModel(*out);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->outputs[0].name, "probabilities");
  absl::StatusOr<std::unique_ptr<engine::CompiledModel>> model =
      engine::CompiledModel::Load(*out, {});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> probs(8 * 10);
  ASSERT_TRUE((*model)->Run(8, {x.data.data()}, {probs.data()}).ok());

  absl::StatusOr<const Tensor*> logits = (*net)->Forward(x);
  ASSERT_TRUE(logits.ok());
  for (int r = 0; r < 8; ++r) {
    const float* z = &(*logits)->data[r * 10];
    double sum = 0;
    for (int j = 0; j < 10; ++j) sum += std::exp(static_cast<double>(z[j]));
    for (int j = 0; j < 10; ++j) {
      EXPECT_NEAR(probs[r * 10 + j], std::exp(z[j]) / sum, 1e-4) << "row " << r << " class " << j;
    }
  }
}

TEST(OnnxExportTest, BatchNormIsFoldedIntoTheConv) {
  // image -> Conv (no bias) -> BatchNormalization -> Relu -> Flatten -> Gemm -> Softmax
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  auto random = [&](kernels::Shape shape) {
    Tensor t(shape);
    for (float& v : t.data) v = normal(rng);
    return t;
  };
  engine::testing::OnnxModelBuilder builder;
  builder.Input("image", {-1, 1, 6, 6}).Output("probabilities", {-1, 3});
  builder.Initializer("conv.weight", random({4, 1, 3, 3}))
      .Initializer("bn.scale", Tensor({4}, {1, 1, 1, 1}))
      .Initializer("bn.bias", Tensor({4}, {0, 0, 0, 0}))
      .Initializer("bn.mean", Tensor({4}, {0, 0, 0, 0}))
      .Initializer("bn.var", Tensor({4}, {1, 1, 1, 1}))
      .Initializer("fc.weight", random({144, 3}))
      .Initializer("fc.bias", Tensor({3}, {0, 0, 0}));
  auto& conv = builder.Node("Conv", {"image", "conv.weight"}, {"c"});
  engine::testing::OnnxModelBuilder::AttrInts(conv, "pads", {1, 1, 1, 1});
  builder.Node("BatchNormalization", {"c", "bn.scale", "bn.bias", "bn.mean", "bn.var"}, {"n"});
  builder.Node("Relu", {"n"}, {"r"});
  builder.Node("Flatten", {"r"}, {"f"});
  builder.Node("Gemm", {"f", "fc.weight", "fc.bias"}, {"logits"});
  auto& softmax = builder.Node("Softmax", {"logits"}, {"probabilities"});
  engine::testing::OnnxModelBuilder::AttrInt(softmax, "axis", 1);
  const std::string source = builder.Save("bn_fold");

  absl::StatusOr<engine::Graph> graph = engine::ImportOnnxModel(source);
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<std::unique_ptr<TrainingNet>> net = TrainingNet::Create(std::move(*graph));
  ASSERT_TRUE(net.ok()) << net.status();
  std::vector<int64_t> sizes;
  for (const Parameter& p : (*net)->parameters()) sizes.push_back(p.data->size());
  Optimizer opt({}, sizes);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Tensor x({6, 1, 6, 6});
  for (float& v : x.data) v = u(rng);
  const std::vector<uint8_t> labels = {0, 1, 2, 0, 1, 2};
  Tensor dlogits;
  for (int step = 1; step <= 5; ++step) {  // moves weights and running statistics
    absl::StatusOr<const Tensor*> logits = (*net)->Forward(x);
    ASSERT_TRUE(logits.ok()) << logits.status();
    SoftmaxCrossEntropy(**logits, labels.data(), 1.0f / 6, &dlogits);
    ASSERT_TRUE((*net)->Backward(dlogits, nullptr).ok());
    for (size_t i = 0; i < sizes.size(); ++i) {
      Parameter& p = (*net)->parameters()[i];
      if (p.trainable) opt.Update(static_cast<int>(i), step, 0.1f, p.data, *p.grad);
    }
  }
  std::vector<NamedWeights> weights;
  for (const Parameter& p : (*net)->parameters()) weights.push_back({p.name, &p.data->data});
  const std::string out = source + ".trained.onnx";
  // Removed at the end like the source model (its name holds the pid).
  struct RemoveAtEnd {
    std::string path;
    ~RemoveAtEnd() { std::filesystem::remove(path); }
  } remove_out{out};
  ASSERT_TRUE(ExportOnnx(source, weights, out).ok());

  onnx::ModelProto exported;
  std::ifstream in(out, std::ios::binary);
  ASSERT_TRUE(exported.ParseFromIstream(&in));
  for (const onnx::NodeProto& node : exported.graph().node()) {
    EXPECT_NE(node.op_type(), "BatchNormalization");
  }
  absl::StatusOr<std::unique_ptr<engine::CompiledModel>> model =
      engine::CompiledModel::Load(out, {});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> probs(6 * 3);
  ASSERT_TRUE((*model)->Run(6, {x.data.data()}, {probs.data()}).ok());
  absl::StatusOr<const Tensor*> logits = (*net)->Forward(x, /*training=*/false);
  ASSERT_TRUE(logits.ok());
  for (int r = 0; r < 6; ++r) {
    const float* z = &(*logits)->data[r * 3];
    const double sum = std::exp(z[0]) + std::exp(z[1]) + std::exp(z[2]);
    for (int j = 0; j < 3; ++j)
      EXPECT_NEAR(probs[r * 3 + j], std::exp(z[j]) / sum, 1e-4) << r << "," << j;
  }
}

TEST(OnnxExportTest, UnknownInitializerIsAnError) {
  const std::string repo = ::testing::TempDir() + "/exp_bad_" + std::to_string(getpid());
  const std::string source = GenerateDefaultModel(repo);
  std::vector<float> w(4);
  absl::Status s = ExportOnnx(source, {{"no_such_weight", &w}}, repo + "/out.onnx");
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace numaserve::training
