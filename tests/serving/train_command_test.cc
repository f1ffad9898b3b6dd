#include "tools/numaserve/train_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace numaserve::cli {
namespace {

using ::testing::ElementsAre;

// The rank's command line: from the program on.
std::vector<std::string> RankCommand(const std::vector<std::string>& argv) {
  const auto program = std::find(argv.begin(), argv.end(), "/bin/numaserve");
  EXPECT_NE(program, argv.end());
  return std::vector<std::string>(program, argv.end());
}

TEST(MpirunCommandTest, EveryRankGetsTheLogOptionsOnItsCommandLine) {
  MpirunOptions options;
  options.self = "/bin/numaserve";
  options.ranks = 2;
  options.log = {.format = base::LogFormat::kJson, .level = base::LogLevel::kDebug};
  const std::vector<std::string> argv = MpirunCommand(options, {"--config", "job.cfg"});
  EXPECT_THAT(RankCommand(argv), ElementsAre("/bin/numaserve", "train", "--config", "job.cfg",
                                             "--log-format", "json", "--log-level", "debug"));
  // Through the command line, not the environment: no variable is forwarded.
  EXPECT_EQ(std::count(argv.begin(), argv.end(), "-x"), 0);
}

TEST(MpirunCommandTest, DefaultLogOptionsArePassedToo) {
  MpirunOptions options;
  options.self = "/bin/numaserve";
  options.hostfile = "hosts";
  options.ranks = 0;
  const std::vector<std::string> argv = MpirunCommand(options, {"--config", "job.cfg", "--resume"});
  EXPECT_THAT(RankCommand(argv),
              ElementsAre("/bin/numaserve", "train", "--config", "job.cfg", "--resume",
                          "--log-format", "text", "--log-level", "info"));
}

// The process settings reach every rank, on this host or another, on its
// command line (Open MPI forwards no environment variable to another host).
TEST(MpirunCommandTest, EveryRankGetsTheProcessSettingsOnItsCommandLine) {
  MpirunOptions options;
  options.self = "/bin/numaserve";
  options.process = {.max_isa = "avx2",
                     .gemm_cache = "/var/cache/c.tsv",
                     .profile_steps = true,
                     .training_reference_ops = true,
                     .membind = "strict"};
  const std::vector<std::string> argv = MpirunCommand(options, {"--config", "job.cfg"});
  EXPECT_THAT(RankCommand(argv),
              ElementsAre("/bin/numaserve", "train", "--config", "job.cfg", "--log-format", "text",
                          "--log-level", "info", "--max-isa=avx2", "--training-reference-ops",
                          "--membind=strict"));
}

}  // namespace
}  // namespace numaserve::cli
