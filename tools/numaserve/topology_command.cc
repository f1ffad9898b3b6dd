#include "tools/numaserve/topology_command.h"

#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "affinity/cpu_features.h"
#include "affinity/memory_bandwidth.h"
#include "affinity/placement.h"
#include "affinity/topology.h"
#include "base/args.h"
#include "tools/numaserve/roofline.h"

namespace numaserve::cli {
namespace {

// The memory bandwidth measured on one NUMA node's cores.
struct NodeBandwidth {
  int numa_node = -1;  // -1: the machine has no NUMA node (all cores)
  affinity::BandwidthResult result;
};

// Cores (not PUs) among `cpus`.
int CoresIn(const affinity::Topology& topology, const std::vector<int>& cpus) {
  const std::set<int> wanted(cpus.begin(), cpus.end());
  int cores = 0;
  for (const affinity::Core& core : topology.cores) {
    for (int pu : core.pus) {
      if (wanted.contains(pu)) {
        ++cores;
        break;
      }
    }
  }
  return cores;
}

// One triad per NUMA node, one thread on the first PU of each of its cores
// (their first touch puts the arrays on that node).
absl::StatusOr<std::vector<NodeBandwidth>> MeasureNodes(const affinity::Topology& topology) {
  std::vector<NodeBandwidth> out;
  std::vector<int> nodes;
  for (const affinity::NumaNode& node : topology.numa_nodes) nodes.push_back(node.os_index);
  if (nodes.empty()) nodes.push_back(-1);
  for (int node : nodes) {
    affinity::BandwidthOptions options;
    for (const affinity::Core& core : topology.cores) {
      if ((node < 0 || core.numa_node == node) && !core.pus.empty()) {
        options.cpus.push_back(core.pus[0]);
      }
    }
    if (options.cpus.empty()) continue;
    // The node's last-level cache: each distinct L3 of its cores once.
    std::set<int> l3s;
    for (const affinity::Core& core : topology.cores) {
      if ((node < 0 || core.numa_node == node) && !core.pus.empty() && l3s.insert(core.l3).second) {
        options.cache_bytes += static_cast<int64_t>(affinity::OuterCacheBytes(core.pus[0]));
      }
    }
    auto result = affinity::MeasureMemoryBandwidth(options);
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrCat("numa node ", node, ": ", result.status().message()));
    }
    out.push_back({node, *std::move(result)});
  }
  return out;
}

std::string LimitsText(const affinity::Topology& topology, const affinity::Plan& plan,
                       const PeakPerCore& peak, const std::vector<NodeBandwidth>& nodes) {
  auto peaks = [](const PeakPerCore& p, int cores) {
    return absl::StrFormat(
        "fp32 %.1f GFLOP/s, bf16 %s, int8 %s", p.fp32_gflops * cores,
        p.bf16_gflops > 0 ? absl::StrFormat("%.1f", p.bf16_gflops * cores) : "-",
        p.int8_gops > 0 ? absl::StrFormat("%.1f GOP/s", p.int8_gops * cores) : "-");
  };
  std::string out = "limits:\n";
  absl::StrAppend(&out, "  peak per core: ", peaks(peak, 1), "\n");
  for (const affinity::WorkerPlacement& worker : plan.workers) {
    const int cores = CoresIn(topology, worker.cpus);
    absl::StrAppend(&out, "  worker ", worker.index, " (", worker.domain, ", ", cores,
                    cores == 1 ? " core" : " cores", "): ", peaks(peak, cores), "\n");
  }
  for (const NodeBandwidth& node : nodes) {
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "  memory bandwidth, %s: %.1f GB/s (triad, %d threads on cpus %s, %.0f MiB, best of "
            "%d)\n",
            node.numa_node >= 0 ? absl::StrCat("numa node ", node.numa_node) : "all cores",
            node.result.gb_per_second, node.result.threads,
            affinity::FormatCpuList(node.result.cpus),
            static_cast<double>(node.result.bytes_per_pass) / (1 << 20), node.result.passes));
  }
  return out;
}

std::string LimitsJson(const affinity::Topology& topology, const affinity::Plan& plan,
                       const PeakPerCore& peak, const std::vector<NodeBandwidth>& nodes) {
  std::string out = absl::StrCat("{\"peak_per_core\":{\"fp32_gflops\":", peak.fp32_gflops,
                                 ",\"bf16_gflops\":", peak.bf16_gflops,
                                 ",\"int8_gops\":", peak.int8_gops, "},\"workers\":[");
  for (size_t i = 0; i < plan.workers.size(); ++i) {
    const affinity::WorkerPlacement& worker = plan.workers[i];
    const int cores = CoresIn(topology, worker.cpus);
    absl::StrAppend(&out, i ? "," : "", "{\"index\":", worker.index, ",\"cores\":", cores,
                    ",\"fp32_gflops\":", peak.fp32_gflops * cores,
                    ",\"bf16_gflops\":", peak.bf16_gflops * cores,
                    ",\"int8_gops\":", peak.int8_gops * cores, "}");
  }
  absl::StrAppend(&out, "],\"memory_bandwidth\":[");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NodeBandwidth& node = nodes[i];
    absl::StrAppend(&out, i ? "," : "", "{\"numa_node\":", node.numa_node,
                    ",\"gb_per_second\":", node.result.gb_per_second,
                    ",\"threads\":", node.result.threads, ",\"cpus\":[");
    for (size_t j = 0; j < node.result.cpus.size(); ++j) {
      absl::StrAppend(&out, j ? "," : "", node.result.cpus[j]);
    }
    absl::StrAppend(&out, "],\"bytes_per_pass\":", node.result.bytes_per_pass,
                    ",\"passes\":", node.result.passes, "}");
  }
  return out + "]}";
}

// This CPU's brand, ISA, core model and peak per core, as text.
void PrintCpuFeatures() {
  const auto& f = affinity::GetCpuFeatures();
  const auto& peak = affinity::GetPeakFlops();
  printf("cpu: %s\n  isa: %s\n", f.brand.c_str(), affinity::FeatureList(f).c_str());
  printf("  model: %s\n", affinity::FormatCpuModel(peak.model).c_str());
  printf(
      "  peak per core at %.2f GHz: fp32 %.1f GFLOP/s (avx2 %.1f), bf16 %.1f, int8 %.1f GOP/s; "
      "probe %.1f GFLOP/s, %s\n",
      peak.probe_ghz, peak.peak_gflops_per_core, peak.peak_avx2_gflops_per_core,
      peak.peak_bf16_gflops_per_core, peak.peak_int8_gops_per_core, peak.measured_gflops_per_core,
      peak.probe_agrees ? "agrees" : "disagrees");
}

}  // namespace

int TopologyCommand(const std::vector<std::string>& args, const serving::ProcessOptions& defaults) {
  serving::ProcessOptions process = defaults;
  std::string description, cpuset, domain = "numa";
  bool json = false, use_smt = false, features = true, omp_spin = false, measure = false;
  int64_t max_workers = 0;
  std::string omp_wait = "short", frontend_cpus = "none";
  base::ArgParser parser("topology", "Print the machine as hwloc sees it and the worker plan.");
  parser.AddString("topology", &description,
                   "an hwloc synthetic description (\"package:2 numa:1 core:8 pu:2\") or XML file");
  parser.AddString("cpuset", &cpuset, "restrict to these cpus, e.g. 0-7");
  parser.AddString("domain", &domain, "one worker per: numa | package | l3 | core");
  parser.AddBool("use-smt", &use_smt, "give workers the SMT siblings of their cores too");
  parser.AddString("omp-wait", &omp_wait,
                   "how idle OpenMP threads wait: passive | short (spin ~25 us) | spin (~1 ms)");
  parser.AddBool("omp-spin", &omp_spin, "the same as --omp-wait spin");
  parser.AddInt("max-workers", &max_workers, "at most this many workers (0: one per domain)");
  parser.AddString("frontend-cpus", &frontend_cpus,
                   "cpus for serve's front end, out of the workers' plan: none | auto | a cpu "
                   "list (as serve --frontend-cpus)");
  parser.AddBool("json", &json, "print one JSON object");
  parser.AddBool("cpu-features", &features, "also probe this CPU's ISA and FP32 peak");
  parser.AddBool("measure", &measure,
                 "also print the machine's limits: FP32/BF16/INT8 peak per core and per worker, "
                 "and the memory bandwidth of each NUMA node measured on its cores (a STREAM "
                 "triad, ~1 s per node)");
  serving::AddProcessFlags(parser, process, serving::kKernelFlags);
  auto fail = [](const absl::Status& s) {
    fprintf(stderr, "numaserve topology: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  if (absl::Status s = parser.Parse(args); !s.ok()) return fail(s);
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  if (absl::Status s = serving::ApplyProcessOptions(process); !s.ok()) return fail(s);
  auto topology = affinity::DiscoverTopology({description, cpuset});
  if (!topology.ok()) return fail(topology.status());
  auto parsed_domain = affinity::ParseDomain(domain);
  if (!parsed_domain.ok()) return fail(parsed_domain.status());
  affinity::PlacementOptions options;
  options.domain = *parsed_domain;
  options.use_smt = use_smt;
  auto wait = affinity::ParseOmpWait(omp_spin ? "spin" : omp_wait);
  if (!wait.ok()) return fail(wait.status());
  options.omp_wait = *wait;
  options.max_workers = static_cast<int>(max_workers);
  auto frontend = affinity::ParseFrontendCpus(frontend_cpus);
  if (!frontend.ok()) return fail(frontend.status());
  options.frontend = *std::move(frontend);
  auto plan = affinity::MakePlan(*topology, options);
  if (!plan.ok()) return fail(plan.status());
  if (measure && !topology->is_this_machine) {
    return fail(absl::InvalidArgumentError(
        "--measure measures this machine; it cannot describe --topology " + description));
  }
  std::vector<NodeBandwidth> bandwidth;
  if (measure) {
    auto measured = MeasureNodes(*topology);
    if (!measured.ok()) return fail(measured.status());
    bandwidth = *std::move(measured);
  }
  if (json) {
    std::string report = affinity::FormatReportJson(*topology, *plan);
    if (measure) {
      // One more member of the report's object: "limits".
      report.pop_back();
      absl::StrAppend(&report, ",\"limits\":",
                      LimitsJson(*topology, *plan, ThisMachinePeakPerCore(), bandwidth), "}");
    }
    printf("%s\n", report.c_str());
    return 0;
  }
  printf("%s", affinity::FormatReport(*topology, *plan).c_str());
  if (features && topology->is_this_machine) PrintCpuFeatures();
  if (measure) {
    printf("%s", LimitsText(*topology, *plan, ThisMachinePeakPerCore(), bandwidth).c_str());
  }
  return 0;
}

}  // namespace numaserve::cli
