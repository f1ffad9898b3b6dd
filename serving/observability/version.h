// What this binary is: for `numaserve --version` and the start-up record.
#pragma once

#include <string>

namespace numaserve::serving {

// "numaserve 0.1.0 (git v0.1.0-12-gabcdef0, isa avx512, oneDNN avx512_core)":
// the version, the git revision the binary was built from ("unknown"
// outside a git checkout) and the ISA the kernels dispatch to here.
std::string VersionText();
// The parts, for the start-up record.
const char* BuildVersion();
const char* BuildRevision();

}  // namespace numaserve::serving
