#include "serving/workers/supervisor_thread.h"

#include <pthread.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "affinity/pinning.h"
#include "affinity/topology.h"
#include "base/log.h"

namespace numaserve::serving {

void PlaceSupervisorThread(int index, const affinity::WorkerPlacement& placement) {
  // 15 characters at most: "supervisor-" and up to 4 digits.
  const std::string name = absl::StrCat("supervisor-", index).substr(0, 15);
  pthread_setname_np(pthread_self(), name.c_str());
  if (placement.supervisor_cpus.empty()) return;
  if (absl::Status s = affinity::PinCallingThread(placement.supervisor_cpus); !s.ok()) {
    base::Log(base::LogLevel::kWarning, "supervisor",
              absl::StrCat("worker ", index, ": supervisor thread not pinned to cpus ",
                           affinity::FormatCpuList(placement.supervisor_cpus), ": ", s.message()),
              {{"worker", index}});
  }
}

}  // namespace numaserve::serving
