// libFuzzer's entry point for a target (the clang build with
// -DNUMASERVE_FUZZ=ON links it with -fsanitize=fuzzer).
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return numaserve::fuzz::FuzzOne(data, size);
}
