// ModelManager's checks on the names RepositoryModelLoad hands it: a name
// that is not a model name never becomes a path (a NUL would have cut
// "mlp\0evil" to "mlp" for the kernel and loaded the model under a second,
// invisible name). Refused before any worker is involved, so no
// supervisor is needed here.
#include "serving/scheduling/model_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace numaserve::serving {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(ModelManagerNames, LoadRefusesNamesThatAreNotModelNames) {
  const fs::path repo =
      fs::path(::testing::TempDir()) / ("numaserve_manager_names_" + std::to_string(getpid()));
  fs::remove_all(repo);
  fs::create_directories(repo / "mlp" / "1");
  ModelManager::Options options;
  options.repository = repo.string();
  options.mode = ModelControlMode::kExplicit;
  // No workers: every name here must be refused before they are needed.
  ModelManager manager(options, nullptr, nullptr, nullptr);
  manager.Start({}, {});
  for (const std::string& name : std::vector<std::string>{
           std::string("mlp\0evil", 8), "mlp\n", "../mlp", "mlp/1", "..", ".", "", "\x7f"}) {
    absl::Status s = manager.Load(name);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("model name")) << s;
  }
  manager.Stop();
  fs::remove_all(repo);
}

}  // namespace
}  // namespace numaserve::serving
