// The front end's cpus in the plan (PlacementOptions::frontend) and the
// per-worker peak (WorkerPeak), over synthetic topologies, Linux-numbered SMT
// ones among them.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "affinity/placement.h"
#include "affinity/topology.h"
#include "gtest/gtest.h"

namespace numaserve::affinity {
namespace {

using Shares = std::vector<std::vector<int>>;

Topology Synthetic(const std::string& description) {
  TopologyOptions options;
  options.description = description;
  absl::StatusOr<Topology> topology = DiscoverTopology(options);
  EXPECT_TRUE(topology.ok()) << description << ": " << topology.status();
  return topology.ok() ? *topology : Topology{};
}

absl::StatusOr<Plan> PlanWith(const Topology& topology, const std::string& frontend,
                              bool use_smt = false, Domain domain = Domain::kNuma) {
  absl::StatusOr<FrontendCpus> parsed = ParseFrontendCpus(frontend);
  if (!parsed.ok()) return parsed.status();
  PlacementOptions options;
  options.domain = domain;
  options.use_smt = use_smt;
  options.frontend = *parsed;
  return MakePlan(topology, options);
}

// Linux numbers a core's SMT siblings apart: cpus i and i+4 (one package),
// or i and i+8 (two packages of 4 cores) are one core's.
constexpr char kLinuxSmt[] = "pack:1 core:4 pu:2(indexes=0,4,1,5,2,6,3,7)";
constexpr char kTwoPackagesLinuxSmt[] =
    "pack:2 numa:1 core:4 pu:2(indexes=0,8,1,9,2,10,3,11,4,12,5,13,6,14,7,15)";

TEST(FrontendCpusTest, ParsesNoneAutoAndListsAndNamesTheFlagOtherwise) {
  auto none = ParseFrontendCpus("none");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->mode, FrontendCpus::Mode::kNone);
  auto automatic = ParseFrontendCpus(" AUTO ");
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ(automatic->mode, FrontendCpus::Mode::kAuto);
  auto list = ParseFrontendCpus("3,0-1,1");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->mode, FrontendCpus::Mode::kList);
  EXPECT_EQ(list->cpus, (std::vector<int>{0, 1, 3}));
  for (const char* bad : {"", "all", "0-", "-1", "1-0", "0;1", "0,,1", "99999999"}) {
    auto s = ParseFrontendCpus(bad);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_TRUE(absl::StrContains(s.status().message(), "--frontend-cpus")) << s.status();
  }
}

TEST(FrontendCpusTest, NoneLeavesThePlanAsItWas) {
  const Topology topology = Synthetic("package:2 numa:1 core:8 pu:2");
  auto plan = PlanWith(topology, "none");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->frontend_cpus.empty());
  ASSERT_EQ(plan->workers.size(), 2u);
  for (const WorkerPlacement& worker : plan->workers) {
    EXPECT_EQ(worker.cores.size(), 8u);
    EXPECT_TRUE(worker.supervisor_cpus.empty());  // floats, as the front end does
  }
  EXPECT_FALSE(absl::StrContains(FormatReport(topology, *plan), "front end"));
}

TEST(FrontendCpusTest, AListTakesWholeCoresOutOfTheWorkersPlan) {
  const Topology topology = Synthetic(kTwoPackagesLinuxSmt);
  // cpu 0 alone: its core (cpus 0 and 8) is the front end's whole, so no
  // worker thread shares its FMA units.
  auto plan = PlanWith(topology, "0", /*use_smt=*/true);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->frontend_cpus, (std::vector<int>{0}));
  ASSERT_EQ(plan->workers.size(), 2u);
  const WorkerPlacement& first = plan->workers[0];
  EXPECT_EQ(first.cores, (Shares{{1, 9}, {2, 10}, {3, 11}}));
  EXPECT_EQ(first.cpus, (std::vector<int>{1, 9, 2, 10, 3, 11}));
  EXPECT_EQ(first.num_threads, 6);
  EXPECT_EQ(plan->workers[1].cores.size(), 4u);  // the other package keeps all
  // Each supervisor thread on its worker's node: the front end's cpus
  // there, else (node 1 has none) the worker's cores.
  EXPECT_EQ(first.supervisor_cpus, (std::vector<int>{0}));
  EXPECT_EQ(plan->workers[1].supervisor_cpus, (std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15}));
  const std::string text = FormatReport(topology, *plan);
  EXPECT_TRUE(absl::StrContains(text, "front end: cpus 0 (no worker's)\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "  supervisor thread: cpus 0\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "  supervisor thread: cpus 4-7,12-15\n")) << text;
  const std::string json = FormatReportJson(topology, *plan);
  EXPECT_TRUE(absl::StrContains(json, "\"frontend_cpus\":[0]")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"supervisor_cpus\":[0]")) << json;
}

TEST(FrontendCpusTest, AutoTakesOneCoreOfEachPackage) {
  const Topology topology = Synthetic(kTwoPackagesLinuxSmt);
  auto plan = PlanWith(topology, "auto", /*use_smt=*/true);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The first core of each package, with its SMT sibling.
  EXPECT_EQ(plan->frontend_cpus, (std::vector<int>{0, 4, 8, 12}));
  ASSERT_EQ(plan->workers.size(), 2u);
  EXPECT_EQ(plan->workers[0].cores, (Shares{{1, 9}, {2, 10}, {3, 11}}));
  EXPECT_EQ(plan->workers[1].cores, (Shares{{5, 13}, {6, 14}, {7, 15}}));
}

TEST(FrontendCpusTest, AutoTakesNothingOnTinyMachinesNorAWorkersLastCore) {
  // Two cores (the development machine): the workers need both.
  auto small = PlanWith(Synthetic("package:1 numa:1 core:2 pu:1"), "auto");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_TRUE(small->frontend_cpus.empty());
  EXPECT_EQ(small->workers[0].cpus, (std::vector<int>{0, 1}));
  // Four single-core nodes on one package (NPS4-like): a core taken would
  // take a worker with it.
  auto nps4 = PlanWith(Synthetic("package:1 numa:4 core:1 pu:1"), "auto");
  ASSERT_TRUE(nps4.ok()) << nps4.status();
  EXPECT_TRUE(nps4->frontend_cpus.empty());
  EXPECT_EQ(nps4->workers.size(), 4u);
  // One worker per core: the same.
  auto per_core = PlanWith(Synthetic("package:1 core:8 pu:1"), "auto", false, Domain::kCore);
  ASSERT_TRUE(per_core.ok()) << per_core.status();
  EXPECT_TRUE(per_core->frontend_cpus.empty());
  // Two nodes of two cores on one package: the first node gives one.
  auto nps2 = PlanWith(Synthetic("package:1 numa:2 core:2 pu:1"), "auto");
  ASSERT_TRUE(nps2.ok()) << nps2.status();
  EXPECT_EQ(nps2->frontend_cpus, (std::vector<int>{0}));
  EXPECT_EQ(nps2->workers.size(), 2u);
}

TEST(FrontendCpusTest, CpusOutsideTheTopologyOrLeavingNoWorkerAreRefused) {
  const Topology topology = Synthetic("package:1 numa:1 core:2 pu:1");
  auto outside = PlanWith(topology, "5");
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(outside.status().message(),
                                "--frontend-cpus: cpu 5 is not one of the cpus this server may "
                                "use (0-1"))
      << outside.status();
  auto everything = PlanWith(topology, "0-1");
  EXPECT_EQ(everything.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(everything.status().message(),
                                "--frontend-cpus 0-1 leaves no core for a worker"))
      << everything.status();
  // One of the two cores: the worker keeps the other.
  auto one = PlanWith(topology, "0");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->workers[0].cpus, (std::vector<int>{1}));
  EXPECT_EQ(one->workers[0].supervisor_cpus, (std::vector<int>{0}));
  // Without SMT a worker's cores give one thread each; a supervisor thread
  // on a node without front-end cpus still gets all of its worker's cores'.
  auto smt_off = PlanWith(Synthetic(kTwoPackagesLinuxSmt), "0");
  ASSERT_TRUE(smt_off.ok()) << smt_off.status();
  EXPECT_EQ(smt_off->workers[1].cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(smt_off->workers[1].supervisor_cpus, (std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15}));
}

TEST(WorkerPeakTest, CountsPhysicalCoresNotSmtThreads) {
  const Topology topology = Synthetic(kLinuxSmt);
  auto smt = PlanWith(topology, "none", /*use_smt=*/true);
  ASSERT_TRUE(smt.ok()) << smt.status();
  const WorkerPlacement& worker = smt->workers[0];
  EXPECT_EQ(worker.num_threads, 8);  // a thread per hardware thread
  EXPECT_EQ(PhysicalCores(worker), 4);
  EXPECT_DOUBLE_EQ(WorkerPeak(worker, 10.0), 40.0);  // was 10 x 8 threads = 80
  auto plain = PlanWith(topology, "none");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_DOUBLE_EQ(WorkerPeak(plain->workers[0], 10.0), 40.0);
  // A hand-made placement without cores: one per cpu.
  WorkerPlacement listed;
  listed.cpus = {0, 1, 2};
  listed.num_threads = 3;
  EXPECT_DOUBLE_EQ(WorkerPeak(listed, 2.5), 7.5);
}

}  // namespace
}  // namespace numaserve::affinity
