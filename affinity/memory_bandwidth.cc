#include "affinity/memory_bandwidth.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "affinity/hwloc_machine.h"
#include "affinity/topology.h"

namespace numaserve::affinity {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr double kTriadScalar = 3.0;

struct FreeDeleter {
  void operator()(double* p) const { std::free(p); }
};
using Array = std::unique_ptr<double, FreeDeleter>;

// Aligned to 2 MiB and advised onto transparent huge pages where the
// kernel allows them: the first touch then faults a 2 MiB page at a time,
// several times faster than 4 KiB pages (most of the probe's time on VMs).
Array AllocateArray(int64_t elements) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t bytes =
      (static_cast<size_t>(elements) * sizeof(double) + kHugePage - 1) / kHugePage * kHugePage;
  Array array(static_cast<double*>(std::aligned_alloc(kHugePage, bytes)));
  if (array != nullptr) madvise(array.get(), bytes, MADV_HUGEPAGE);  // advice only
  return array;
}

std::vector<int> CallingThreadCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

bool PinCallingThread(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// The text of a small kernel file (meminfo, memory.max); nullopt if it
// cannot be read or is over 1 MiB.
std::optional<std::string> ReadSmallFile(const std::string& path) {
  constexpr size_t kMaxBytes = 1 << 20;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text;
  char buffer[4096];
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxBytes) return std::nullopt;
  }
  if (in.bad()) return std::nullopt;
  return text;
}

uint64_t SaturatingSum(std::initializer_list<uint64_t> values) {
  uint64_t sum = 0;
  for (uint64_t v : values) sum = v > UINT64_MAX - sum ? UINT64_MAX : sum + v;
  return sum;
}

// "KEY: VALUE kB" lines (/proc/meminfo) or "Node N KEY: VALUE kB" lines (a
// node's meminfo) as bytes by key, without the colon; a line that does not
// parse, or whose value would not fit in bytes, is left out.
std::map<std::string, uint64_t> MeminfoBytes(std::string_view text) {
  std::map<std::string, uint64_t> fields;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(text.data(), text.size()), '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.size() >= 2 && words[0] == "Node") words.erase(words.begin(), words.begin() + 2);
    if (words.size() < 2 || !absl::ConsumeSuffix(&words[0], ":")) continue;
    uint64_t value = 0;
    if (!absl::SimpleAtoi(words[1], &value)) continue;
    const bool kib = words.size() >= 3 && words[2] == "kB";
    if (kib && value > UINT64_MAX / 1024) continue;
    fields[std::string(words[0])] = kib ? value * 1024 : value;
  }
  return fields;
}

std::string NodeDirectory(const MemoryRoots& roots) { return roots.sys + "/devices/system/node"; }

// {node: its cpus} from <sys>/devices/system/node/node<N>/cpulist; a
// memory-only node has none.
std::map<int, std::vector<int>> NodeCpus(const MemoryRoots& roots) {
  std::map<int, std::vector<int>> nodes;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(NodeDirectory(roots), ec)) {
    const std::string name = entry.path().filename().string();
    int node = 0;
    if (!absl::StartsWith(name, "node") || !absl::SimpleAtoi(name.substr(4), &node) || node < 0) {
      continue;
    }
    std::optional<std::string> text = ReadSmallFile(entry.path().string() + "/cpulist");
    absl::StatusOr<std::vector<int>> cpus =
        text ? ParseCpuList(std::string(absl::StripAsciiWhitespace(*text)))
             : absl::StatusOr<std::vector<int>>(std::vector<int>());
    nodes[node] = cpus.ok() ? *std::move(cpus) : std::vector<int>();
  }
  return nodes;
}

// The process's cgroup v2 path from /proc/self/cgroup's "0::PATH" line,
// without a trailing '/' ("" for the root); nullopt without one, or for a
// path that is not absolute, holds "..", or is longer than PATH_MAX.
std::optional<std::string> UnifiedCgroupPath(std::string_view text) {
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(text.data(), text.size()), '\n', absl::SkipEmpty())) {
    if (!absl::ConsumePrefix(&line, "0::")) continue;
    std::string path(absl::StripTrailingAsciiWhitespace(line));
    if (path.empty() || path[0] != '/' || path.size() > 4096 || absl::StrContains(path, "/..") ||
        path.find('\0') != std::string::npos) {
      return std::nullopt;
    }
    while (!path.empty() && path.back() == '/') path.pop_back();
    return path;
  }
  return std::nullopt;
}

// One cgroup's headroom (see CgroupMemoryHeadroomBytes); nullopt where it
// has no memory.max or it is "max".
std::optional<uint64_t> CgroupHeadroom(const std::string& dir) {
  const std::optional<std::string> max_text = ReadSmallFile(dir + "/memory.max");
  uint64_t limit = 0;
  if (!max_text || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*max_text), &limit)) {
    return std::nullopt;  // absent, "max", or unreadable: no limit here
  }
  uint64_t current = 0;
  if (const std::optional<std::string> text = ReadSmallFile(dir + "/memory.current")) {
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &current)) current = 0;
  }
  uint64_t inactive_file = 0;
  if (const std::optional<std::string> text = ReadSmallFile(dir + "/memory.stat")) {
    for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
      if (absl::ConsumePrefix(&line, "inactive_file ") &&
          !absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &inactive_file)) {
        inactive_file = 0;
      }
    }
  }
  const uint64_t used = std::min(current, limit);
  return SaturatingSum({limit - used, std::min(inactive_file, used)});
}

void Triad(double* __restrict a, const double* __restrict b, const double* __restrict c,
           int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + kTriadScalar * c[i];
}

// What the probe's threads measured: the passes timed, the best pass's
// seconds, and the cpu a thread could not be pinned to (-1: none).
struct TriadRun {
  int passes = 0;
  double best = 0;
  int unpinned = -1;
};

// Sets the calling thread's affinity back to `own` (nothing when empty).
void RestoreCallingThreadCpus(const std::vector<int>& own) {
  if (!own.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : own) CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
}

// Runs the triad on one thread per thread_cpus entry (the calling thread is
// thread 0), each pinned and touching its `share` of a, b and c first,
// until options.repetitions passes or options.max_seconds.
TriadRun RunTriadThreads(const std::vector<int>& thread_cpus, double* a, double* b, double* c,
                         int64_t share, const BandwidthOptions& options) {
  const int threads = static_cast<int>(thread_cpus.size());
  using Clock = std::chrono::steady_clock;
  // Run by whichever thread completes a phase, before any is released:
  // phase 0 after pinning, 1 after the first touch (the clock starts),
  // then one per pass.
  int phase = 0;
  int passes = 0;
  double best = 0;
  bool stop = false;
  Clock::time_point pass_start, first_pass_start;
  auto on_phase = [&]() noexcept {
    const Clock::time_point now = Clock::now();
    if (phase == 1) first_pass_start = now;
    if (phase >= 2) {
      const double seconds = std::chrono::duration<double>(now - pass_start).count();
      best = passes == 0 ? seconds : std::min(best, seconds);
      ++passes;
      const double elapsed = std::chrono::duration<double>(now - first_pass_start).count();
      stop = passes >= options.repetitions || (passes >= 2 && elapsed >= options.max_seconds);
    }
    ++phase;
    pass_start = Clock::now();
  };
  std::barrier sync(threads, on_phase);
  std::atomic<int> unpinned{-1};
  auto work = [&](int t) {
    if (!PinCallingThread(thread_cpus[t])) unpinned.store(thread_cpus[t]);
    sync.arrive_and_wait();
    if (unpinned.load() >= 0) return;
    double* my_a = a + t * share;
    double* my_b = b + t * share;
    double* my_c = c + t * share;
    // First touch from the pinned thread: the pages are local to its node.
    for (int64_t i = 0; i < share; ++i) {
      my_a[i] = 1.0;
      my_b[i] = 2.0;
      my_c[i] = 0.5;
    }
    sync.arrive_and_wait();
    while (true) {
      Triad(my_a, my_b, my_c, share);
      sync.arrive_and_wait();
      if (stop) break;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  // The calling thread is thread 0; its own affinity is restored after.
  const std::vector<int> own = CallingThreadCpus();
  work(0);
  for (std::thread& th : pool) th.join();
  RestoreCallingThreadCpus(own);
  return TriadRun{.passes = passes, .best = best, .unpinned = unpinned.load()};
}

}  // namespace

int64_t TriadElements(int64_t total_bytes, int threads) {
  const int64_t unit = 8 * std::max(threads, 1);
  const int64_t elements = total_bytes / (3 * static_cast<int64_t>(sizeof(double)));
  return std::max(unit, elements / unit * unit);
}

int64_t DefaultProbeBytes(uint64_t last_level_cache_bytes, uint64_t available_bytes) {
  int64_t bytes = std::max<int64_t>(4 * static_cast<int64_t>(last_level_cache_bytes), 256 * kMiB);
  bytes = std::min<int64_t>(bytes, 512 * kMiB);
  if (available_bytes > 0) bytes = std::min<int64_t>(bytes, available_bytes / 4);
  return std::max<int64_t>(bytes, 64 * kMiB);
}

uint64_t HostAvailableMemoryBytes(const MemoryRoots& roots) {
  const std::optional<std::string> text = ReadSmallFile(roots.proc + "/meminfo");
  if (!text) return 0;
  const std::map<std::string, uint64_t> fields = MeminfoBytes(*text);
  auto it = fields.find("MemAvailable");
  return it == fields.end() ? 0 : it->second;
}

uint64_t NodeAvailableMemoryBytes(int node, const MemoryRoots& roots) {
  if (node < 0) return 0;
  const std::optional<std::string> text =
      ReadSmallFile(absl::StrCat(NodeDirectory(roots), "/node", node, "/meminfo"));
  if (!text) return 0;
  const std::map<std::string, uint64_t> fields = MeminfoBytes(*text);
  const auto get = [&](const char* key) -> uint64_t {
    auto it = fields.find(key);
    return it == fields.end() ? 0 : it->second;
  };
  if (fields.find("MemFree") == fields.end()) return 0;
  return SaturatingSum({get("MemFree"), get("Inactive(file)"), get("SReclaimable")});
}

std::optional<uint64_t> CgroupMemoryHeadroomBytes(const MemoryRoots& roots) {
  const std::optional<std::string> own = ReadSmallFile(roots.proc + "/self/cgroup");
  if (!own) return std::nullopt;
  const std::optional<std::string> path = UnifiedCgroupPath(*own);
  if (!path) return std::nullopt;
  // The process's cgroup, then each one above it up to the hierarchy's
  // root (whose memory.max exists only where a cgroup namespace makes the
  // container's cgroup the root).
  std::optional<uint64_t> smallest;
  std::string dir = *path;
  while (true) {
    if (std::optional<uint64_t> headroom = CgroupHeadroom(roots.cgroup + dir)) {
      smallest = smallest ? std::min(*smallest, *headroom) : *headroom;
    }
    if (dir.empty()) break;
    dir.resize(dir.rfind('/'));
  }
  return smallest;
}

std::vector<int> CallingThreadMemoryNodes(const MemoryRoots& roots) {
  absl::StatusOr<internal::MemoryBinding> binding = internal::GetMemoryBinding();
  if (binding.ok() && !binding->nodes.empty() &&
      (std::string_view(binding->policy) == "strict" ||
       std::string_view(binding->policy) == "prefer")) {
    return binding->nodes;
  }
  const std::vector<int> cpus = CallingThreadCpus();
  std::vector<int> nodes;
  for (const auto& [node, node_cpus] : NodeCpus(roots)) {
    const bool shared = std::any_of(node_cpus.begin(), node_cpus.end(), [&](int cpu) {
      return std::find(cpus.begin(), cpus.end(), cpu) != cpus.end();
    });
    if (shared) nodes.push_back(node);
  }
  return nodes;
}

AvailableMemory AvailableMemoryOn(const std::vector<int>& nodes, const MemoryRoots& roots) {
  AvailableMemory result;
  for (int node : nodes) {
    result.bytes = SaturatingSum({result.bytes, NodeAvailableMemoryBytes(node, roots)});
  }
  if (result.bytes > 0) {
    result.source = absl::StrCat(nodes.size() == 1 ? "node " : "nodes ", FormatCpuList(nodes));
  } else {
    result.bytes = HostAvailableMemoryBytes(roots);
    result.source = "MemAvailable";
  }
  const std::optional<uint64_t> cgroup = CgroupMemoryHeadroomBytes(roots);
  if (cgroup && (result.bytes == 0 || *cgroup < result.bytes)) {
    result.bytes = *cgroup;
    result.source = "cgroup memory.max";
  }
  if (result.bytes == 0) result.source.clear();
  return result;
}

uint64_t AvailableMemoryBytes() { return AvailableMemoryOn(CallingThreadMemoryNodes()).bytes; }

absl::StatusOr<BandwidthResult> MeasureMemoryBandwidth(const BandwidthOptions& options) {
  std::vector<int> cpus = options.cpus.empty() ? CallingThreadCpus() : options.cpus;
  if (cpus.empty()) return absl::FailedPreconditionError("no cpu to run the bandwidth probe on");
  if (options.threads < 0 || options.repetitions < 1 || options.total_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bandwidth probe: threads (", options.threads, ") and total bytes (", options.total_bytes,
        ") must be >= 0, repetitions (", options.repetitions, ") >= 1"));
  }
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(cpus.size());
  std::vector<int> thread_cpus;
  for (int t = 0; t < threads; ++t) thread_cpus.push_back(cpus[t % cpus.size()]);
  const int64_t total =
      options.total_bytes > 0
          ? options.total_bytes
          : DefaultProbeBytes(options.cache_bytes > 0 ? static_cast<uint64_t>(options.cache_bytes)
                                                      : OuterCacheBytes(thread_cpus.front()),
                              AvailableMemoryBytes());
  const int64_t n = TriadElements(total, threads);
  Array a = AllocateArray(n), b = AllocateArray(n), c = AllocateArray(n);
  if (a == nullptr || b == nullptr || c == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "bandwidth probe: cannot allocate 3 arrays of ", n * sizeof(double), " bytes"));
  }
  const int64_t share = n / threads;
  const TriadRun run = RunTriadThreads(thread_cpus, a.get(), b.get(), c.get(), share, options);
  const int passes = run.passes;
  const double best = run.best;
  if (run.unpinned >= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("bandwidth probe: cannot pin a thread to cpu ", run.unpinned));
  }
  // The triad's result, checked (and so not optimized away).
  const double expected = 2.0 + kTriadScalar * 0.5;
  if (a.get()[0] != expected || a.get()[n - 1] != expected || best <= 0) {
    return absl::InternalError("bandwidth probe: the triad computed a wrong result");
  }
  BandwidthResult r;
  r.elements = n;
  r.bytes_per_pass = TriadBytes(n);
  r.best_seconds = best;
  r.gb_per_second = static_cast<double>(r.bytes_per_pass) / best / 1e9;
  r.threads = threads;
  r.passes = passes;
  r.cpus = thread_cpus;
  return r;
}

}  // namespace numaserve::affinity
