#include "serving/repository/model_repository.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::serving {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A repository in a temporary directory built from the checked-in default
// model (input "image" [-1,1,28,28], output "probabilities" [-1,10]).
class RepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("numaserve_repo_test_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void AddVersion(const std::string& model, int version) {
    fs::create_directories(dir_ / model / std::to_string(version));
    fs::copy_file(NUMASERVE_DEFAULT_MODEL, dir_ / model / std::to_string(version) / "model.onnx");
  }
  void WriteConfig(const std::string& model, const std::string& text) {
    std::ofstream(dir_ / model / "config.pbtxt") << text;
  }

  fs::path dir_;
};

TEST_F(RepositoryTest, ServesTheHighestVersionByDefault) {
  AddVersion("mlp", 1);
  AddVersion("mlp", 3);
  auto repo = ModelRepository::Open(dir_.string());
  ASSERT_TRUE(repo.ok()) << repo.status();
  ASSERT_EQ((*repo)->models().size(), 1u);
  const RepositoryModel* m = (*repo)->Find("mlp");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->version, 3);
  EXPECT_EQ(m->versions, (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(m->error.empty()) << m->error;
  EXPECT_EQ(m->config.max_batch_size(), 0);
  EXPECT_EQ((*repo)->Find("mlp", 1), nullptr);  // not served
}

TEST_F(RepositoryTest, VersionPolicyAndPlacementComeFromTheConfig) {
  for (int v : {1, 2, 3}) AddVersion("mlp", v);
  WriteConfig("mlp",
              "max_batch_size: 16 dynamic_batching { max_queue_delay_microseconds: 100 }\n"
              "version_policy { latest { num_versions: 2 } }\n"
              "instance_placement { domains: [ 1 ] }\n");
  auto scanned = ModelRepository::ScanModel(dir_.string(), "mlp", 2);
  ASSERT_EQ(scanned.size(), 2u);
  EXPECT_EQ(scanned[0].version, 2);
  EXPECT_EQ(scanned[1].version, 3);
  for (const auto& m : scanned) {
    EXPECT_TRUE(m.error.empty()) << m.error;
    EXPECT_EQ(m.config.max_batch_size(), 16);
    EXPECT_EQ(m.workers, (std::vector<int>{1}));
    EXPECT_EQ(m.info.inputs[0].name, "image");
  }
}

TEST_F(RepositoryTest, ConfigProblemsMakeOnlyThatModelUnavailable) {
  AddVersion("bad_syntax", 1);
  WriteConfig("bad_syntax", "max_batch_size: 4\nbatching: yes\n");
  AddVersion("contradicts", 1);
  WriteConfig("contradicts", "max_batch_size: 4\noutput { name: \"scores\" }\n");
  AddVersion("good", 1);
  fs::create_directories(dir_ / "empty");
  auto repo = ModelRepository::Open(dir_.string(), 1);
  ASSERT_TRUE(repo.ok()) << repo.status();
  EXPECT_THAT((*repo)->Find("bad_syntax")->error, HasSubstr("config.pbtxt:2:"));
  EXPECT_TRUE((*repo)->Find("bad_syntax")->path.empty());  // a model-level error
  EXPECT_THAT((*repo)->Find("contradicts")->error, HasSubstr("output 'scores'"));
  EXPECT_THAT((*repo)->Find("empty")->error, HasSubstr("no version directory"));
  EXPECT_TRUE((*repo)->Find("good")->error.empty());
}

// An encoder-like model: x [batch, seq, 4] plus pos [seq, 4] (one 'seq').
void AddEncoder(const fs::path& dir) {
  engine::testing::OnnxModelBuilder b;
  b.NamedInput("x", {-1, -1, 4}, {"batch", "seq", ""})
      .NamedInput("pos", {-1, 4}, {"seq", ""})
      .NamedOutput("y", {-1, -1, 4}, {"batch", "seq", ""});
  b.Node("Add", {"x", "pos"}, {"y"});
  fs::create_directories(dir / "1");
  fs::copy_file(b.Save("repository_dynamic_seq"), dir / "1" / "model.onnx");
}

// A model with dynamic dims besides the batch is served: its metadata keeps
// -1 for them, and its signature function checks a request's shapes as the
// engine will (naming the input and dim) and gives its output shapes.
TEST_F(RepositoryTest, ShapePolymorphicModelIsServedAtSignatures) {
  AddEncoder(dir_ / "encoder");
  AddVersion("good", 1);
  auto repo = ModelRepository::Open(dir_.string(), 1);
  ASSERT_TRUE(repo.ok()) << repo.status();
  const RepositoryModel* m = (*repo)->Find("encoder");
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->error.empty()) << m->error;
  EXPECT_EQ(m->info.inputs[0].shape, (std::vector<int64_t>{-1, -1, 4}));
  EXPECT_EQ(m->info.inputs[1].shape, (std::vector<int64_t>{-1, 4}));
  EXPECT_EQ(m->info.outputs[0].shape, (std::vector<int64_t>{-1, -1, 4}));
  ASSERT_TRUE(m->signature_shapes);
  auto out = m->signature_shapes({{2, 5, 4}, {5, 4}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, (std::vector<std::vector<int64_t>>{{2, 5, 4}}));
  auto mismatched = m->signature_shapes({{2, 5, 4}, {6, 4}});
  ASSERT_FALSE(mismatched.ok());
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatched.status().message(),
              HasSubstr("input 'pos' dim 0 ('seq') is 6 but input 'x' dim 1 ('seq') is 5"));
  // A model whose only dynamic dims are dims 0 runs at a batch size alone.
  EXPECT_FALSE((*repo)->Find("good")->signature_shapes);
}

// A model whose Reshape target the graph computes from x's shape
// ([batch, seq, 4] -> [batch, seq * 2, 2]): each signature's answer is its
// own, asked in any order and again (the function keeps the answers of the
// signatures it has seen), and a refusal stays a refusal.
TEST_F(RepositoryTest, EachSignatureGetsItsOwnOutputShapes) {
  engine::testing::OnnxModelBuilder b;
  b.NamedInput("x", {-1, -1, 4}, {"batch", "seq", ""})
      .NamedOutput("y", {-1, -1, 2}, {"batch", "seq2", ""});
  b.Int64Initializer("i01", {0, 1}).Int64Initializer("two", {2});
  b.Int64Initializer("mul", {1, 2});
  b.Node("Shape", {"x"}, {"s"});
  b.Node("Gather", {"s", "i01"}, {"bs"});
  b.Node("Mul", {"bs", "mul"}, {"b2s"});
  engine::testing::OnnxModelBuilder::AttrInt(b.Node("Concat", {"b2s", "two"}, {"target"}), "axis",
                                             0);
  b.Node("Reshape", {"x", "target"}, {"y"});
  fs::create_directories(dir_ / "folded" / "1");
  fs::copy_file(b.Save("repository_shape_values"), dir_ / "folded" / "1" / "model.onnx");
  auto repo = ModelRepository::Open(dir_.string(), 1);
  ASSERT_TRUE(repo.ok()) << repo.status();
  const RepositoryModel* m = (*repo)->Find("folded");
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->error.empty()) << m->error;
  ASSERT_TRUE(m->signature_shapes);
  for (int round = 0; round < 2; ++round) {
    for (int64_t seq : {3, 7, 1, 3}) {
      for (int64_t batch : {1, 5}) {
        auto out = m->signature_shapes({{batch, seq, 4}});
        ASSERT_TRUE(out.ok()) << out.status();
        EXPECT_EQ(*out, (std::vector<std::vector<int64_t>>{{batch, seq * 2, 2}}))
            << "batch " << batch << " seq " << seq << " round " << round;
      }
    }
    auto refused = m->signature_shapes({{2, 3, 5}});
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// config.pbtxt may give -1 where the model's dim is dynamic, or fix it
// (narrowing it, as Triton does: metadata and requests follow the config);
// a size where the model's dim is fixed at another is refused.
TEST_F(RepositoryTest, ConfigMayNarrowADynamicDim) {
  AddEncoder(dir_ / "open");
  WriteConfig("open", "input { name: \"x\" dims: [-1, -1, 4] }\n");
  AddEncoder(dir_ / "narrow");
  WriteConfig("narrow", "input { name: \"x\" dims: [-1, 8, 4] }\n");
  AddEncoder(dir_ / "wrong");
  WriteConfig("wrong", "input { name: \"x\" dims: [-1, -1, 5] }\n");
  auto repo = ModelRepository::Open(dir_.string(), 1);
  ASSERT_TRUE(repo.ok()) << repo.status();
  ASSERT_TRUE((*repo)->Find("open")->error.empty()) << (*repo)->Find("open")->error;
  EXPECT_EQ((*repo)->Find("open")->info.inputs[0].shape, (std::vector<int64_t>{-1, -1, 4}));
  const RepositoryModel* narrow = (*repo)->Find("narrow");
  ASSERT_TRUE(narrow->error.empty()) << narrow->error;
  EXPECT_EQ(narrow->info.inputs[0].shape, (std::vector<int64_t>{-1, 8, 4}));
  EXPECT_TRUE(narrow->signature_shapes);  // still run at its signature
  EXPECT_THAT((*repo)->Find("wrong")->error, HasSubstr("input 'x' dims"));
}

TEST_F(RepositoryTest, FingerprintFollowsNewVersionsAndConfigChanges) {
  AddVersion("mlp", 1);
  const std::string first = ModelRepository::Fingerprint(dir_.string(), "mlp");
  EXPECT_EQ(ModelRepository::Fingerprint(dir_.string(), "mlp"), first);
  AddVersion("mlp", 2);
  const std::string second = ModelRepository::Fingerprint(dir_.string(), "mlp");
  EXPECT_NE(second, first);
  WriteConfig("mlp", "max_batch_size: 8\n");
  EXPECT_NE(ModelRepository::Fingerprint(dir_.string(), "mlp"), second);
  EXPECT_EQ(ModelRepository::ListModels(dir_.string()), std::vector<std::string>{"mlp"});
}

TEST_F(RepositoryTest, FingerprintFollowsTheWeightsBesideTheModel) {
  AddVersion("mlp", 1);
  const fs::path weights = dir_ / "mlp" / "1" / "weights" / "model.onnx.data";
  fs::create_directories(weights.parent_path());
  {
    std::ofstream(weights, std::ios::binary) << "0123";
  }
  const std::string before = ModelRepository::Fingerprint(dir_.string(), "mlp");
  {
    std::ofstream(weights, std::ios::binary | std::ios::trunc) << "01234567";
  }
  EXPECT_NE(ModelRepository::Fingerprint(dir_.string(), "mlp"), before);
}

TEST_F(RepositoryTest, FingerprintSeesAConfigEditOfTheSameSizeAndTime) {
  AddVersion("mlp", 1);
  WriteConfig("mlp", "max_batch_size: 8\n");
  const fs::path config = dir_ / "mlp" / "config.pbtxt";
  const auto written = fs::last_write_time(config);
  const std::string before = ModelRepository::Fingerprint(dir_.string(), "mlp");
  WriteConfig("mlp", "max_batch_size: 4\n");
  fs::last_write_time(config, written);  // as if within the clock's resolution
  EXPECT_NE(ModelRepository::Fingerprint(dir_.string(), "mlp"), before);
}

TEST(RepositoryModelKey, AReloadedVersionHasItsOwnKey) {
  RepositoryModel m;
  m.name = "mlp";
  m.version = 3;
  EXPECT_EQ(m.key(), "mlp:3");
  m.generation = 2;
  EXPECT_EQ(m.key(), "mlp:3#2");
}

TEST(RepositoryNames, ModelNamesWithControlCharactersSeparatorsOrDotsAreRefused) {
  for (const std::string& good :
       std::vector<std::string>{"mlp", "resnet-50_v1.5", "a", std::string(255, 'x'), "é"}) {
    EXPECT_TRUE(CheckModelName(good).ok()) << good;
  }
  const std::vector<std::string> bad = {"",
                                        std::string("good\0evil", 9),
                                        "line\nbreak",
                                        "tab\there",
                                        std::string(1, '\x7f'),
                                        "a/b",
                                        "../etc",
                                        "..",
                                        ".",
                                        ".hidden",
                                        "a\\b",
                                        std::string(256, 'x'),
                                        "\x1b[31mred"};
  for (const std::string& name : bad) {
    absl::Status s = CheckModelName(name);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << absl::CHexEscape(name);
    // The reason shows the name escaped, never its raw bytes.
    EXPECT_EQ(std::string(s.message()).find('\0'), std::string::npos);
    EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos);
  }
  EXPECT_THAT(std::string(CheckModelName(std::string("good\0evil", 9)).message()),
              HasSubstr("good\\x00"));
}

TEST(RepositoryNames, VersionNamesMustBeCanonicalDecimals) {
  EXPECT_EQ(*ParseVersionName("1"), 1);
  EXPECT_EQ(*ParseVersionName("120"), 120);
  EXPECT_EQ(*ParseVersionName("999999999999999999"), 999999999999999999);
  for (const std::string& bad : std::vector<std::string>{
           "", "0", "01", "+1", "-1", " 1", "1 ", "1\n", "1e3", "0x10", "9999999999999999999",
           "99999999999999999999999", std::string("1\0", 2)}) {
    EXPECT_FALSE(ParseVersionName(bad).ok()) << absl::CHexEscape(bad);
  }
}

TEST_F(RepositoryTest, OddDirectoryNamesAreNotModelsOrVersions) {
  AddVersion("mlp", 1);
  // "01" and " 2" parse as 1 and 2 with SimpleAtoi: neither is a version.
  fs::create_directories(dir_ / "mlp" / "01");
  fs::create_directories(dir_ / "mlp" / " 2");
  fs::create_directories(dir_ / "bad\nname" / "1");
  fs::create_directories(dir_ /
                         "esc\x1b"
                         "ape" /
                         "1");
  EXPECT_EQ(ModelRepository::ListModels(dir_.string()), (std::vector<std::string>{"mlp"}));
  auto scanned = ModelRepository::ScanModel(dir_.string(), "mlp", 1);
  ASSERT_EQ(scanned.size(), 1u);
  EXPECT_EQ(scanned[0].versions, (std::vector<int64_t>{1}));
  EXPECT_EQ(scanned[0].version, 1);
  // Asked for by a name that is not one (a request's), the scan says why.
  auto odd = ModelRepository::ScanModel(dir_.string(), std::string("mlp\0x", 5), 1);
  ASSERT_EQ(odd.size(), 1u);
  EXPECT_THAT(odd[0].error, HasSubstr("contains a control character"));
}

}  // namespace
}  // namespace numaserve::serving
