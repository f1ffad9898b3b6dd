#include "affinity/placement.h"

#include <map>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "affinity/pinning.h"
#include "affinity/topology.h"
#include "gtest/gtest.h"

namespace numaserve::affinity {
namespace {

Topology Synthetic(const std::string& description, const std::string& cpuset = "") {
  TopologyOptions options;
  options.description = description;
  options.cpuset = cpuset;
  absl::StatusOr<Topology> topology = DiscoverTopology(options);
  EXPECT_TRUE(topology.ok()) << description << ": " << topology.status();
  return topology.ok() ? *topology : Topology{};
}

Plan MustPlan(const Topology& topology, Domain domain, bool use_smt = false, int max_workers = 0) {
  PlacementOptions options;
  options.domain = domain;
  options.use_smt = use_smt;
  options.max_workers = max_workers;
  absl::StatusOr<Plan> plan = MakePlan(topology, options);
  EXPECT_TRUE(plan.ok()) << topology.source << " domain " << DomainName(domain) << ": "
                         << plan.status();
  return plan.ok() ? *plan : Plan{};
}

std::string EnvValue(const WorkerPlacement& worker, const std::string& name) {
  for (const auto& [key, value] : worker.env) {
    if (key == name) return value;
  }
  return "<unset>";
}

std::set<int> PrimaryPus(const Topology& topology) {
  std::set<int> primaries;
  for (const Core& core : topology.cores) primaries.insert(core.pus.front());
  return primaries;
}

// Every cpu appears in at most one worker.
void ExpectDisjoint(const Plan& plan) {
  std::set<int> seen;
  for (const WorkerPlacement& worker : plan.workers) {
    for (int cpu : worker.cpus) EXPECT_TRUE(seen.insert(cpu).second) << "cpu " << cpu << " twice";
  }
}

// Linux numbers SMT siblings apart: on 4 cores of 2 threads, cpus i and i+4
// are one core's (hwloc's synthetic default numbers them adjacently).
constexpr char kLinuxSmt[] = "pack:1 core:4 pu:2(indexes=0,4,1,5,2,6,3,7)";

// The core of each cpu of `topology`.
std::map<int, int> CoreOfCpu(const Topology& topology) {
  std::map<int, int> core_of;
  for (const Core& core : topology.cores) {
    for (int pu : core.pus) core_of[pu] = core.index;
  }
  return core_of;
}

// No core has cpus in two shares.
void ExpectWholeCores(const Topology& topology, const std::vector<std::vector<int>>& shares) {
  const std::map<int, int> core_of = CoreOfCpu(topology);
  std::map<int, size_t> share_of_core;
  for (size_t s = 0; s < shares.size(); ++s) {
    for (int cpu : shares[s]) {
      const int core = core_of.at(cpu);
      auto [it, inserted] = share_of_core.emplace(core, s);
      EXPECT_EQ(it->second, s) << "core " << core << " (cpu " << cpu << ") is in share " << s
                               << " and share " << it->second;
    }
  }
}

// The worker's instance shares as `numaserve serve` makes them: the plan's
// cores passed as --cores, parsed, kept within the cpus the worker is bound
// to (`bound`, ascending as the kernel reports them), split in n.
std::vector<std::vector<int>> WorkerShares(const WorkerPlacement& worker,
                                           const std::vector<int>& bound, int n) {
  absl::StatusOr<std::vector<std::vector<int>>> cores = ParseCoreList(FormatCoreList(worker.cores));
  EXPECT_TRUE(cores.ok()) << cores.status();
  if (!cores.ok()) return {};
  return SplitCores(CoresWithin(*cores, bound), n);
}

TEST(InstanceSharesTest, SmtInstancesTakeWholeCoresInThePlansOrder) {
  const Topology topology = Synthetic(kLinuxSmt);
  const Plan plan = MustPlan(topology, Domain::kNuma, /*use_smt=*/true);
  ASSERT_EQ(plan.workers.size(), 1u);
  const WorkerPlacement& worker = plan.workers[0];
  // Core-major: a core's two threads are adjacent places.
  EXPECT_EQ(worker.cpus, (std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(worker.cores, (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  const std::vector<int> bound = {0, 1, 2, 3, 4, 5, 6, 7};
  const auto two = WorkerShares(worker, bound, 2);
  EXPECT_EQ(two, (std::vector<std::vector<int>>{{0, 4, 1, 5}, {2, 6, 3, 7}}));
  ExpectWholeCores(topology, two);
  for (int n : {3, 4}) ExpectWholeCores(topology, WorkerShares(worker, bound, n));
  EXPECT_EQ(WorkerShares(worker, bound, 3)[0], (std::vector<int>{0, 4, 1, 5}));
}

TEST(InstanceSharesTest, WithoutSmtEachCoreGivesItsFirstThread) {
  const Topology topology = Synthetic(kLinuxSmt);
  const Plan plan = MustPlan(topology, Domain::kNuma);
  const WorkerPlacement& worker = plan.workers[0];
  EXPECT_EQ(worker.cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(worker.cores, (std::vector<std::vector<int>>{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(WorkerShares(worker, {0, 1, 2, 3}, 2), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
}

TEST(InstanceSharesTest, PerCoreCountsCoresNotTheirThreads) {
  const Topology topology = Synthetic(kLinuxSmt);
  const Plan plan = MustPlan(topology, Domain::kNuma, /*use_smt=*/true);
  const WorkerPlacement& worker = plan.workers[0];
  // per_core is one copy per core: 4 here, each of 2 threads.
  auto cores = ParseCoreList(FormatCoreList(worker.cores));
  ASSERT_TRUE(cores.ok()) << cores.status();
  EXPECT_EQ(cores->size(), topology.cores.size());
  const auto shares = SplitCores(*cores, static_cast<int>(cores->size()));
  ASSERT_EQ(shares.size(), 4u);
  for (const auto& share : shares) EXPECT_EQ(share.size(), 2u);
  ExpectWholeCores(topology, shares);
}

TEST(InstanceSharesTest, BoundCpusKeepThePlansOrder) {
  // Bound to fewer cpus than planned (a cgroup took cpu 5): core 1 keeps
  // its first thread, and the order stays the plan's.
  const std::vector<std::vector<int>> cores = {{3, 7}, {1, 5}, {0, 4}};
  EXPECT_EQ(CoresWithin(cores, {0, 1, 3, 4, 7}),
            (std::vector<std::vector<int>>{{3, 7}, {1}, {0, 4}}));
  EXPECT_EQ(CoresWithin(cores, {2}), (std::vector<std::vector<int>>{}));
  // The first shares take the cores left over.
  EXPECT_EQ(SplitCores(cores, 2), (std::vector<std::vector<int>>{{3, 7, 1, 5}, {0, 4}}));
  // More shares than cores: the last ones are empty (the worker refuses
  // that count before splitting).
  EXPECT_EQ(SplitCores({{0}}, 2), (std::vector<std::vector<int>>{{0}, {}}));
  EXPECT_EQ(SplitCores({}, 0), (std::vector<std::vector<int>>{{}}));
}

TEST(CoreListTest, ParseAndFormat) {
  EXPECT_EQ(FormatCoreList({{0, 4}, {1, 5}, {2, 3}}), "0,4;1,5;2-3");
  EXPECT_EQ(FormatCoreList({{7}, {0}}), "7;0");
  auto parsed = ParseCoreList("0,4;1,5;2-3");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 3}}));
  parsed = ParseCoreList(" 7 ; 0 ");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, (std::vector<std::vector<int>>{{7}, {0}}));
  for (const char* bad : {"", ";", "0;;1", "0,4;4", "0-3;2", "a;1", "0;-1", "0;99999999"}) {
    auto s = ParseCoreList(bad);
    EXPECT_FALSE(s.ok()) << "'" << bad << "'";
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(
      absl::StrContains(ParseCoreList("0,4;4").status().message(), "cpu 4 is in two cores"));
}

TEST(TopologyTest, TwoSocketSynthetic) {
  const Topology topology = Synthetic("package:2 numa:1 core:8 pu:2");
  EXPECT_FALSE(topology.is_this_machine);
  EXPECT_EQ(topology.num_packages, 2);
  EXPECT_EQ(topology.num_l3, 0);
  ASSERT_EQ(topology.numa_nodes.size(), 2u);
  EXPECT_EQ(topology.cores.size(), 16u);
  EXPECT_EQ(topology.num_pus(), 32);
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(topology.numa_nodes[n].os_index, n);
    EXPECT_EQ(topology.numa_nodes[n].package, n);
    EXPECT_GT(topology.numa_nodes[n].memory_bytes, 0u);
    EXPECT_EQ(topology.numa_nodes[n].cpus.size(), 16u);
  }
  for (const Core& core : topology.cores) {
    EXPECT_EQ(core.pus.size(), 2u);
    EXPECT_EQ(core.package, core.index / 8);
    EXPECT_EQ(core.numa_node, core.index / 8);
    EXPECT_EQ(core.l3, -1);
  }
}

TEST(PlacementTest, NumaOnTwoSocketsUsesPrimaryPus) {
  const Topology topology = Synthetic("package:2 numa:1 core:8 pu:2");
  const Plan plan = MustPlan(topology, Domain::kNuma);
  ASSERT_EQ(plan.workers.size(), 2u);
  const std::set<int> primaries = PrimaryPus(topology);
  for (int w = 0; w < 2; ++w) {
    const WorkerPlacement& worker = plan.workers[w];
    EXPECT_EQ(worker.index, w);
    EXPECT_EQ(worker.domain, "numa " + std::to_string(w));
    EXPECT_EQ(worker.numa_node, w);
    EXPECT_EQ(worker.cpus.size(), 8u);
    EXPECT_EQ(worker.num_threads, 8);
    EXPECT_EQ(EnvValue(worker, "OMP_NUM_THREADS"), "8");
    for (int cpu : worker.cpus) {
      EXPECT_TRUE(primaries.count(cpu)) << "cpu " << cpu << " is an SMT sibling";
      EXPECT_EQ(cpu / 16, w) << "cpu " << cpu << " outside numa " << w;
    }
  }
  ExpectDisjoint(plan);
  EXPECT_EQ(plan.workers[0].cpus, (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
}

TEST(PlacementTest, NumaWithSmtTakesAllPus) {
  const Topology topology = Synthetic("package:2 numa:1 core:8 pu:2");
  const Plan plan = MustPlan(topology, Domain::kNuma, /*use_smt=*/true);
  ASSERT_EQ(plan.workers.size(), 2u);
  EXPECT_TRUE(plan.use_smt);
  for (const WorkerPlacement& worker : plan.workers) {
    EXPECT_EQ(worker.cpus.size(), 16u);
    EXPECT_EQ(worker.num_threads, 16);
    EXPECT_EQ(EnvValue(worker, "OMP_NUM_THREADS"), "16");
  }
  // Siblings adjacent, so OMP_PROC_BIND=close packs a core's two threads.
  EXPECT_EQ(plan.workers[1].cpus.front(), 16);
  EXPECT_EQ(plan.workers[1].cpus[1], 17);
  ExpectDisjoint(plan);
}

TEST(PlacementTest, EpycLikeNps4WithL3) {
  // Package > NUMA (NPS4) > L3 (CCX) > core, as on EPYC.
  const Topology topology = Synthetic("package:2 numa:4 l3:2 core:4 pu:2");
  EXPECT_EQ(topology.num_packages, 2);
  EXPECT_EQ(topology.numa_nodes.size(), 8u);
  EXPECT_EQ(topology.num_l3, 16);
  EXPECT_EQ(topology.cores.size(), 64u);

  const Plan l3 = MustPlan(topology, Domain::kL3);
  ASSERT_EQ(l3.workers.size(), 16u);
  for (const WorkerPlacement& worker : l3.workers) {
    EXPECT_EQ(worker.cpus.size(), 4u);
    EXPECT_EQ(worker.numa_node, worker.index / 2) << worker.domain;
  }
  ExpectDisjoint(l3);

  const Plan numa = MustPlan(topology, Domain::kNuma);
  ASSERT_EQ(numa.workers.size(), 8u);
  for (const WorkerPlacement& worker : numa.workers) {
    EXPECT_EQ(worker.cpus.size(), 8u);
    EXPECT_EQ(worker.numa_node, worker.index);
  }

  const Plan package = MustPlan(topology, Domain::kPackage);
  ASSERT_EQ(package.workers.size(), 2u);
  for (const WorkerPlacement& worker : package.workers) {
    EXPECT_EQ(worker.cpus.size(), 32u);
    EXPECT_EQ(worker.numa_node, -1) << "a package spans 4 nodes: memory is left to first touch";
  }

  const Plan core = MustPlan(topology, Domain::kCore, /*use_smt=*/true);
  ASSERT_EQ(core.workers.size(), 64u);
  EXPECT_EQ(core.workers[5].domain, "core 5");
  EXPECT_EQ(core.workers[5].cpus, (std::vector<int>{10, 11}));
}

TEST(PlacementTest, L3DomainsOnOneSocket) {
  for (const char* description :
       {"package:1 l3:8 core:8 pu:2", "package:1 l3cache:8 core:8 pu:2"}) {
    const Topology topology = Synthetic(description);
    EXPECT_EQ(topology.num_l3, 8) << description;
    const Plan plan = MustPlan(topology, Domain::kL3);
    ASSERT_EQ(plan.workers.size(), 8u) << description;
    for (const WorkerPlacement& worker : plan.workers) {
      EXPECT_EQ(worker.cpus.size(), 8u);
      EXPECT_EQ(worker.numa_node, 0);  // hwloc adds one NUMA node to the machine
    }
  }
}

TEST(TopologyTest, DescriptionForms) {
  // hwloc needs the PU level; without it each core has one PU.
  const Topology no_pu = Synthetic("  package:2   core:4 ");
  EXPECT_EQ(no_pu.source, "package:2 core:4 pu:1");
  EXPECT_EQ(no_pu.cores.size(), 8u);
  EXPECT_EQ(no_pu.num_pus(), 8);
  const Topology socket = Synthetic("Socket:2 L3Cache:2 core:2 pu:2");
  EXPECT_EQ(socket.num_packages, 2);
  EXPECT_EQ(socket.num_l3, 4);
  EXPECT_EQ(socket.num_pus(), 16);
}

TEST(PlacementTest, SingleSocket) {
  const Topology topology = Synthetic("package:1 numa:1 core:4 pu:1");
  const Plan plan = MustPlan(topology, Domain::kNuma);
  ASSERT_EQ(plan.workers.size(), 1u);
  EXPECT_EQ(plan.workers[0].cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(plan.workers[0].numa_node, 0);
  EXPECT_EQ(MustPlan(topology, Domain::kCore).workers.size(), 4u);
  EXPECT_EQ(MustPlan(topology, Domain::kPackage).workers.size(), 1u);
}

TEST(PlacementTest, MaxWorkersCaps) {
  const Topology topology = Synthetic("package:2 numa:4 l3:2 core:4 pu:2");
  const Plan plan = MustPlan(topology, Domain::kL3, false, /*max_workers=*/3);
  ASSERT_EQ(plan.workers.size(), 3u);
  // In turn from each package (l3 0-7 are package 0's, 8-15 package 1's),
  // in the topology's order.
  EXPECT_EQ(plan.workers[0].domain, "l3 0");
  EXPECT_EQ(plan.workers[1].domain, "l3 1");
  EXPECT_EQ(plan.workers[2].domain, "l3 8");
  EXPECT_EQ(plan.workers[2].index, 2);
  PlacementOptions negative;
  negative.max_workers = -1;
  EXPECT_FALSE(MakePlan(topology, negative).ok());
}

TEST(PlacementTest, MaxWorkersTakesEveryPackage) {
  // Two packages of two single-core nodes (AMD NPS4-like): two workers take
  // one node of each package, not both nodes of package 0.
  const Topology topology = Synthetic("package:2 numa:2 core:1 pu:1");
  const Plan two = MustPlan(topology, Domain::kNuma, false, /*max_workers=*/2);
  ASSERT_EQ(two.workers.size(), 2u);
  EXPECT_EQ(two.workers[0].numa_node, 0);
  EXPECT_EQ(two.workers[1].numa_node, 2);
  EXPECT_EQ(two.workers[1].cpus, (std::vector<int>{2}));
  const Plan three = MustPlan(topology, Domain::kNuma, false, /*max_workers=*/3);
  ASSERT_EQ(three.workers.size(), 3u);
  EXPECT_EQ(three.workers[1].numa_node, 1);
  EXPECT_EQ(three.workers[2].numa_node, 2);
  EXPECT_EQ(MustPlan(topology, Domain::kNuma, false, 4).workers.size(), 4u);
  EXPECT_EQ(MustPlan(topology, Domain::kCore, false, 2).workers[1].cpus, (std::vector<int>{2}));
}

TEST(PlacementTest, RestrictedCpuset) {
  // cpus 0-7 of a 2x8-core, 2-PU machine: the first 4 cores of package 0.
  const Topology topology = Synthetic("package:2 numa:1 core:8 pu:2", "0-7");
  EXPECT_EQ(topology.cores.size(), 4u);
  EXPECT_EQ(topology.num_pus(), 8);
  EXPECT_EQ(topology.num_packages, 1);
  ASSERT_EQ(topology.numa_nodes.size(), 1u);
  EXPECT_EQ(topology.numa_nodes[0].cpus, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(absl::StrContains(topology.source, "0-7"));
  const Plan plan = MustPlan(topology, Domain::kNuma);
  ASSERT_EQ(plan.workers.size(), 1u);
  EXPECT_EQ(plan.workers[0].cpus, (std::vector<int>{0, 2, 4, 6}));

  // Half a core: only its allowed PU remains; cpus across both packages.
  const Topology odd = Synthetic("package:2 numa:1 core:8 pu:2", "1,16-19");
  EXPECT_EQ(odd.cores.size(), 3u);
  EXPECT_EQ(odd.cores[0].pus, (std::vector<int>{1}));
  EXPECT_EQ(odd.num_packages, 2);
  const Plan two = MustPlan(odd, Domain::kNuma);
  ASSERT_EQ(two.workers.size(), 2u);
  EXPECT_EQ(two.workers[0].cpus, (std::vector<int>{1}));
  EXPECT_EQ(two.workers[1].cpus, (std::vector<int>{16, 18}));
  EXPECT_EQ(two.workers[1].numa_node, 1);
}

TEST(PlacementTest, Errors) {
  TopologyOptions bad;
  bad.description = "package:2 bogus:3";
  absl::StatusOr<Topology> parsed = DiscoverTopology(bad);
  ASSERT_FALSE(parsed.ok());
  EXPECT_TRUE(absl::StrContains(parsed.status().message(), "package:2 bogus:3")) << parsed.status();

  TopologyOptions missing;
  missing.description = "/nonexistent/topology.xml";
  EXPECT_EQ(DiscoverTopology(missing).status().code(), absl::StatusCode::kNotFound);

  const Topology no_l3 = Synthetic("package:2 numa:1 core:8 pu:2");
  PlacementOptions l3;
  l3.domain = Domain::kL3;
  absl::StatusOr<Plan> plan = MakePlan(no_l3, l3);
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "no L3")) << plan.status();
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "package:2 numa:1 core:8 pu:2"))
      << plan.status();

  TopologyOptions nothing;
  nothing.description = "package:2 numa:1 core:8 pu:2";
  nothing.cpuset = "40-47";
  absl::StatusOr<Topology> empty = DiscoverTopology(nothing);
  ASSERT_FALSE(empty.ok());
  EXPECT_TRUE(absl::StrContains(empty.status().message(), "40-47")) << empty.status();
  EXPECT_TRUE(absl::StrContains(empty.status().message(), "0-31")) << empty.status();

  nothing.cpuset = "3-1";
  EXPECT_FALSE(DiscoverTopology(nothing).ok());

  EXPECT_FALSE(ParseDomain("socketz").ok());
  EXPECT_EQ(*ParseDomain("L3"), Domain::kL3);
  EXPECT_EQ(*ParseDomain("package"), Domain::kPackage);
}

TEST(CpuListTest, ParseAndFormat) {
  EXPECT_EQ(*ParseCpuList("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(*ParseCpuList(" 5 "), (std::vector<int>{5}));
  EXPECT_EQ(*ParseCpuList("3,1,2,2"), (std::vector<int>{1, 2, 3}));
  for (const char* bad : {"", "a", "1-", "-1", "3-1", "1,,2", "1-2-3", "+1", "0-99999999"}) {
    EXPECT_FALSE(ParseCpuList(bad).ok()) << "'" << bad << "'";
  }
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(FormatCpuList({8, 0, 2, 1}), "0-2,8");
  EXPECT_EQ(FormatCpuList({}), "");
  EXPECT_EQ(FormatCpuList({0, 2, 4}), "0,2,4");
  for (const char* list : {"0", "0-3,8,10-11", "1,3,5-63,100"}) {
    EXPECT_EQ(FormatCpuList(*ParseCpuList(list)), list);
  }
}

TEST(OpenMpEnvironmentTest, VariablesInStableOrder) {
  const auto env = OpenMpEnvironment({4, 5, 6}, 3);
  std::vector<std::string> names;
  for (const auto& [name, value] : env) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND",
                                             "OMP_WAIT_POLICY", "KMP_AFFINITY", "KMP_BLOCKTIME",
                                             "GOMP_CPU_AFFINITY", "GOMP_SPINCOUNT"}));
  WorkerPlacement worker;
  worker.env = env;
  EXPECT_EQ(EnvValue(worker, "OMP_NUM_THREADS"), "3");
  EXPECT_EQ(EnvValue(worker, "OMP_PLACES"), "{4},{5},{6}");
  EXPECT_EQ(EnvValue(worker, "OMP_PROC_BIND"), "close");
  EXPECT_EQ(EnvValue(worker, "GOMP_CPU_AFFINITY"), "4 5 6");
  EXPECT_TRUE(absl::StrContains(EnvValue(worker, "KMP_AFFINITY"), "proclist=[4,5,6],explicit"));
}

TEST(OpenMpEnvironmentTest, IdleThreadsSpinShortlyByDefault) {
  WorkerPlacement passive, short_spin, spin;
  passive.env = OpenMpEnvironment({0, 1}, 2, OmpWait::kPassive);
  short_spin.env = OpenMpEnvironment({0, 1}, 2);
  spin.env = OpenMpEnvironment({0, 1}, 2, OmpWait::kSpin);
  EXPECT_EQ(EnvValue(passive, "OMP_WAIT_POLICY"), "passive");
  EXPECT_EQ(EnvValue(passive, "KMP_BLOCKTIME"), "0");
  EXPECT_EQ(EnvValue(passive, "GOMP_SPINCOUNT"), "0");
  EXPECT_EQ(EnvValue(short_spin, "OMP_WAIT_POLICY"), "passive");
  EXPECT_EQ(EnvValue(short_spin, "KMP_BLOCKTIME"), "0");
  EXPECT_EQ(EnvValue(short_spin, "GOMP_SPINCOUNT"), "1000");
  EXPECT_EQ(EnvValue(spin, "OMP_WAIT_POLICY"), "active");
  EXPECT_EQ(EnvValue(spin, "KMP_BLOCKTIME"), "1");
  EXPECT_EQ(EnvValue(spin, "GOMP_SPINCOUNT"), "10000");

  auto topology = DiscoverTopology({"package:1 numa:1 core:2 pu:1", ""});
  ASSERT_TRUE(topology.ok()) << topology.status();
  PlacementOptions options;
  auto plan = MakePlan(*topology, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->omp_wait, OmpWait::kShort);
  EXPECT_EQ(EnvValue(plan->workers[0], "GOMP_SPINCOUNT"), "1000");
  EXPECT_TRUE(absl::StrContains(FormatReport(*topology, *plan), "omp-wait short"));
  options.omp_wait = OmpWait::kSpin;
  plan = MakePlan(*topology, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(EnvValue(plan->workers[0], "OMP_WAIT_POLICY"), "active");
  EXPECT_TRUE(absl::StrContains(FormatReport(*topology, *plan), "omp-wait spin"));
  EXPECT_TRUE(absl::StrContains(FormatReportJson(*topology, *plan), "\"omp_wait\":\"spin\""));
}

TEST(OmpWaitTest, ParsesTheThreePoliciesAndNamesTheChoicesOtherwise) {
  EXPECT_EQ(*ParseOmpWait("passive"), OmpWait::kPassive);
  EXPECT_EQ(*ParseOmpWait("SHORT"), OmpWait::kShort);
  EXPECT_EQ(*ParseOmpWait("spin"), OmpWait::kSpin);
  EXPECT_EQ(*ParseOmpWait("active"), OmpWait::kSpin);
  auto bad = ParseOmpWait("lazy");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "passive, short or spin"));
  for (OmpWait w : {OmpWait::kPassive, OmpWait::kShort, OmpWait::kSpin}) {
    EXPECT_EQ(*ParseOmpWait(OmpWaitName(w)), w);
  }
}

// Structural JSON check: balanced brackets outside strings, no trailing commas.
bool LooksLikeJson(const std::string& json) {
  int depth = 0;
  bool in_string = false;
  char last = 0;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      last = 'x';
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') {
      if (last == ',' || --depth < 0) return false;
    }
    last = c;
  }
  return depth == 0 && !in_string && json.front() == '{' && json.back() == '}';
}

TEST(ReportTest, TextAndJson) {
  const Topology topology = Synthetic("package:2 numa:1 core:8 pu:2");
  const Plan plan = MustPlan(topology, Domain::kNuma);
  const std::string text = FormatReport(topology, plan);
  EXPECT_TRUE(absl::StrContains(text, "2 packages, 2 NUMA nodes, 0 L3 domains, 16 cores, 32 PUs"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "numa 1: package 1, 1.0 GiB, cpus 16-31")) << text;
  EXPECT_TRUE(absl::StrContains(
      text, "worker 0: numa 0, cpus 0,2,4,6,8,10,12,14 (8 cores), memory node 0, 8 threads"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "  OMP_NUM_THREADS=8\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "  GOMP_CPU_AFFINITY=16 18 20 22 24 26 28 30\n")) << text;

  const Plan smt = MustPlan(topology, Domain::kNuma, true);
  EXPECT_TRUE(absl::StrContains(FormatReport(topology, smt), "cpus 0-15 (8 cores, 16 PUs)"));

  const std::string json = FormatReportJson(topology, plan);
  EXPECT_TRUE(LooksLikeJson(json)) << json;
  for (const char* key :
       {"\"topology\":{", "\"source\":\"package:2 numa:1 core:8 pu:2\"", "\"numa_nodes\":[",
        "\"plan\":{", "\"domain\":\"numa\"", "\"use_smt\":false", "\"workers\":[",
        "\"cpus\":[0,2,4,6,8,10,12,14]", "\"numa_node\":1", "\"num_threads\":8",
        "\"OMP_PLACES\":\"{16},{18},{20},{22},{24},{26},{28},{30}\"", "\"memory_bytes\":"}) {
    EXPECT_TRUE(absl::StrContains(json, key)) << key << " in " << json;
  }
  // Strings are escaped.
  Topology quoted = topology;
  quoted.source = "a \"b\"\\c\n";
  const std::string escaped = FormatReportJson(quoted, plan);
  EXPECT_TRUE(absl::StrContains(escaped, R"("source":"a \"b\"\\c\n")")) << escaped;
  EXPECT_TRUE(LooksLikeJson(escaped));
}

TEST(XmlTopologyTest, LoadsExport) {
  // tests/affinity/data/two_packages.xml: lstopo-no-graphics --input
  // "package:2 numa:1 core:2 pu:1" --of xml
  const std::string path = std::string(NUMASERVE_AFFINITY_TEST_DATA) + "/two_packages.xml";
  const Topology topology = Synthetic(path);
  EXPECT_FALSE(topology.is_this_machine);
  EXPECT_EQ(topology.source, path);
  EXPECT_EQ(topology.num_packages, 2);
  EXPECT_EQ(topology.numa_nodes.size(), 2u);
  EXPECT_EQ(topology.cores.size(), 4u);
  const Plan plan = MustPlan(topology, Domain::kNuma);
  ASSERT_EQ(plan.workers.size(), 2u);
  EXPECT_EQ(plan.workers[1].cpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(plan.workers[1].numa_node, 1);
}

// tests/affinity/data/qemu_*.xml: `lstopo-no-graphics --no-io --of xml` in
// the QEMU guests of tests/numa (make test-numa), topologies
// two-packages-memory-node and four-nodes of tests/numa/topologies.py.
std::string QemuXml(const std::string& name) {
  return std::string(NUMASERVE_AFFINITY_TEST_DATA) + "/qemu_" + name + ".xml";
}

TEST(XmlTopologyTest, MemoryOnlyNodeIsListedWithoutWorker) {
  // Two packages with a node each (cpus 0-1, 2-3) and node 2, memory only.
  const Topology topology = Synthetic(QemuXml("memory_only_node"));
  ASSERT_EQ(topology.numa_nodes.size(), 2u);
  ASSERT_EQ(topology.memory_only_nodes.size(), 1u);
  EXPECT_EQ(topology.memory_only_nodes[0].os_index, 2);
  EXPECT_GT(topology.memory_only_nodes[0].memory_bytes, 0u);
  EXPECT_TRUE(topology.memory_only_nodes[0].cpus.empty());
  const Plan plan = MustPlan(topology, Domain::kNuma);
  ASSERT_EQ(plan.workers.size(), 2u);
  EXPECT_EQ(plan.workers[0].numa_node, 0);
  EXPECT_EQ(plan.workers[1].numa_node, 1);

  const std::string text = FormatReport(topology, plan);
  EXPECT_TRUE(absl::StrContains(text, "2 packages, 3 NUMA nodes (1 memory-only), ")) << text;
  EXPECT_TRUE(absl::StrContains(text, "  numa 2: memory only, 501 MiB, no cpus: no worker\n"))
      << text;
  const std::string json = FormatReportJson(topology, plan);
  EXPECT_TRUE(LooksLikeJson(json)) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"memory_only_nodes\":[{\"os_index\":2,\"memory_bytes\":"))
      << json;

  // Restricted to node 1's cpus: node 0 is left out, not called memory-only.
  const Topology restricted = Synthetic(QemuXml("memory_only_node"), "2-3");
  ASSERT_EQ(restricted.numa_nodes.size(), 1u);
  EXPECT_EQ(restricted.numa_nodes[0].os_index, 1);
  ASSERT_EQ(restricted.memory_only_nodes.size(), 1u);
  EXPECT_EQ(restricted.memory_only_nodes[0].os_index, 2);
  EXPECT_TRUE(absl::StrContains(FormatReport(restricted, MustPlan(restricted, Domain::kNuma)),
                                "1 package, 2 NUMA nodes (1 memory-only), "));

  // A machine without one says nothing of it.
  const Topology plain = Synthetic("package:2 numa:1 core:2 pu:1");
  EXPECT_TRUE(plain.memory_only_nodes.empty());
  const std::string plain_text = FormatReport(plain, MustPlan(plain, Domain::kNuma));
  EXPECT_TRUE(absl::StrContains(plain_text, "2 NUMA nodes, ")) << plain_text;
  EXPECT_FALSE(absl::StrContains(plain_text, "memory-only")) << plain_text;
  EXPECT_FALSE(absl::StrContains(plain_text, "memory only")) << plain_text;
}

TEST(XmlTopologyTest, FourNodeGuestCappedAtTwoWorkersTakesBothPackages) {
  // Nodes 0 and 1 on package 0, 2 and 3 on package 1, one core each.
  const Topology topology = Synthetic(QemuXml("four_nodes"));
  ASSERT_EQ(topology.numa_nodes.size(), 4u);
  EXPECT_EQ(topology.num_packages, 2);
  const Plan plan = MustPlan(topology, Domain::kNuma, false, /*max_workers=*/2);
  ASSERT_EQ(plan.workers.size(), 2u);
  EXPECT_EQ(plan.workers[0].numa_node, 0);
  EXPECT_EQ(plan.workers[1].numa_node, 2);
}

}  // namespace
}  // namespace numaserve::affinity
