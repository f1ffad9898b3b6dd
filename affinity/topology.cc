// The only file of numaserve that includes <hwloc.h>. It turns hwloc's tree
// into the plain data of topology.h, and implements the binding primitives of
// hwloc_machine.h on a process-wide topology of this machine.
#include "affinity/topology.h"

#include <hwloc.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "affinity/hwloc_machine.h"

namespace numaserve::affinity {
namespace {

constexpr char kThisMachine[] = "this machine";

struct TopologyDeleter {
  void operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* bitmap) const { hwloc_bitmap_free(bitmap); }
};
using BitmapPtr = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

BitmapPtr NewBitmap() { return BitmapPtr(hwloc_bitmap_alloc()); }

BitmapPtr BitmapOf(const std::vector<int>& indexes) {
  BitmapPtr bitmap = NewBitmap();
  for (int index : indexes) hwloc_bitmap_set(bitmap.get(), static_cast<unsigned>(index));
  return bitmap;
}

std::vector<int> IndexesOf(hwloc_const_bitmap_t bitmap) {
  std::vector<int> indexes;
  if (hwloc_bitmap_weight(bitmap) < 0) return indexes;  // infinite set: not a list
  for (int i = hwloc_bitmap_first(bitmap); i >= 0; i = hwloc_bitmap_next(bitmap, i)) {
    indexes.push_back(i);
  }
  return indexes;
}

std::string ErrnoText() { return std::error_code(errno, std::generic_category()).message(); }

bool IsXmlPath(absl::string_view description) {
  return absl::EndsWithIgnoreCase(absl::StripAsciiWhitespace(description), ".xml");
}

// The description as hwloc takes it: trimmed, and for a synthetic one ending
// in its PU level, which hwloc requires but people leave out ("package:2
// core:8" means one PU per core). hwloc itself accepts "l3" and "l3cache",
// "package" and "socket", in any case.
std::string NormalizeDescription(absl::string_view description) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(description);
  if (trimmed.empty() || IsXmlPath(trimmed)) return std::string(trimmed);
  const std::vector<absl::string_view> levels =
      absl::StrSplit(trimmed, absl::ByAnyChar(" \t"), absl::SkipEmpty());
  std::string text = absl::StrJoin(levels, " ");
  if (!absl::StartsWithIgnoreCase(levels.back(), "pu")) absl::StrAppend(&text, " pu:1");
  return text;
}

bool HasCpus(hwloc_obj_t obj) { return obj->cpuset && !hwloc_bitmap_iszero(obj->cpuset); }

// The OS indexes of the NUMA nodes without any cpu, disallowed and offline
// ones included (complete_cpuset): memory-only nodes, as opposed to nodes
// whose cpus a restriction leaves out. Read before any restriction.
std::vector<int> MemoryOnlyNodes(hwloc_topology_t topology) {
  std::vector<int> nodes;
  for (hwloc_obj_t node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, nullptr); node;
       node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, node)) {
    const hwloc_const_bitmap_t cpus = node->complete_cpuset ? node->complete_cpuset : node->cpuset;
    if (cpus == nullptr || hwloc_bitmap_iszero(cpus)) {
      nodes.push_back(static_cast<int>(node->os_index));
    }
  }
  return nodes;
}

// Loads the hwloc topology described by `options`, restricted to the cpus this
// process may use (real machine) and to options.cpuset. `memory_only` gets
// the machine's memory-only nodes (MemoryOnlyNodes, before the restriction).
absl::StatusOr<TopologyPtr> LoadHwloc(const TopologyOptions& options,
                                      std::vector<int>* memory_only) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) {
    return absl::InternalError(absl::StrCat("hwloc_topology_init failed: ", ErrnoText()));
  }
  TopologyPtr topology(raw);

  const std::string description = NormalizeDescription(options.description);
  const bool this_machine = description.empty();
  if (this_machine) {
    // hwloc's defaults already drop what the cgroup cpuset disallows; the
    // sched_setaffinity mask (taskset, a parent's binding) is applied below.
  } else if (IsXmlPath(description)) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(description, ec)) {
      return absl::NotFoundError(
          absl::StrCat("topology XML file '", description, "' does not exist"));
    }
    if (hwloc_topology_set_xml(topology.get(), description.c_str()) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read topology XML file '", description, "': ", ErrnoText()));
    }
  } else if (hwloc_topology_set_synthetic(topology.get(), description.c_str()) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse synthetic topology '", description,
                     "' (expected hwloc levels such as \"package:2 numa:1 core:8 pu:2\" or "
                     "\"package:1 l3:8 core:8 pu:2\"), nor is it a path ending in .xml"));
  }
  if (hwloc_topology_load(topology.get()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot load topology '", this_machine ? kThisMachine : description, "': ", ErrnoText()));
  }

  *memory_only = MemoryOnlyNodes(topology.get());
  BitmapPtr keep(hwloc_bitmap_dup(hwloc_topology_get_topology_cpuset(topology.get())));
  const BitmapPtr all(hwloc_bitmap_dup(keep.get()));
  if (this_machine) {
    // Union of the cpus this process's threads may run on (taskset, numactl,
    // a supervisor's binding). If it cannot be read, keep everything allowed.
    BitmapPtr bound = NewBitmap();
    if (hwloc_get_cpubind(topology.get(), bound.get(), HWLOC_CPUBIND_PROCESS) == 0 &&
        hwloc_bitmap_intersects(bound.get(), keep.get())) {
      hwloc_bitmap_and(keep.get(), keep.get(), bound.get());
    }
  }
  if (!options.cpuset.empty()) {
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList(options.cpuset);
    if (!cpus.ok()) return cpus.status();
    BitmapPtr wanted = BitmapOf(*cpus);
    hwloc_bitmap_and(keep.get(), keep.get(), wanted.get());
    if (hwloc_bitmap_iszero(keep.get())) {
      return absl::InvalidArgumentError(
          absl::StrCat("cpuset '", options.cpuset, "' selects no cpu of topology '",
                       this_machine ? kThisMachine : description,
                       "' (its cpus: ", FormatCpuList(IndexesOf(all.get())), ")"));
    }
  }
  if (!hwloc_bitmap_isequal(keep.get(), all.get())) {
    // Flags 0: objects left without cpus are removed unless they hold memory;
    // Convert() lists the NUMA nodes that still have cpus, and the
    // memory-only ones (MemoryOnlyNodes, read above).
    if (hwloc_topology_restrict(topology.get(), keep.get(), 0) != 0) {
      return absl::InternalError(absl::StrCat("hwloc_topology_restrict to cpus ",
                                              FormatCpuList(IndexesOf(keep.get())),
                                              " failed: ", ErrnoText()));
    }
  }
  return topology;
}

// Dense 0..n-1 indexes of the objects of `type` that have cpus, in logical order.
std::unordered_map<hwloc_obj_t, int> DenseIndexes(hwloc_topology_t topology,
                                                  hwloc_obj_type_t type) {
  std::unordered_map<hwloc_obj_t, int> indexes;
  for (hwloc_obj_t obj = hwloc_get_next_obj_by_type(topology, type, nullptr); obj;
       obj = hwloc_get_next_obj_by_type(topology, type, obj)) {
    if (HasCpus(obj)) indexes.emplace(obj, static_cast<int>(indexes.size()));
  }
  return indexes;
}

int AncestorIndex(hwloc_topology_t topology, hwloc_obj_t obj, hwloc_obj_type_t type,
                  const std::unordered_map<hwloc_obj_t, int>& indexes, int fallback) {
  hwloc_obj_t ancestor = hwloc_get_ancestor_obj_by_type(topology, type, obj);
  auto it = indexes.find(ancestor);
  return it == indexes.end() ? fallback : it->second;
}

// The NUMA node attached nearest above `obj` (memory children of its closest
// ancestor that has any, looking through memory-side caches).
int NearestNumaNode(hwloc_obj_t obj) {
  for (hwloc_obj_t ancestor = obj; ancestor; ancestor = ancestor->parent) {
    for (hwloc_obj_t memory = ancestor->memory_first_child; memory; memory = memory->next_sibling) {
      hwloc_obj_t node = memory;
      while (node && node->type != HWLOC_OBJ_NUMANODE) node = node->memory_first_child;
      if (node) return static_cast<int>(node->os_index);
    }
  }
  return -1;
}

Topology Convert(hwloc_topology_t topology, const std::string& source, bool is_this_machine,
                 const std::vector<int>& memory_only) {
  Topology result;
  result.source = source;
  result.is_this_machine = is_this_machine;

  const auto packages = DenseIndexes(topology, HWLOC_OBJ_PACKAGE);
  const auto l3s = DenseIndexes(topology, HWLOC_OBJ_L3CACHE);
  result.num_packages = std::max<int>(1, static_cast<int>(packages.size()));
  result.num_l3 = static_cast<int>(l3s.size());

  for (hwloc_obj_t node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, nullptr); node;
       node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, node)) {
    NumaNode out;
    out.os_index = static_cast<int>(node->os_index);
    out.memory_bytes = node->attr ? node->attr->numanode.local_memory : 0;
    if (!HasCpus(node)) {
      // No worker can live there; listed when no cpu has it as its own
      // node, left out when a restriction only took its cpus away.
      if (std::find(memory_only.begin(), memory_only.end(), out.os_index) != memory_only.end()) {
        out.package = -1;
        result.memory_only_nodes.push_back(std::move(out));
      }
      continue;
    }
    out.cpus = IndexesOf(node->cpuset);
    // A node attached above the packages (one node for the whole machine)
    // is reported with the package of its first cpu.
    out.package = AncestorIndex(topology, node, HWLOC_OBJ_PACKAGE, packages, -1);
    if (out.package < 0) {
      hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(topology, out.cpus.front());
      out.package = pu ? AncestorIndex(topology, pu, HWLOC_OBJ_PACKAGE, packages, 0) : 0;
    }
    result.numa_nodes.push_back(std::move(out));
  }
  const auto by_index = [](const NumaNode& a, const NumaNode& b) {
    return a.os_index < b.os_index;
  };
  std::sort(result.numa_nodes.begin(), result.numa_nodes.end(), by_index);
  std::sort(result.memory_only_nodes.begin(), result.memory_only_nodes.end(), by_index);

  // Some virtual machines expose PUs without Core objects: then each PU is a core.
  const hwloc_obj_type_t core_type =
      hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  for (hwloc_obj_t obj = hwloc_get_next_obj_by_type(topology, core_type, nullptr); obj;
       obj = hwloc_get_next_obj_by_type(topology, core_type, obj)) {
    if (!HasCpus(obj)) continue;
    Core core;
    core.index = static_cast<int>(result.cores.size());
    for (hwloc_obj_t pu =
             hwloc_get_next_obj_inside_cpuset_by_type(topology, obj->cpuset, HWLOC_OBJ_PU, nullptr);
         pu;
         pu = hwloc_get_next_obj_inside_cpuset_by_type(topology, obj->cpuset, HWLOC_OBJ_PU, pu)) {
      core.pus.push_back(static_cast<int>(pu->os_index));
    }
    core.package = AncestorIndex(topology, obj, HWLOC_OBJ_PACKAGE, packages, 0);
    core.l3 = AncestorIndex(topology, obj, HWLOC_OBJ_L3CACHE, l3s, -1);
    core.numa_node = NearestNumaNode(obj);
    result.cores.push_back(std::move(core));
  }
  return result;
}

// This machine, loaded once (thread-safe), for binding. Unrestricted: a
// worker may be asked to bind to cpus outside the caller's current mask.
// Never destroyed, so it outlives every static that may still bind.
hwloc_topology_t MachineTopology() {
  static hwloc_topology_t machine = [] {
    hwloc_topology_t topology = nullptr;
    if (hwloc_topology_init(&topology) != 0) return static_cast<hwloc_topology_t>(nullptr);
    if (hwloc_topology_load(topology) != 0) {
      hwloc_topology_destroy(topology);
      return static_cast<hwloc_topology_t>(nullptr);
    }
    return topology;
  }();
  return machine;
}

absl::StatusOr<hwloc_topology_t> Machine() {
  hwloc_topology_t topology = MachineTopology();
  if (topology == nullptr) return absl::UnavailableError("cannot load this machine's topology");
  return topology;
}

}  // namespace

uint64_t OuterCacheBytes(int cpu) {
  hwloc_topology_t machine = MachineTopology();
  if (machine == nullptr || cpu < 0) return 0;
  hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(machine, static_cast<unsigned>(cpu));
  uint64_t bytes = 0;
  unsigned depth = 0;
  for (hwloc_obj_t obj = pu; obj != nullptr; obj = obj->parent) {
    if (hwloc_obj_type_is_dcache(obj->type) && obj->attr != nullptr &&
        obj->attr->cache.depth > depth) {
      depth = obj->attr->cache.depth;
      bytes = obj->attr->cache.size;
    }
  }
  return bytes;
}

int Topology::num_pus() const {
  int count = 0;
  for (const Core& core : cores) count += static_cast<int>(core.pus.size());
  return count;
}

absl::StatusOr<Topology> DiscoverTopology(const TopologyOptions& options) {
  std::vector<int> memory_only;
  absl::StatusOr<TopologyPtr> topology = LoadHwloc(options, &memory_only);
  if (!topology.ok()) return topology.status();
  const std::string description = NormalizeDescription(options.description);
  std::string source = description.empty() ? kThisMachine : description;
  if (!options.cpuset.empty()) absl::StrAppend(&source, " restricted to cpus ", options.cpuset);
  Topology result = Convert(topology->get(), source, description.empty(), memory_only);
  if (result.cores.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("topology '", source, "' has no usable core"));
  }
  return result;
}

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& list) {
  constexpr int kMaxCpu = 1 << 20;  // far above any machine; catches typos like "0-99999999"
  std::vector<int> cpus;
  const absl::string_view trimmed = absl::StripAsciiWhitespace(list);
  if (trimmed.empty()) return absl::InvalidArgumentError("empty cpu list");
  for (absl::string_view item : absl::StrSplit(trimmed, ',')) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<absl::string_view> bounds = absl::StrSplit(item, absl::MaxSplits('-', 1));
    int first = 0, last = 0;
    const bool ok = absl::SimpleAtoi(bounds[0], &first) &&
                    absl::SimpleAtoi(bounds.size() == 2 ? bounds[1] : bounds[0], &last) &&
                    !bounds[0].empty() && (bounds.size() == 1 || !bounds[1].empty());
    if (!ok || first < 0 || last < first || last >= kMaxCpu || absl::StrContains(item, '+')) {
      return absl::InvalidArgumentError(absl::StrCat("malformed cpu list '", list, "' at '", item,
                                                     "' (expected e.g. \"0-3,8,10-11\")"));
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::vector<int> sorted = cpus;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::vector<std::string> ranges;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    ranges.push_back(j == i ? absl::StrCat(sorted[i]) : absl::StrCat(sorted[i], "-", sorted[j]));
    i = j + 1;
  }
  return absl::StrJoin(ranges, ",");
}

absl::StatusOr<std::vector<std::vector<int>>> ParseCoreList(const std::string& list) {
  std::vector<std::vector<int>> cores;
  std::unordered_set<int> seen;
  for (absl::string_view item : absl::StrSplit(list, ';')) {
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList(std::string(item));
    if (!cpus.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("malformed core list '", list, "' at core ",
                                                     cores.size(), ": ", cpus.status().message(),
                                                     " (expected e.g. \"0,4;1,5\")"));
    }
    for (int cpu : *cpus) {
      if (!seen.insert(cpu).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("core list '", list, "': cpu ", cpu, " is in two cores"));
      }
    }
    cores.push_back(*std::move(cpus));
  }
  return cores;
}

std::string FormatCoreList(const std::vector<std::vector<int>>& cores) {
  std::vector<std::string> parts;
  parts.reserve(cores.size());
  for (const std::vector<int>& core : cores) parts.push_back(FormatCpuList(core));
  return absl::StrJoin(parts, ";");
}

namespace internal {

absl::Status SetProcessCpuBinding(const std::vector<int>& cpus) {
  absl::StatusOr<hwloc_topology_t> machine = Machine();
  if (!machine.ok()) return machine.status();
  BitmapPtr set = BitmapOf(cpus);
  if (hwloc_set_cpubind(*machine, set.get(), HWLOC_CPUBIND_PROCESS) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot bind process to cpus ", FormatCpuList(cpus), ": ", ErrnoText()));
  }
  return absl::OkStatus();
}

bool MembindRefusedForTests() {
  const char* value = std::getenv("NUMASERVE_TEST_REFUSE_MEMBIND");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

namespace {

// What a refused memory-policy call says, as the kernel's EPERM reads.
absl::Status RefusedForTests(const std::string& what) {
  return absl::PermissionDeniedError(
      absl::StrCat(what, ": ", std::error_code(EPERM, std::generic_category()).message(),
                   " (NUMASERVE_TEST_REFUSE_MEMBIND=1)"));
}

// A refusal (EPERM: seccomp, a missing capability) is PERMISSION_DENIED,
// anything else INTERNAL; the message ends with the errno's text.
absl::Status MembindError(int err, const std::string& what) {
  const std::string text =
      absl::StrCat(what, ": ", std::error_code(err, std::generic_category()).message());
  return err == EPERM ? absl::PermissionDeniedError(text) : absl::InternalError(text);
}

}  // namespace

absl::Status SetMemoryBinding(int numa_node, bool strict) {
  const std::string what = absl::StrCat("cannot bind memory to NUMA node ", numa_node,
                                        strict ? " (strict)" : " (prefer)");
  if (MembindRefusedForTests()) return RefusedForTests(what);
  absl::StatusOr<hwloc_topology_t> machine = Machine();
  if (!machine.ok()) return machine.status();
  BitmapPtr nodes = BitmapOf({numa_node});
  // No PROCESS flag: Linux memory policy is per thread, so hwloc sets the
  // calling thread's, which threads created afterwards inherit.
  // MIGRATE: pages already touched move to the node (migrate_pages), such
  // as the relocated data of the shared libraries that the dynamic loader
  // wrote before main() on whichever cpu the process started: ~10% of a
  // training rank's anonymous pages, mpirun starting it unbound. A page
  // that cannot move stays; the policy still holds for new ones.
  // On Linux, hwloc's BIND is MPOL_BIND only with STRICT; without it,
  // MPOL_PREFERRED_MANY (MPOL_PREFERRED before Linux 5.15), which takes
  // pages from other nodes once this one is full. With STRICT, only a
  // failing migrate_pages call fails the binding, not a page left behind.
  int flags = HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_MIGRATE;
  if (strict) flags |= HWLOC_MEMBIND_STRICT;
  if (hwloc_set_membind(*machine, nodes.get(), HWLOC_MEMBIND_BIND, flags) != 0) {
    return MembindError(errno, what);
  }
  return absl::OkStatus();
}

absl::Status SetAreaMemoryBinding(void* addr, size_t bytes, int numa_node, bool strict) {
  const std::string what = absl::StrFormat("cannot bind %d bytes at %p to NUMA node %d (%s)", bytes,
                                           addr, numa_node, strict ? "strict" : "prefer");
  if (MembindRefusedForTests()) return RefusedForTests(what);
  absl::StatusOr<hwloc_topology_t> machine = Machine();
  if (!machine.ok()) return machine.status();
  BitmapPtr nodes = BitmapOf({numa_node});
  // First the preferred binding, moving the pages it can (mbind
  // MPOL_MF_MOVE). Strict then replaces the policy without moving: hwloc
  // would add MPOL_MF_STRICT to the move, and mbind then fails (EIO) on a
  // page it may not move, such as a shared arena's page the server maps
  // too, which a restarted worker finds in place.
  const int flags = HWLOC_MEMBIND_BYNODESET;
  if (hwloc_set_area_membind(*machine, addr, bytes, nodes.get(), HWLOC_MEMBIND_BIND,
                             flags | HWLOC_MEMBIND_MIGRATE) != 0 ||
      (strict && hwloc_set_area_membind(*machine, addr, bytes, nodes.get(), HWLOC_MEMBIND_BIND,
                                        flags | HWLOC_MEMBIND_STRICT) != 0)) {
    return MembindError(errno, what);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> GetProcessCpuBinding() {
  absl::StatusOr<hwloc_topology_t> machine = Machine();
  if (!machine.ok()) return machine.status();
  BitmapPtr set = NewBitmap();
  if (hwloc_get_cpubind(*machine, set.get(), HWLOC_CPUBIND_PROCESS) != 0) {
    return absl::InternalError(absl::StrCat("cannot read the process cpu binding: ", ErrnoText()));
  }
  return IndexesOf(set.get());
}

int NodeOfPage(const void* addr) {
  hwloc_topology_t machine = MachineTopology();
  if (machine == nullptr || addr == nullptr) return -1;
  BitmapPtr nodes = NewBitmap();
  if (hwloc_get_area_memlocation(machine, addr, 1, nodes.get(), HWLOC_MEMBIND_BYNODESET) != 0) {
    return -1;
  }
  return hwloc_bitmap_iszero(nodes.get()) ? -1 : hwloc_bitmap_first(nodes.get());
}

std::vector<int> MachineNumaNodes() {
  hwloc_topology_t machine = MachineTopology();
  if (machine == nullptr) return {};
  return IndexesOf(hwloc_topology_get_topology_nodeset(machine));
}

}  // namespace internal
}  // namespace numaserve::affinity
