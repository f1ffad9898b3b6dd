// What every fuzz target shares. A target defines FuzzOne, the entry point
// fed arbitrary bytes; it is linked either with libfuzzer_main.cc (the
// clang build with -DNUMASERVE_FUZZ=ON: libFuzzer calls it) or with
// replay_main.cc (every build with tests: ctest feeds it each file of the
// target's seed corpus and regression inputs). A bad input must come back as
// an error status; a crash, a sanitizer report or a failed FUZZ_CHECK is a
// finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace numaserve::fuzz {

// Runs one input. Returns 0 (libFuzzer's convention for "keep going").
int FuzzOne(const uint8_t* data, size_t size);

// Aborts with `what` and the place: an invariant the code under test
// promises and an input broke.
[[noreturn]] void CheckFailed(const char* file, int line, const char* what);

#define FUZZ_CHECK(condition) \
  ((condition) ? (void)0 : ::numaserve::fuzz::CheckFailed(__FILE__, __LINE__, #condition))

// The readers under test take paths: `bytes` written to an in-memory file
// (memfd, one per `slot`, reused from call to call), named by the path
// returned ("/proc/self/fd/<n>"). Nothing reaches the disk.
std::string MemoryFile(int slot, std::string_view bytes);

// A private directory (made once per process under $TMPDIR or /tmp,
// removed at exit) for readers that open files beside the one named (a
// record file and its .idx).
const std::string& ScratchDirectory();
// Writes `bytes` to ScratchDirectory()/`name`, replacing it; the path.
std::string WriteScratchFile(const std::string& name, std::string_view bytes);

// The bytes of the input as a string_view.
inline std::string_view AsText(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace numaserve::fuzz
