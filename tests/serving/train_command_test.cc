#include "tools/numaserve/train_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace numaserve::server {
namespace {

using ::testing::ElementsAre;

TEST(MpirunCommandTest, ForwardsTheNamedVariablesToEveryRank) {
  MpirunOptions options;
  options.self = "/bin/numaserve";
  options.ranks = 2;
  options.forwarded_env = {"NUMASERVE_LOG_FORMAT", "NUMASERVE_LOG_LEVEL"};
  const std::vector<std::string> argv = MpirunCommand(options, {"--config", "job.cfg"});
  // -x NAME before the program, each once.
  const auto program = std::find(argv.begin(), argv.end(), "/bin/numaserve");
  ASSERT_NE(program, argv.end());
  std::vector<std::string> forwarded;
  for (auto it = argv.begin(); it != program; ++it) {
    if (*it == "-x" && it + 1 != program) forwarded.push_back(*(it + 1));
  }
  EXPECT_THAT(forwarded, ElementsAre("NUMASERVE_LOG_FORMAT", "NUMASERVE_LOG_LEVEL"));
  EXPECT_THAT(std::vector<std::string>(program, argv.end()),
              ElementsAre("/bin/numaserve", "train", "--config", "job.cfg"));
}

TEST(MpirunCommandTest, NamesNoVariableWhenNoneIsSet) {
  MpirunOptions options;
  options.self = "/bin/numaserve";
  const std::vector<std::string> argv = MpirunCommand(options, {});
  EXPECT_EQ(std::count(argv.begin(), argv.end(), "-x"), 0);
}

}  // namespace
}  // namespace numaserve::server
