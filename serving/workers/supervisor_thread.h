// The server's thread for one worker (WorkerSupervisor::Run): named, and
// pinned where the plan puts it.
#pragma once

#include "affinity/placement.h"

namespace numaserve::serving {

// Names the calling thread "supervisor-N" (in /proc/PID/task/*/comm, top -H)
// and, where the plan gives it cpus (WorkerPlacement::supervisor_cpus: serve
// --frontend-cpus), pins it to them: its worker's node, off the front end's
// cpus elsewhere. A pin that fails is logged as a warning; the thread then
// keeps the front end's cpus.
void PlaceSupervisorThread(int index, const affinity::WorkerPlacement& placement);

}  // namespace numaserve::serving
