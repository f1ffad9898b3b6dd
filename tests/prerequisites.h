// What a C++ test does when something it needs is missing (a Debian
// package, a generated model, a library): NUMASERVE_MISSING_PREREQUISITE
// skips it with the reason, which ctest shows as skipped (gtest's
// "[  SKIPPED ]" line); under CI=true, where deploy/install-deps.sh has run
// and every prerequisite must be there, it fails the test instead, so that
// a CI run never passes having checked less than it says.
//
// Skips for what the machine lacks (no AVX-512, no native BF16) stay plain
// GTEST_SKIP: no installation can change them.
#ifndef NUMASERVE_TESTS_PREREQUISITES_H_
#define NUMASERVE_TESTS_PREREQUISITES_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace numaserve::prerequisites {

inline bool InCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::strcmp(ci, "true") == 0;
}

}  // namespace numaserve::prerequisites

// Use as a statement in a test body, as GTEST_SKIP() is:
//   NUMASERVE_MISSING_PREREQUISITE() << path << " not installed";
// It returns from the test, a skip or a fatal failure as CI=true says.
#define NUMASERVE_MISSING_PREREQUISITE()                                                   \
  return ::testing::internal::AssertHelper(                                                \
             ::numaserve::prerequisites::InCi() ? ::testing::TestPartResult::kFatalFailure \
                                                : ::testing::TestPartResult::kSkip,        \
             __FILE__, __LINE__,                                                           \
             ::numaserve::prerequisites::InCi()                                            \
                 ? "missing prerequisite (CI=true, so this fails instead of skipping)"     \
                 : "") = ::testing::Message()

#endif  // NUMASERVE_TESTS_PREREQUISITES_H_
