// serve --input-copy: which cpus each worker's copier thread gets, and the
// thread itself (order, pinning, nothing dropped at stop).
#include "serving/workers/input_copier.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "affinity/pinning.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace numaserve::serving {
namespace {

using affinity::Plan;
using affinity::WorkerPlacement;

WorkerPlacement Worker(int node, std::vector<int> cpus, std::vector<int> supervisor = {}) {
  WorkerPlacement w;
  w.numa_node = node;
  w.cpus = std::move(cpus);
  w.supervisor_cpus = std::move(supervisor);
  return w;
}

// Two packages, a node each; cpu 0 is the front end's.
Plan TwoNodesWithFrontEnd() {
  Plan plan;
  plan.frontend_cpus = {0};
  plan.workers = {Worker(0, {1, 2, 3}, {0}), Worker(1, {4, 5, 6, 7}, {4, 5, 6, 7})};
  return plan;
}

TEST(InputCopyTest, ParsesItsThreeValuesAndRefusesOthersNamingTheFlag) {
  EXPECT_EQ(*ParseInputCopy("auto"), InputCopy::kAuto);
  EXPECT_EQ(*ParseInputCopy("caller"), InputCopy::kCaller);
  EXPECT_EQ(*ParseInputCopy("node"), InputCopy::kNode);
  for (const char* bad : {"", "Node", "nodes", "caller "}) {
    auto parsed = ParseInputCopy(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().message(),
              absl::StrCat("--input-copy: '", bad, "' is not one of auto, caller, node"));
  }
}

TEST(InputCopyTest, AutoCopiesOnTheNodeOnlyWithFrontEndCpusAndSeveralNodes) {
  const Plan two = TwoNodesWithFrontEnd();
  EXPECT_EQ(InputCopyCpus(two, InputCopy::kAuto),
            (std::vector<std::vector<int>>{{0}, {4, 5, 6, 7}}));
  Plan floating = two;  // no front-end cpus: the front end floats anyway
  floating.frontend_cpus.clear();
  for (WorkerPlacement& w : floating.workers) w.supervisor_cpus.clear();
  EXPECT_EQ(InputCopyCpus(floating, InputCopy::kAuto), (std::vector<std::vector<int>>(2)));
  Plan one_node = two;  // every thread on the one node already writes locally
  one_node.workers[1].numa_node = 0;
  EXPECT_EQ(InputCopyCpus(one_node, InputCopy::kAuto), (std::vector<std::vector<int>>(2)));
}

TEST(InputCopyTest, NodeTakesTheSupervisorsCpusElseTheWorkersAndCallerNone) {
  Plan plan = TwoNodesWithFrontEnd();
  plan.workers[1].supervisor_cpus.clear();
  EXPECT_EQ(InputCopyCpus(plan, InputCopy::kNode),
            (std::vector<std::vector<int>>{{0}, {4, 5, 6, 7}}));
  EXPECT_EQ(InputCopyCpus(plan, InputCopy::kCaller), (std::vector<std::vector<int>>(2)));
  EXPECT_TRUE(InputCopyCpus(Plan(), InputCopy::kNode).empty());
}

std::string ThreadName() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

TEST(CopierThreadTest, RunsInOrderOnItsOwnNamedPinnedThread) {
  const std::vector<int> mine = affinity::CallingThreadCpus();
  ASSERT_FALSE(mine.empty());
  const std::vector<int> one = {mine.back()};
  CopierThread copier(3, one);
  std::vector<int> order;
  std::vector<int> cpus_seen;
  std::string name;
  std::thread::id id;
  for (int i = 0; i < 50; ++i) {
    copier.Post([&, i] {
      order.push_back(i);
      if (i == 0) {
        name = ThreadName();
        cpus_seen = affinity::CallingThreadCpus();
        id = std::this_thread::get_id();
      }
    });
  }
  copier.Stop();
  std::vector<int> expected(50);
  for (int i = 0; i < 50; ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
  EXPECT_EQ(name, "copier-3");
  EXPECT_EQ(cpus_seen, one);
  EXPECT_NE(id, std::this_thread::get_id());
}

TEST(CopierThreadTest, StopRunsWhatWasQueuedAndLaterWorkRunsOnTheCaller) {
  CopierThread copier(0, {});
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  copier.Post([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ++ran;
  });
  for (int i = 0; i < 20; ++i) copier.Post([&] { ++ran; });  // queued behind the first
  std::thread stopper([&] { copier.Stop(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  release = true;
  stopper.join();
  EXPECT_EQ(ran.load(), 21);  // nothing queued was dropped
  std::thread::id where;
  copier.Post([&] { where = std::this_thread::get_id(); });
  EXPECT_EQ(where, std::this_thread::get_id());
  copier.Stop();  // idempotent
}

}  // namespace
}  // namespace numaserve::serving
