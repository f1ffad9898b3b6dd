#include "affinity/placement.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/log.h"

namespace numaserve::affinity {
namespace {

// Cores of one domain, in the topology's core order.
struct Group {
  std::string label;
  int numa_node = -1;
  std::vector<const Core*> cores;
};

// The key of a core's domain; std::map orders groups by it.
int DomainKey(const Core& core, Domain domain) {
  switch (domain) {
    case Domain::kNuma:
      return core.numa_node;
    case Domain::kPackage:
      return core.package;
    case Domain::kL3:
      return core.l3;
    case Domain::kCore:
      return core.index;
  }
  return 0;
}

// Groups `cores` (the topology's, less the front end's) by domain.
absl::StatusOr<std::vector<Group>> GroupCores(const Topology& topology,
                                              const std::vector<Core>& cores, Domain domain) {
  std::map<int, Group> groups;
  int cores_without_domain = 0;
  for (const Core& core : cores) {
    const int key = DomainKey(core, domain);
    if (key < 0) {
      ++cores_without_domain;
      continue;
    }
    Group& group = groups[key];
    if (group.cores.empty()) group.label = absl::StrCat(DomainName(domain), " ", key);
    group.cores.push_back(&core);
  }
  if (cores_without_domain > 0) {
    if (domain == Domain::kL3 && groups.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("domain l3 found no L3 cache in topology '", topology.source, "' (",
                       cores.size(), " cores); use domain numa, package or core"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "domain ", DomainName(domain), ": ", cores_without_domain, " of ", cores.size(),
        " cores of topology '", topology.source, "' belong to no ", DomainName(domain)));
  }
  std::vector<Group> result;
  for (auto& [key, group] : groups) {
    // Memory follows the cores when they all share one node. A package or L3
    // domain spanning several nodes (AMD NPS2/NPS4) is left to first touch by
    // its own, pinned threads, which keeps pages on their local nodes.
    group.numa_node = group.cores.front()->numa_node;
    for (const Core* core : group.cores) {
      if (core->numa_node != group.numa_node) group.numa_node = -1;
    }
    result.push_back(std::move(group));
  }
  return result;
}

// The groups a plan of at most `max_workers` workers takes: all of them when
// they fit, else in turn from each package (its first group, then each
// package's second, ...) so that a capped plan still uses every socket's
// cores and memory; kept in the topology's order.
std::vector<Group> TakeInTurnFromPackages(std::vector<Group> groups, int max_workers) {
  if (max_workers <= 0 || static_cast<int>(groups.size()) <= max_workers) return groups;
  std::map<int, std::vector<size_t>> by_package;  // package -> its groups, in order
  for (size_t i = 0; i < groups.size(); ++i) {
    by_package[groups[i].cores.front()->package].push_back(i);
  }
  std::vector<size_t> taken;
  for (size_t round = 0; static_cast<int>(taken.size()) < max_workers; ++round) {
    for (const auto& [package, indexes] : by_package) {
      if (round < indexes.size() && static_cast<int>(taken.size()) < max_workers) {
        taken.push_back(indexes[round]);
      }
    }
  }
  std::sort(taken.begin(), taken.end());
  std::vector<Group> result;
  for (size_t i : taken) result.push_back(std::move(groups[i]));
  return result;
}

// The front end's cpus for `options` on `topology`, ascending: the listed
// ones, checked against the topology's; or auto's pick (see MakePlan).
absl::StatusOr<std::vector<int>> ResolveFrontendCpus(const Topology& topology,
                                                     const PlacementOptions& options) {
  const FrontendCpus& frontend = options.frontend;
  if (frontend.mode == FrontendCpus::Mode::kNone) return std::vector<int>();
  std::set<int> all;
  for (const Core& core : topology.cores) all.insert(core.pus.begin(), core.pus.end());
  if (frontend.mode == FrontendCpus::Mode::kList) {
    for (int cpu : frontend.cpus) {
      if (all.count(cpu) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--frontend-cpus: cpu ", cpu, " is not one of the cpus this server may use (",
            FormatCpuList(std::vector<int>(all.begin(), all.end())), ", topology '",
            topology.source, "')"));
      }
    }
    return frontend.cpus;
  }
  // auto: on each package big enough, its first core whose domain keeps
  // another core (so that no worker is lost to the front end).
  std::map<int, std::vector<const Core*>> by_package;
  std::map<int, int> cores_in_domain;
  for (const Core& core : topology.cores) {
    by_package[core.package].push_back(&core);
    ++cores_in_domain[DomainKey(core, options.domain)];
  }
  std::vector<int> cpus;
  for (const auto& [package, cores] : by_package) {
    if (static_cast<int>(cores.size()) < kAutoFrontendMinPackageCores) continue;
    for (const Core* core : cores) {
      if (cores_in_domain[DomainKey(*core, options.domain)] < 2) continue;
      cpus.insert(cpus.end(), core->pus.begin(), core->pus.end());
      break;
    }
  }
  std::sort(cpus.begin(), cpus.end());
  return cpus;
}

// The topology's cores less those holding a front-end cpu (a core is the
// front end's whole: no worker thread shares it).
std::vector<Core> CoresWithoutFrontend(const Topology& topology, const std::vector<int>& frontend) {
  const std::set<int> taken(frontend.begin(), frontend.end());
  std::vector<Core> cores;
  for (const Core& core : topology.cores) {
    const bool shared =
        std::any_of(core.pus.begin(), core.pus.end(), [&](int pu) { return taken.count(pu) != 0; });
    if (!shared) cores.push_back(core);
  }
  return cores;
}

// Where a worker's supervisor thread runs with front-end cpus: the front
// end's cpus on the worker's NUMA node (its package where the worker spans
// several nodes), so that it stays off the workers' cores and near its
// worker's memory; where that node has none, the worker's cores (all their
// threads). Ascending.
std::vector<int> SupervisorCpus(const Topology& topology, const Group& group,
                                const std::vector<int>& frontend) {
  const std::set<int> taken(frontend.begin(), frontend.end());
  const int package = group.cores.front()->package;
  std::set<int> cpus;
  for (const Core& core : topology.cores) {
    const bool near =
        group.numa_node >= 0 ? core.numa_node == group.numa_node : core.package == package;
    if (!near) continue;
    for (int pu : core.pus) {
      if (taken.count(pu) != 0) cpus.insert(pu);
    }
  }
  if (cpus.empty()) {
    for (const Core* core : group.cores) cpus.insert(core->pus.begin(), core->pus.end());
  }
  return std::vector<int>(cpus.begin(), cpus.end());
}

std::string FormatBytes(uint64_t bytes) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  if (bytes == 0) return "memory unknown";
  if (bytes >= 1024ull * 1024 * 1024) return absl::StrFormat("%.1f GiB", bytes / kGiB);
  return absl::StrFormat("%d MiB", bytes / (1024 * 1024));
}

std::string JsonIntArray(const std::vector<int>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ","), "]");
}

const char* JsonBool(bool value) { return value ? "true" : "false"; }

// "1 core", "8 cores".
std::string Count(size_t n, absl::string_view singular, absl::string_view plural) {
  return absl::StrCat(n, " ", n == 1 ? singular : plural);
}

}  // namespace

absl::StatusOr<FrontendCpus> ParseFrontendCpus(const std::string& text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  FrontendCpus frontend;
  if (lower == "none") return frontend;
  if (lower == "auto") {
    frontend.mode = FrontendCpus::Mode::kAuto;
    return frontend;
  }
  absl::StatusOr<std::vector<int>> cpus = ParseCpuList(text);
  if (!cpus.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--frontend-cpus expects none, auto or a cpu list such as 0,2-3: ",
                     cpus.status().message()));
  }
  std::sort(cpus->begin(), cpus->end());
  cpus->erase(std::unique(cpus->begin(), cpus->end()), cpus->end());
  frontend.mode = FrontendCpus::Mode::kList;
  frontend.cpus = *std::move(cpus);
  return frontend;
}

int PhysicalCores(const WorkerPlacement& worker) {
  return worker.cores.empty() ? static_cast<int>(worker.cpus.size())
                              : static_cast<int>(worker.cores.size());
}

double WorkerPeak(const WorkerPlacement& worker, double per_core) {
  return per_core * PhysicalCores(worker);
}

absl::StatusOr<Domain> ParseDomain(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "numa") return Domain::kNuma;
  if (lower == "package" || lower == "socket") return Domain::kPackage;
  if (lower == "l3") return Domain::kL3;
  if (lower == "core") return Domain::kCore;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown placement domain '", name, "' (expected numa, package, l3 or core)"));
}

absl::StatusOr<OmpWait> ParseOmpWait(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "passive") return OmpWait::kPassive;
  if (lower == "short") return OmpWait::kShort;
  if (lower == "spin" || lower == "active") return OmpWait::kSpin;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown OpenMP wait policy '", name, "' (expected passive, short or spin)"));
}

const char* OmpWaitName(OmpWait wait) {
  switch (wait) {
    case OmpWait::kPassive:
      return "passive";
    case OmpWait::kShort:
      return "short";
    case OmpWait::kSpin:
      return "spin";
  }
  return "?";
}

const char* DomainName(Domain domain) {
  switch (domain) {
    case Domain::kNuma:
      return "numa";
    case Domain::kPackage:
      return "package";
    case Domain::kL3:
      return "l3";
    case Domain::kCore:
      return "core";
  }
  return "unknown";
}

absl::StatusOr<Plan> MakePlan(const Topology& topology, const PlacementOptions& options) {
  if (options.max_workers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_workers must be >= 0 (0 = one per domain), got ", options.max_workers));
  }
  if (topology.cores.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("topology '", topology.source, "' has no cores to place workers on"));
  }
  absl::StatusOr<std::vector<int>> frontend = ResolveFrontendCpus(topology, options);
  if (!frontend.ok()) return frontend.status();
  const std::vector<Core> cores = CoresWithoutFrontend(topology, *frontend);
  if (cores.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--frontend-cpus ", FormatCpuList(*frontend), " leaves no core for a worker (topology '",
        topology.source, "', ", topology.cores.size(), " cores)"));
  }
  absl::StatusOr<std::vector<Group>> groups = GroupCores(topology, cores, options.domain);
  if (!groups.ok()) return groups.status();
  const std::vector<Group> taken = TakeInTurnFromPackages(*std::move(groups), options.max_workers);

  Plan plan;
  plan.topology_source = topology.source;
  plan.domain = options.domain;
  plan.use_smt = options.use_smt;
  plan.omp_wait = options.omp_wait;
  plan.frontend_cpus = *frontend;
  for (const Group& group : taken) {
    WorkerPlacement worker;
    worker.index = static_cast<int>(plan.workers.size());
    worker.domain = group.label;
    worker.numa_node = group.numa_node;
    // Core-major order: with SMT, a core's siblings are adjacent places, so
    // OMP_PROC_BIND=close puts threads 2i and 2i+1 on one core.
    for (const Core* core : group.cores) {
      if (core->pus.empty()) continue;
      std::vector<int> own = options.use_smt ? core->pus : std::vector<int>{core->pus.front()};
      worker.cpus.insert(worker.cpus.end(), own.begin(), own.end());
      worker.cores.push_back(std::move(own));
    }
    worker.num_threads = static_cast<int>(worker.cpus.size());
    worker.env = OpenMpEnvironment(worker.cpus, worker.num_threads, options.omp_wait);
    if (!frontend->empty()) worker.supervisor_cpus = SupervisorCpus(topology, group, *frontend);
    plan.workers.push_back(std::move(worker));
  }
  return plan;
}

std::vector<std::pair<std::string, std::string>> OpenMpEnvironment(const std::vector<int>& cpus,
                                                                   int threads, OmpWait wait) {
  if (threads <= 0) threads = static_cast<int>(cpus.size());
  std::vector<std::pair<std::string, std::string>> env;
  env.emplace_back("OMP_NUM_THREADS", absl::StrCat(std::max(threads, 1)));
  if (!cpus.empty()) {
    // One place per cpu, in the worker's order: thread i runs on cpus[i].
    std::vector<std::string> places;
    for (int cpu : cpus) places.push_back(absl::StrCat("{", cpu, "}"));
    env.emplace_back("OMP_PLACES", absl::StrJoin(places, ","));
    env.emplace_back("OMP_PROC_BIND", "close");
  }
  // Spinning saves the wake-up between one operator's parallel region and
  // the next; long spinning only pays when the cores are the worker's alone
  // (see OmpWait). Every spin is bounded below, so an idle worker stops
  // burning its cores soon after a batch.
  const bool spin = wait == OmpWait::kSpin;
  env.emplace_back("OMP_WAIT_POLICY", spin ? "active" : "passive");
  if (!cpus.empty()) {
    // Intel/LLVM runtime. Explicit KMP_AFFINITY takes precedence over
    // OMP_PLACES there; nowarnings keeps it from complaining that both are set.
    env.emplace_back("KMP_AFFINITY", absl::StrCat("nowarnings,granularity=fine,proclist=[",
                                                  absl::StrJoin(cpus, ","), "],explicit"));
  }
  // Intel/LLVM: spin 1 ms after a parallel region before sleeping (default
  // 200 ms), long enough to cover operator gaps and short enough when idle;
  // 0 sleeps at once.
  // (Its unit is a millisecond, too coarse for the short spin: that sleeps.)
  env.emplace_back("KMP_BLOCKTIME", spin ? "1" : "0");
  if (!cpus.empty()) {
    // libgomp (Debian's oneDNN and OpenBLAS): the same binding for runtimes
    // that predate OMP_PLACES; OMP_PLACES wins where both are understood.
    env.emplace_back("GOMP_CPU_AFFINITY", absl::StrJoin(cpus, " "));
  }
  // libgomp: pauses spun before sleeping. An explicit count overrides the
  // 30e9 (spin "forever") that OMP_WAIT_POLICY=active implies there and the
  // 0 of passive. A pause takes ~23 ns on the Zen 5 of
  // benchmarks/results/2026-11-22-cli-omp-wait.md
  // (more on older cores): 1000 is ~25 us, 10000 a few hundred us.
  env.emplace_back("GOMP_SPINCOUNT", spin ? "10000" : wait == OmpWait::kShort ? "1000" : "0");
  return env;
}

std::string FormatReport(const Topology& topology, const Plan& plan) {
  std::string out;
  absl::StrAppend(&out, "topology: ", topology.source,
                  topology.is_this_machine ? "" : " (not this machine: bindings are advisory)",
                  "\n");
  const size_t nodes = topology.numa_nodes.size() + topology.memory_only_nodes.size();
  absl::StrAppend(&out, "  ", Count(topology.num_packages, "package", "packages"), ", ",
                  Count(nodes, "NUMA node", "NUMA nodes"),
                  topology.memory_only_nodes.empty()
                      ? ""
                      : absl::StrCat(" (", topology.memory_only_nodes.size(), " memory-only)"),
                  ", ", Count(topology.num_l3, "L3 domain", "L3 domains"), ", ",
                  Count(topology.cores.size(), "core", "cores"), ", ",
                  Count(topology.num_pus(), "PU", "PUs"), "\n");
  for (const NumaNode& node : topology.numa_nodes) {
    absl::StrAppend(&out, "  numa ", node.os_index, ": package ", node.package, ", ",
                    FormatBytes(node.memory_bytes), ", cpus ", FormatCpuList(node.cpus), "\n");
  }
  for (const NumaNode& node : topology.memory_only_nodes) {
    absl::StrAppend(&out, "  numa ", node.os_index, ": memory only, ",
                    FormatBytes(node.memory_bytes), ", no cpus: no worker\n");
  }
  absl::StrAppend(&out, "plan: domain ", DomainName(plan.domain), ", smt ",
                  plan.use_smt ? "on" : "off", ", omp-wait ", OmpWaitName(plan.omp_wait), ", ",
                  Count(plan.workers.size(), "worker", "workers"), "\n");
  if (!plan.frontend_cpus.empty()) {
    absl::StrAppend(&out, "front end: cpus ", FormatCpuList(plan.frontend_cpus),
                    " (no worker's)\n");
  }
  for (const WorkerPlacement& worker : plan.workers) {
    // Cores spanned: cpus grouped by the core that holds them.
    int cores = 0;
    for (const Core& core : topology.cores) {
      for (int pu : core.pus) {
        if (std::find(worker.cpus.begin(), worker.cpus.end(), pu) != worker.cpus.end()) {
          ++cores;
          break;
        }
      }
    }
    std::string span = Count(cores, "core", "cores");
    if (static_cast<int>(worker.cpus.size()) != cores) {
      absl::StrAppend(&span, ", ", Count(worker.cpus.size(), "PU", "PUs"));
    }
    absl::StrAppend(&out, "worker ", worker.index, ": ", worker.domain, ", cpus ",
                    FormatCpuList(worker.cpus), " (", span, "), ",
                    worker.numa_node >= 0 ? absl::StrCat("memory node ", worker.numa_node)
                                          : std::string("memory first-touch"),
                    ", ", Count(worker.num_threads, "thread", "threads"), "\n");
    if (!worker.supervisor_cpus.empty()) {
      absl::StrAppend(&out, "  supervisor thread: cpus ", FormatCpuList(worker.supervisor_cpus),
                      "\n");
    }
    for (const auto& [name, value] : worker.env) {
      absl::StrAppend(&out, "  ", name, "=", value, "\n");
    }
  }
  return out;
}

std::string FormatReportJson(const Topology& topology, const Plan& plan) {
  std::string out = "{\"topology\":{";
  absl::StrAppend(&out, "\"source\":", base::JsonString(topology.source),
                  ",\"is_this_machine\":", JsonBool(topology.is_this_machine),
                  ",\"packages\":", topology.num_packages, ",\"l3_domains\":", topology.num_l3,
                  ",\"cores\":", topology.cores.size(), ",\"pus\":", topology.num_pus(),
                  ",\"numa_nodes\":[");
  for (size_t i = 0; i < topology.numa_nodes.size(); ++i) {
    const NumaNode& node = topology.numa_nodes[i];
    absl::StrAppend(&out, i ? "," : "", "{\"os_index\":", node.os_index,
                    ",\"package\":", node.package, ",\"memory_bytes\":", node.memory_bytes,
                    ",\"cpus\":", JsonIntArray(node.cpus), "}");
  }
  absl::StrAppend(&out, "],\"memory_only_nodes\":[");
  for (size_t i = 0; i < topology.memory_only_nodes.size(); ++i) {
    const NumaNode& node = topology.memory_only_nodes[i];
    absl::StrAppend(&out, i ? "," : "", "{\"os_index\":", node.os_index,
                    ",\"memory_bytes\":", node.memory_bytes, "}");
  }
  absl::StrAppend(&out, "]},\"plan\":{\"domain\":", base::JsonString(DomainName(plan.domain)),
                  ",\"use_smt\":", JsonBool(plan.use_smt),
                  ",\"omp_wait\":", base::JsonString(OmpWaitName(plan.omp_wait)),
                  ",\"frontend_cpus\":", JsonIntArray(plan.frontend_cpus), ",\"workers\":[");
  for (size_t i = 0; i < plan.workers.size(); ++i) {
    const WorkerPlacement& worker = plan.workers[i];
    absl::StrAppend(&out, i ? "," : "", "{\"index\":", worker.index,
                    ",\"domain\":", base::JsonString(worker.domain),
                    ",\"cpus\":", JsonIntArray(worker.cpus), ",\"numa_node\":", worker.numa_node,
                    ",\"num_threads\":", worker.num_threads,
                    ",\"supervisor_cpus\":", JsonIntArray(worker.supervisor_cpus), ",\"env\":{");
    for (size_t j = 0; j < worker.env.size(); ++j) {
      absl::StrAppend(&out, j ? "," : "", base::JsonString(worker.env[j].first), ":",
                      base::JsonString(worker.env[j].second));
    }
    absl::StrAppend(&out, "}}");
  }
  absl::StrAppend(&out, "]}}");
  return out;
}

}  // namespace numaserve::affinity
