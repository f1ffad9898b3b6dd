// Placement: a pure function from (topology, options) to a plan of workers.
// Nothing here touches the machine; pinning.h applies a plan.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "affinity/topology.h"

namespace numaserve::affinity {

// What one worker spans.
enum class Domain {
  kNuma,     // one worker per NUMA node (default: memory stays local)
  kPackage,  // one worker per socket
  kL3,       // one worker per L3 cache domain (EPYC CCX/CCD)
  kCore,     // one worker per physical core
};
absl::StatusOr<Domain> ParseDomain(const std::string& name);  // "numa" | "package" | "l3" | "core"
const char* DomainName(Domain domain);

// How a worker's idle OpenMP threads wait for the next parallel region.
enum class OmpWait {
  // Sleep at once. Every parallel region then pays a wake-up (tens of
  // microseconds here), once per operator.
  kPassive,
  // Spin ~1000 pauses (~25 us on the machine of
  // benchmarks/results/2026-11-22-cli-omp-wait.md) before
  // sleeping: covers the gap between one operator and the next inside a
  // batch, and stops soon after the batch, so cores shared with the front
  // end lose little. The default.
  kShort,
  // Spin ~1 ms: only when the workers' cores are theirs alone (no front
  // end, clients or other processes on them).
  kSpin,
};
absl::StatusOr<OmpWait> ParseOmpWait(const std::string& name);  // "passive" | "short" | "spin"
const char* OmpWaitName(OmpWait wait);

struct PlacementOptions {
  // Unit of one worker; NUMA keeps each worker's memory local.
  Domain domain = Domain::kNuma;
  // Give each worker the SMT siblings of its cores too. Off by default:
  // GEMM-bound work gains nothing from a second thread on the same FMA units.
  bool use_smt = false;
  // Cap on the number of workers (0 = one per domain). Domains are taken in
  // turn from each package (the first of each, then the second, ...), so
  // that a capped plan uses every socket's cores and memory, and keep the
  // topology's order.
  int max_workers = 0;
  // How idle OpenMP threads wait (see OmpWait). Long spinning only pays
  // when the workers' cores are theirs alone: when the front end, clients or
  // other processes share them, spinning threads take their time, and small
  // batches got several times slower in our measurements.
  OmpWait omp_wait = OmpWait::kShort;
};

struct WorkerPlacement {
  int index = 0;          // 0..n-1
  std::string domain;     // human label, e.g. "numa 1", "package 0", "l3 3", "core 5"
  std::vector<int> cpus;  // OS cpus the worker is bound to (and its OpenMP places)
  // The same cpus by physical core, in the same order (cpus is their
  // concatenation): one cpu per core, or a core's SMT siblings with
  // use_smt. The worker splits its instances by these cores.
  std::vector<std::vector<int>> cores;
  int numa_node = -1;   // OS index of the node its memory is bound to, -1 = none
  int num_threads = 0;  // OpenMP team size (= cores, or PUs with use_smt)
  // OMP_NUM_THREADS, OMP_PLACES, OMP_PROC_BIND, OMP_WAIT_POLICY, KMP_AFFINITY,
  // KMP_BLOCKTIME, KMP_HW_SUBSET-free equivalents for libgomp (GOMP_CPU_AFFINITY,
  // GOMP_SPINCOUNT), in a stable order.
  std::vector<std::pair<std::string, std::string>> env;
};

struct Plan {
  std::string topology_source;
  Domain domain = Domain::kNuma;
  bool use_smt = false;
  OmpWait omp_wait = OmpWait::kShort;
  std::vector<WorkerPlacement> workers;
};

// Errors carry numbers: "domain l3 found no L3 cache in topology '...'".
absl::StatusOr<Plan> MakePlan(const Topology& topology, const PlacementOptions& options);

// The OpenMP / KMP / GOMP environment of a worker on `cpus` with `threads` threads.
// `wait` as in PlacementOptions.
std::vector<std::pair<std::string, std::string>> OpenMpEnvironment(const std::vector<int>& cpus,
                                                                   int threads,
                                                                   OmpWait wait = OmpWait::kShort);

// Human report, like `mpirun --report-bindings`: the topology, then one block per worker.
std::string FormatReport(const Topology& topology, const Plan& plan);
// The same as one JSON object: {"topology": {...}, "plan": {"workers": [...]}}.
std::string FormatReportJson(const Topology& topology, const Plan& plan);

}  // namespace numaserve::affinity
