// main() of the kernel and engine tests: GoogleTest's, after
// NUMASERVE_MAX_ISA has been exported to oneDNN (kernels/dispatch.h), as
// numaserve's own main does, so that ctest's AVX2-tier runs of these tests
// (NUMASERVE_MAX_ISA=avx2, tests/CMakeLists.txt) cap oneDNN whichever test
// touches it first.
#include <gtest/gtest.h>

#include "kernels/dispatch.h"

int main(int argc, char** argv) {
  numaserve::kernels::ExportIsaCapToOnednn();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
