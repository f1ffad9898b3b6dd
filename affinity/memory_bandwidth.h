// The machine's memory bandwidth, measured: a STREAM-style triad
// (a[i] = b[i] + s * c[i] over doubles) on arrays far larger than the
// last-level cache, one thread pinned to each given cpu, each thread
// touching its own share first so the pages land on its node. The figure
// counts bytes as STREAM does: 3 arrays x 8 bytes per element (the read of
// a written line, where the CPU does one, is not counted).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace numaserve::affinity {

struct BandwidthOptions {
  // OS cpus to run on, one pinned thread each. Empty: the cpus the calling
  // thread may run on (its affinity mask), so the probe runs where the
  // caller's work does.
  std::vector<int> cpus;
  // Threads: 0 = one per cpu; more than the cpus wraps around them, fewer
  // uses the first ones.
  int threads = 0;
  // The three arrays together; 0 = DefaultProbeBytes for cache_bytes and
  // the memory available now.
  int64_t total_bytes = 0;
  // The last-level cache the threads have between them (the sum over the
  // distinct L3s of their cores); 0 = the one above the first cpu.
  int64_t cache_bytes = 0;
  // The best of up to this many passes is kept (STREAM keeps the best of
  // 10; fewer keeps the probe short) ...
  int repetitions = 5;
  // ... and no new pass starts after this long (at least 2 run), so a slow
  // machine still answers in about this time plus the first touch.
  double max_seconds = 0.5;
};

struct BandwidthResult {
  double gb_per_second = 0;    // best pass: TriadBytes(elements) / its seconds / 1e9
  double best_seconds = 0;     // that pass's wall time
  int64_t elements = 0;        // per array
  int64_t bytes_per_pass = 0;  // TriadBytes(elements)
  int threads = 0;
  int passes = 0;         // passes timed
  std::vector<int> cpus;  // the cpus the threads ran on
};

// Bytes one triad pass over `elements` elements per array moves, counted
// as STREAM does: two arrays read, one written, `element_bytes` each.
inline int64_t TriadBytes(int64_t elements, int64_t element_bytes = sizeof(double)) {
  return 3 * elements * element_bytes;
}

// Elements per array for arrays of `total_bytes` together, rounded down to
// a multiple of 8 per thread (whole cache lines of doubles per share);
// at least 8 per thread.
int64_t TriadElements(int64_t total_bytes, int threads);

// The probe's default size: 4x the last-level cache, at least 256 MiB and
// at most 512 MiB (the first touch of 512 MiB takes ~1 s on a 2-vCPU VM,
// most of the probe's time), and at most a quarter of `available_bytes`
// (0: unknown, no limit from it), but never below 64 MiB. Some hypervisors
// report an L3 of hundreds of MiB per vCPU: the cap keeps the probe short
// there.
int64_t DefaultProbeBytes(uint64_t last_level_cache_bytes, uint64_t available_bytes);

// Where the memory readers below look: the roots of procfs, sysfs and the
// cgroup v2 hierarchy. Tests point them at a tree of their own.
struct MemoryRoots {
  std::string proc = "/proc";
  std::string sys = "/sys";
  std::string cgroup = "/sys/fs/cgroup";
};

// The host's MemAvailable (<proc>/meminfo) in bytes, 0 if unknown.
uint64_t HostAvailableMemoryBytes(const MemoryRoots& roots = {});

// What NUMA node `node` can still give, in bytes, from
// <sys>/devices/system/node/node<N>/meminfo: MemFree + Inactive(file) +
// SReclaimable (the page cache and slab the kernel reclaims first; active
// file pages not counted). 0 if unknown.
uint64_t NodeAvailableMemoryBytes(int node, const MemoryRoots& roots = {});

// What this process's cgroup (v2: the "0::PATH" line of
// <proc>/self/cgroup) and each cgroup above it still allow, the smallest:
// memory.max - memory.current, plus the inactive_file of memory.stat (page
// cache the cgroup reclaims before it fails). nullopt where no cgroup on
// the way has a limit ("max"), or there is no cgroup v2.
std::optional<uint64_t> CgroupMemoryHeadroomBytes(const MemoryRoots& roots = {});

// The NUMA nodes whose memory the calling thread's allocations take: those
// of its memory policy (strict or prefer), else those of the cpus it may
// run on (<sys>/devices/system/node/node<N>/cpulist); empty if unknown.
std::vector<int> CallingThreadMemoryNodes(const MemoryRoots& roots = {});

struct AvailableMemory {
  uint64_t bytes = 0;  // 0: unknown
  std::string source;  // what bounds it: "node 0", "nodes 0-1", "cgroup memory.max", "MemAvailable"
};

// The memory allocations bound to `nodes` can still get: the sum of the
// nodes' NodeAvailableMemoryBytes (the host's MemAvailable where `nodes` is
// empty or none can be read), less where the cgroup's headroom is smaller.
AvailableMemory AvailableMemoryOn(const std::vector<int>& nodes, const MemoryRoots& roots = {});

// AvailableMemoryOn(CallingThreadMemoryNodes()).bytes: the memory checks of
// `instances auto` and batch groups, and the probe's size, count what the
// worker's node and its cgroup can give, not the whole host's free memory.
uint64_t AvailableMemoryBytes();

// Runs the triad. Errors name the cpu that could not be pinned or the
// bytes that could not be allocated. Takes about first touch + up to
// max_seconds: ~1 s in all for the default 512 MiB on a 2-vCPU VM.
absl::StatusOr<BandwidthResult> MeasureMemoryBandwidth(const BandwidthOptions& options);

}  // namespace numaserve::affinity
