#include "serving/observability/version.h"

#include "absl/strings/str_cat.h"
#include "kernels/dispatch.h"

#ifndef NUMASERVE_VERSION
#define NUMASERVE_VERSION "unknown"
#endif
#ifndef NUMASERVE_GIT_REVISION
#define NUMASERVE_GIT_REVISION "unknown"
#endif

namespace numaserve::serving {

const char* BuildVersion() { return NUMASERVE_VERSION; }
const char* BuildRevision() { return NUMASERVE_GIT_REVISION; }

std::string VersionText() {
  return absl::StrCat("numaserve ", BuildVersion(), " (git ", BuildRevision(), ", isa ",
                      kernels::IsaDescription(), ")");
}

}  // namespace numaserve::serving
