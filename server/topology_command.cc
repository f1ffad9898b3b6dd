#include "server/topology_command.h"

#include <cstdio>

#include "affinity/cpu_features.h"
#include "affinity/placement.h"
#include "affinity/topology.h"
#include "server/args.h"

namespace numaserve::server {

int TopologyCommand(const std::vector<std::string>& args) {
  std::string description, cpuset, domain = "numa";
  bool json = false, use_smt = false, features = true, omp_spin = false;
  int64_t max_workers = 0;
  std::string omp_wait = "short";
  ArgParser parser("topology", "Print the machine as hwloc sees it and the worker plan.");
  parser.AddString("topology", &description,
                   "an hwloc synthetic description (\"package:2 numa:1 core:8 pu:2\") or XML file");
  parser.AddString("cpuset", &cpuset, "restrict to these cpus, e.g. 0-7");
  parser.AddString("domain", &domain, "one worker per: numa | package | l3 | core");
  parser.AddBool("use-smt", &use_smt, "give workers the SMT siblings of their cores too");
  parser.AddString("omp-wait", &omp_wait,
                   "how idle OpenMP threads wait: passive | short (spin ~25 us) | spin (~1 ms)");
  parser.AddBool("omp-spin", &omp_spin, "the same as --omp-wait spin");
  parser.AddInt("max-workers", &max_workers, "at most this many workers (0: one per domain)");
  parser.AddBool("json", &json, "print one JSON object");
  parser.AddBool("cpu-features", &features, "also probe this CPU's ISA and FP32 peak");
  auto fail = [](const absl::Status& s) {
    fprintf(stderr, "numaserve topology: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  if (absl::Status s = parser.Parse(args); !s.ok()) return fail(s);
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
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
  auto plan = affinity::MakePlan(*topology, options);
  if (!plan.ok()) return fail(plan.status());
  if (json) {
    printf("%s\n", affinity::FormatReportJson(*topology, *plan).c_str());
    return 0;
  }
  printf("%s", affinity::FormatReport(*topology, *plan).c_str());
  if (features && topology->is_this_machine) {
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
  return 0;
}

}  // namespace numaserve::server
