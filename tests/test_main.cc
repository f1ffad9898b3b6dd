// main() of the kernel and engine tests: GoogleTest's, after the ISA cap
// the test run asks for is set (kernels::SetDispatchOptions), as
// numaserve's own main does from --max-isa. The kernels read no
// environment; this main reads NUMASERVE_MAX_ISA itself, so that ctest's
// AVX2-tier runs of these tests (NUMASERVE_MAX_ISA=avx2,
// tests/CMakeLists.txt) cap the own kernels and oneDNN whichever test
// touches them first.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/dispatch.h"

int main(int argc, char** argv) {
  const char* cap = std::getenv("NUMASERVE_MAX_ISA");
  if (absl::Status s =
          numaserve::kernels::SetDispatchOptions({.max_isa = cap != nullptr ? cap : ""});
      !s.ok()) {
    std::fprintf(stderr, "NUMASERVE_MAX_ISA: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
