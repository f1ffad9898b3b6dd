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

// The cpus kept for the front end (serve --frontend-cpus): its gRPC and
// HTTP threads, timer, metrics and health threads run there, off the
// workers' cores.
struct FrontendCpus {
  enum class Mode {
    kNone,  // none: the front end floats over every cpu, the workers' too (as before)
    kAuto,  // one core (all its SMT threads) on each package; see MakePlan
    kList,  // the cpus listed
  };
  Mode mode = Mode::kNone;
  std::vector<int> cpus;  // kList only, ascending, no duplicates
};
// "none" | "auto" | a cpu list ("0,2-3"); an error names what is wrong.
absl::StatusOr<FrontendCpus> ParseFrontendCpus(const std::string& text);

// auto takes a front-end core only from a package of at least this many
// cores (fewer: none, the workers need them all), and only from a domain
// that keeps a core (a domain of one core would lose its worker).
inline constexpr int kAutoFrontendMinPackageCores = 4;

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
  // Cpus taken out of the workers' plan for the front end. A core any of
  // whose threads is the front end's is left out whole: no worker thread
  // shares a core with it.
  FrontendCpus frontend;
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
  // Where the server's supervisor thread for this worker runs (its worker's
  // replies, the answers they complete), on the worker's NUMA node (its
  // package where it spans several nodes): the front end's cpus there, else
  // the worker's cores (all their threads); ascending. Empty without
  // front-end cpus: it floats, as the front end does.
  std::vector<int> supervisor_cpus;
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
  // The front end's cpus, ascending; empty: it floats over every cpu.
  std::vector<int> frontend_cpus;
  std::vector<WorkerPlacement> workers;
};

// A worker's physical cores: its cores, or one per cpu for a placement
// that lists none. Peaks per core scale by this, not by its SMT threads.
int PhysicalCores(const WorkerPlacement& worker);
// `per_core` (a peak per core, any unit) times the worker's physical cores.
double WorkerPeak(const WorkerPlacement& worker, double per_core);

// Errors carry numbers: "domain l3 found no L3 cache in topology '...'".
// Front-end cpus are checked against the topology's: a cpu it lacks (or
// the process may not use) is refused, and so is a list that leaves no
// core for a worker. auto takes, on each package of at least
// kAutoFrontendMinPackageCores cores, its first core whose domain keeps
// another.
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
