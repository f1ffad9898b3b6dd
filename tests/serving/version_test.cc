#include "serving/observability/version.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace numaserve::serving {
namespace {

TEST(VersionTest, NamesVersionRevisionAndIsa) {
  const std::string text = VersionText();
  EXPECT_EQ(text.rfind(absl::StrCat("numaserve ", BuildVersion()), 0), 0u) << text;
  EXPECT_NE(text.find("git "), std::string::npos) << text;
  EXPECT_NE(text.find("isa "), std::string::npos) << text;
  EXPECT_STRNE(BuildRevision(), "");
}

// The version is project()'s, defined once in CMake and given to
// version.cc alone.
TEST(VersionTest, IsTheProjectVersion) { EXPECT_STREQ(BuildVersion(), NUMASERVE_EXPECTED_VERSION); }

}  // namespace
}  // namespace numaserve::serving
