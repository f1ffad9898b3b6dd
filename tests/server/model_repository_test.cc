#include "server/model_repository.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace numaserve::server {
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

}  // namespace
}  // namespace numaserve::server
