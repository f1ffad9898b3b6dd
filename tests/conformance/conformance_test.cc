// Holds the conformance line per suite: no case fails unless it is listed in
// known_failures.txt (with a reason), and at least floor.txt's count pass.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/conformance/onnx_conformance.h"
#include "tests/prerequisites.h"

namespace numaserve::conformance {
namespace {

// "suite count" per line; '#' starts a comment.
std::map<std::string, int> ReadFloors() {
  std::map<std::string, int> floors;
  std::ifstream in(std::string(NUMASERVE_CONFORMANCE_DIR) + "/floor.txt");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string suite;
    int count = 0;
    if (fields >> suite >> count) floors[suite] = count;
  }
  return floors;
}

// "suite/case reason..." per line.
std::set<std::string> ReadKnownFailures() {
  std::set<std::string> known;
  std::ifstream in(std::string(NUMASERVE_CONFORMANCE_DIR) + "/known_failures.txt");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    known.insert(line.substr(0, line.find(' ')));
  }
  return known;
}

class ConformanceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConformanceTest, NoFailuresAndAtLeastTheFloorPass) {
  const std::string suite = GetParam();
  const std::string dir = std::string(kDefaultRoot) + "/" + suite;
  if (!std::filesystem::is_directory(dir)) {
    NUMASERVE_MISSING_PREREQUISITE()
        << dir << " is missing: install libonnx-testdata (deploy/install-deps.sh)";
  }
  const auto results = RunSuite(dir, Options{.scratch_dir = ::testing::TempDir()});
  const std::set<std::string> known = ReadKnownFailures();
  for (const CaseResult& r : results) {
    if (r.outcome == Outcome::kFailed && !known.contains(suite + "/" + r.name)) {
      ADD_FAILURE() << suite << "/" << r.name << " failed: " << r.detail;
    }
  }
  const Tally t = Count(results);
  std::printf("%s: passed %d failed %d unsupported %d\n", suite.c_str(), t.passed, t.failed,
              t.unsupported);
  const auto floors = ReadFloors();
  ASSERT_TRUE(floors.contains(suite)) << "floor.txt has no line for " << suite;
  EXPECT_GE(t.passed, floors.at(suite)) << suite << ": fewer cases pass than the floor";
}

INSTANTIATE_TEST_SUITE_P(Suites, ConformanceTest,
                         ::testing::Values("node", "pytorch-converted", "pytorch-operator",
                                           "simple"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace numaserve::conformance
