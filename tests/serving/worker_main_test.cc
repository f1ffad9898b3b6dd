// The worker's side of a batch (RunBatchOn): it runs the engine only on
// slices of the shared arena that hold exactly what the model reads and
// writes, so a slot sized wrongly by the server fails that batch, naming the
// tensor, and never lets the engine write into the bytes after it (another
// request's); the reply carries the error's code. Then the real worker
// process (`numaserve worker`, spawned by WorkerSupervisor): instances
// per_core and auto, where its memory lies, --test-batch-compute-us.
#include "serving/workers/worker_main.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "affinity/pinning.h"
#include "affinity/placement.h"
#include "affinity/topology.h"
#include "serving/repository/model_config.h"
#include "serving/workers/worker_supervisor.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::serving {
namespace {

using engine::testing::kUnknownDim;
using engine::testing::OnnxModelBuilder;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr int kInternal = static_cast<int>(absl::StatusCode::kInternal);

constexpr char kCanary = '\x5a';

class WorkerSliceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto arena = SharedArena::Create("worker_slice_test", kArenaBytes);
    ASSERT_TRUE(arena.ok()) << arena.status();
    arena_ = *std::move(arena);
    std::memset(arena_->data(), kCanary, kArenaBytes);
  }

  // x [n,64] -> Reshape [1,-1] -> y [1,64n]: not [batch, ...].
  std::unique_ptr<engine::CompiledModel> OneRowModel() {
    OnnxModelBuilder b;
    b.Input("x", {-1, 64}).Output("y", {1, kUnknownDim});
    b.Int64Initializer("one_row", {1, -1});
    b.Node("Reshape", {"x", "one_row"}, {"y"}, "flatten_all");
    auto model = engine::CompiledModel::Load(b.Save("worker_one_row"), {});
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? *std::move(model) : nullptr;
  }

  // Input at offset 0 (rows x 64 floats), the output at `out_offset`.
  worker::RunBatch Batch(int64_t rows, uint64_t input_bytes, uint64_t out_offset,
                         uint64_t output_bytes) {
    worker::RunBatch run;
    run.set_key("one_row:1");
    run.set_batch(rows);
    auto* in = run.add_inputs();
    in->set_offset(0);
    in->set_bytes(input_bytes);
    auto* out = run.add_outputs();
    out->set_offset(out_offset);
    out->set_bytes(output_bytes);
    float* x = reinterpret_cast<float*>(arena_->data());
    for (uint64_t i = 0; i < input_bytes / sizeof(float); ++i) x[i] = static_cast<float>(i);
    return run;
  }

  // Bytes of the arena from `offset` on that still hold the canary.
  bool Untouched(uint64_t offset, uint64_t bytes) const {
    for (uint64_t i = offset; i < offset + bytes; ++i) {
      if (arena_->data()[i] != kCanary) return false;
    }
    return true;
  }

  static constexpr size_t kArenaBytes = 1 << 16;
  std::unique_ptr<SharedArena> arena_;
};

TEST_F(WorkerSliceTest, OutputSlotTooSmallFailsTheBatchWithoutWritingPastIt) {
  auto model = OneRowModel();
  ASSERT_NE(model, nullptr);
  // 5 rows as a [batch, static...] model would have been sized: y [1,1]
  // gets 4 bytes, the engine writes [1,320] (1280 bytes). The next request's
  // slot starts right after.
  const uint64_t out = 4096;
  worker::Reply reply;
  RunBatchOn(*model, *arena_, Batch(5, 5 * 64 * 4, out, 4), &reply);
  EXPECT_FALSE(reply.ok());
  EXPECT_THAT(reply.error(), HasSubstr("output 'y' at 5 rows is [1,320] of FP32 (1280 bytes)"));
  EXPECT_THAT(reply.error(), HasSubstr("holds 4 bytes"));
  EXPECT_TRUE(Untouched(out, 1280)) << "the engine wrote into the output slot or past it";
}

TEST_F(WorkerSliceTest, InputSlotOfTheWrongSizeFailsTheBatch) {
  auto model = OneRowModel();
  ASSERT_NE(model, nullptr);
  worker::Reply reply;
  // 5 rows but one row's bytes: the engine would read 4 rows of whatever follows.
  RunBatchOn(*model, *arena_, Batch(5, 64 * 4, 4096, 1280), &reply);
  EXPECT_FALSE(reply.ok());
  EXPECT_THAT(reply.error(), HasSubstr("input 'x' at 5 rows is [5,64]"));
  EXPECT_TRUE(Untouched(4096, 1280));
}

TEST_F(WorkerSliceTest, SlotsOfTheRightSizeRun) {
  auto model = OneRowModel();
  ASSERT_NE(model, nullptr);
  worker::Reply reply;
  RunBatchOn(*model, *arena_, Batch(5, 5 * 64 * 4, 4096, 1280), &reply);
  ASSERT_TRUE(reply.ok()) << reply.error();
  const float* y = reinterpret_cast<const float*>(arena_->data() + 4096);
  for (int i = 0; i < 320; ++i) ASSERT_EQ(y[i], static_cast<float>(i)) << i;
  EXPECT_TRUE(Untouched(4096 + 1280, 256)) << "written past the output slot";
}

TEST_F(WorkerSliceTest, SliceOutsideTheArenaFailsTheBatch) {
  auto model = OneRowModel();
  ASSERT_NE(model, nullptr);
  worker::Reply reply;
  RunBatchOn(*model, *arena_, Batch(5, 5 * 64 * 4, kArenaBytes - 100, 1280), &reply);
  EXPECT_FALSE(reply.ok());
  EXPECT_THAT(reply.error(), HasSubstr("outside the arena"));
  EXPECT_EQ(reply.code(), kInternal);
}

TEST_F(WorkerSliceTest, BuffersThatDoNotFitAreTheServersErrorInternal) {
  auto model = OneRowModel();
  ASSERT_NE(model, nullptr);
  worker::Reply reply;
  RunBatchOn(*model, *arena_, Batch(5, 64 * 4, 4096, 1280), &reply);
  EXPECT_FALSE(reply.ok());
  EXPECT_EQ(reply.code(), kInternal);
}

// A model whose run fails the way the engine's do, with a code of its own.
class FailingModel : public engine::CompiledModel {
 public:
  FailingModel() {
    info_.path = "failing.onnx";
    info_.batched = true;
    info_.inputs = {{"x", engine::DataType::kFloat32, {-1, 4}}};
    info_.outputs = {{"y", engine::DataType::kFloat32, {-1, 4}}};
  }
  const engine::ModelInfo& info() const override { return info_; }
  std::vector<std::vector<int64_t>> OutputShapes(int64_t batch) const override {
    return {{batch, 4}};
  }
  absl::Status Run(int64_t, const std::vector<const void*>&, const std::vector<void*>&) override {
    return absl::InvalidArgumentError("input 'x' holds a token id out of range");
  }
  absl::Status CheckBufferSizes(int64_t, const std::vector<size_t>&,
                                const std::vector<size_t>&) const override {
    return absl::OkStatus();
  }

 private:
  engine::ModelInfo info_;
};

TEST_F(WorkerSliceTest, AFailedRunCarriesTheEnginesCode) {
  FailingModel model;
  worker::Reply reply;
  RunBatchOn(model, *arena_, Batch(1, 16, 4096, 16), &reply);
  EXPECT_FALSE(reply.ok());
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(reply.error(), HasSubstr("token id out of range"));
}

TEST_F(WorkerSliceTest, AMinimumComputeTimeSleepsUntilItHasPassed) {
  auto model = OneRowModel();
  ASSERT_NE(model, nullptr);
  worker::Reply reply;
  const auto start = std::chrono::steady_clock::now();
  RunBatchOn(*model, *arena_, Batch(5, 5 * 64 * 4, 4096, 1280), &reply, 20ms);
  ASSERT_TRUE(reply.ok()) << reply.error();
  EXPECT_GE(reply.compute_ns(), 20'000'000);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 20ms);
  // Without it, the tiny model takes far less.
  worker::Reply plain;
  RunBatchOn(*model, *arena_, Batch(5, 5 * 64 * 4, 4096, 1280), &plain);
  ASSERT_TRUE(plain.ok()) << plain.error();
  EXPECT_LT(plain.compute_ns(), 20'000'000);
}

TEST_F(WorkerSliceTest, AProfiledBatchAnswersItsStepsAndTheNextRunIsNotTimed) {
  // x [n,64] -> MatMul W [64,8] -> Relu -> y [n,8]: one matmul step.
  OnnxModelBuilder b;
  b.Input("x", {-1, 64}).Output("y", {-1, 8});
  b.Initializer("w", kernels::Tensor({64, 8}, std::vector<float>(64 * 8, 0.125f)));
  b.Node("MatMul", {"x", "w"}, {"xw"});
  b.Node("Relu", {"xw"}, {"y"});
  auto model = engine::CompiledModel::Load(b.Save("worker_profiled"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  worker::RunBatch run = Batch(5, 5 * 64 * 4, 4096, 5 * 8 * 4);
  run.set_profile(true);
  worker::Reply reply;
  RunBatchOn(**model, *arena_, run, &reply);
  ASSERT_TRUE(reply.ok()) << reply.error();
  const std::string& json = reply.profile_json();
  EXPECT_THAT(json, ::testing::StartsWith("{\"batch\": 5, \"compute_ms\": "));
  EXPECT_THAT(json, HasSubstr("\"runs\": 1, \"step_ms\": "));
  EXPECT_THAT(json, HasSubstr("\"rows\": [{\"index\": 0, \"kind\": \"matmul\""));
  EXPECT_THAT(json, ::testing::EndsWith("]}"));
  // Profiling was for that run only: the next one is not timed.
  worker::Reply plain;
  RunBatchOn(**model, *arena_, Batch(5, 5 * 64 * 4, 4096, 5 * 8 * 4), &plain);
  ASSERT_TRUE(plain.ok()) << plain.error();
  EXPECT_EQ(plain.profile_json(), "");
  const std::vector<engine::StepProfile> steps = (*model)->Profile();
  ASSERT_FALSE(steps.empty());
  for (const engine::StepProfile& step : steps) EXPECT_EQ(step.calls, 1) << step.kind;
}

TEST(BatchProfileJson, WrapsTheStepProfileWithTheBatch) {
  EXPECT_EQ(BatchProfileJson(8, 2500000, "{\"runs\": 1, \"rows\": []}"),
            "{\"batch\": 8, \"compute_ms\": 2.5, \"runs\": 1, \"rows\": []}");
  EXPECT_EQ(BatchProfileJson(1, 1000000, "{}"), "{\"batch\": 1, \"compute_ms\": 1}");
}

TEST(NumaMaps, PagesAreSummedPerNode) {
  EXPECT_EQ(SumNumaMapsPages("7f0000000000 bind:1 anon=10 dirty=10 N1=7 N0=3 kernelpagesize_kB=4\n"
                             "7f0000100000 default anon=512 N10=512 kernelpagesize_kB=2048\n"
                             "7f0000200000 default\n"),
            "0=3 1=7 10=512");
  EXPECT_EQ(SumNumaMapsPages(""), "");
  EXPECT_EQ(SumNumaMapsPages("7f00 default Nx=3 N=4 N2=y\n"), "");
}

TEST(NumaMaps, OnlyTheProcessesOwnMemoryCounts) {
  // A worker on node 1 of a QEMU guest (tests/numa): its heap, the
  // copied-on-write data of a library and its arena (a memfd) are its own;
  // the page cache of the libraries it maps lies where the files were first
  // read (node 0 here) and is left out, or every worker but node 0's would
  // look as if it had lost its binding.
  EXPECT_EQ(SumNumaMapsPages(
                "55c6300aa000 prefer (many):1 heap anon=5058 dirty=5058 N1=5058 "
                "kernelpagesize_kB=4\n"
                "7faafbf5d000 prefer (many):1 file=/usr/lib/x86_64-linux-gnu/libdnnl.so.3.7 "
                "anon=163 dirty=163 N0=1 N1=163 kernelpagesize_kB=4\n"
                "7faafb000000 prefer (many):1 file=/usr/lib/x86_64-linux-gnu/libdnnl.so.3.7 "
                "mapped=4100 mapmax=3 N0=4100 kernelpagesize_kB=4\n"
                "7f050ee2c000 prefer (many):1 file=/memfd:numaserve-worker-1\\040(deleted) "
                "dirty=300 N1=300 kernelpagesize_kB=4\n"
                "7f050ee00000 prefer (many):1 file=/dev/shm/x dirty=2 N1=2 kernelpagesize_kB=4\n"
                "7fff00000000 prefer (many):1 stack anon=33 dirty=33 N1=33 kernelpagesize_kB=4\n"),
            "0=1 1=5556");
}

// ---- a worker's binding: cpus and memory apart, and the first-touch fallback ----

// Runs `body` in a forked child (its bindings stay there); its exit code.
template <typename Body>
int InChild(Body body) {
  const pid_t child = fork();
  if (child == 0) _exit(body());
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// This process's first cpu and its NUMA node.
std::pair<int, int> FirstCpuAndNode() {
  absl::StatusOr<affinity::Topology> topology = affinity::DiscoverTopology({});
  if (!topology.ok() || topology->cores.empty()) return {-1, -1};
  return {topology->cores.front().pus.front(), topology->cores.front().numa_node};
}

TEST(WorkerBindingTest, StrictHoldsAndSaysSo) {
  const auto [cpu, node] = FirstCpuAndNode();
  if (node < 0) GTEST_SKIP() << "no NUMA node on this machine";
  const int code = InChild([cpu, node] {
    auto arena = SharedArena::Create("bind-test", 1 << 20);
    if (!arena.ok()) return 2;
    const WorkerBinding b =
        BindWorker(std::vector<int>{cpu}, node, affinity::MemoryPolicy::kStrict, **arena);
    if (!b.cpus_bound || b.memory_policy != "strict" || !b.memory_error.empty()) return 3;
    const std::string text = DescribeWorkerBinding(b, node);
    const std::string n = std::to_string(node);
    if (!absl::StrContains(text, "mem strict node " + n) ||
        !absl::StrContains(text, "cpu binding held; memory strict on node " + n)) {
      fprintf(stderr, "%s\n", text.c_str());
      return 4;
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "2: arena, 3: binding, 4: description";
}

// Where the kernel refuses the policy (a container's seccomp filter,
// simulated by NUMASERVE_TEST_REFUSE_MEMBIND), the worker bound to its
// cpus touches its arena's pages itself, so they lie on its node, and says
// that first touch placed them and why.
TEST(WorkerBindingTest, ARefusedPolicyFallsBackOnFirstTouchFromTheWorkersCpus) {
  const auto [cpu, node] = FirstCpuAndNode();
  if (node < 0) GTEST_SKIP() << "no NUMA node on this machine";
  const int code = InChild([cpu, node] {
    setenv("NUMASERVE_TEST_REFUSE_MEMBIND", "1", 1);
    constexpr size_t kBytes = 1 << 20;
    auto arena = SharedArena::Create("bind-test", kBytes);
    if (!arena.ok()) return 2;
    const WorkerBinding b =
        BindWorker(std::vector<int>{cpu}, node, affinity::MemoryPolicy::kStrict, **arena);
    if (!b.cpus_bound || b.memory_policy != "first-touch" || b.prefault.empty() ||
        !absl::StrContains(b.memory_error, "NUMASERVE_TEST_REFUSE_MEMBIND")) {
      fprintf(stderr, "%d %s %s %s\n", b.cpus_bound, b.memory_policy.c_str(), b.prefault.c_str(),
              b.memory_error.c_str());
      return 3;
    }
    // Every page is there already, on the node.
    const long page = sysconf(_SC_PAGESIZE);
    std::vector<unsigned char> resident(kBytes / page);
    if (mincore((*arena)->data(), kBytes, resident.data()) != 0) return 4;
    for (unsigned char r : resident) {
      if ((r & 1) == 0) return 5;
    }
    if (affinity::NodeOfAddress((*arena)->data()) != node ||
        affinity::NodeOfAddress((*arena)->data() + kBytes - 1) != node) {
      return 6;
    }
    const std::string text = DescribeWorkerBinding(b, node);
    if (!absl::StrContains(text, "cpu binding held; memory first-touch on node " +
                                     std::to_string(node) + " (the policy was refused: ") ||
        !absl::StrContains(text, "pre-faulted from the worker's cpus")) {
      fprintf(stderr, "%s\n", text.c_str());
      return 7;
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "2: arena, 3: binding, 4: mincore, 5: a page not resident, 6: a page "
                        "off the node, 7: description";
}

TEST(WorkerBindingTest, NoNodePlannedBindsNoMemory) {
  const int cpu = FirstCpuAndNode().first;
  if (cpu < 0) GTEST_SKIP() << "no cpu found";
  const int code = InChild([cpu] {
    auto arena = SharedArena::Create("bind-test", 1 << 16);
    if (!arena.ok()) return 2;
    const WorkerBinding b =
        BindWorker(std::vector<int>{cpu}, -1, affinity::MemoryPolicy::kStrict, **arena);
    if (!b.cpus_bound || b.memory_policy != "none" || !b.memory_error.empty()) return 3;
    if (!absl::StrContains(DescribeWorkerBinding(b, -1), "memory not bound (no NUMA node"))
      return 4;
    // A cpu list that did not parse: cpus not bound, the reason kept.
    const WorkerBinding unparsed = BindWorker(absl::InvalidArgumentError("malformed cpu list"), -1,
                                              affinity::MemoryPolicy::kPrefer, **arena);
    if (unparsed.cpus_bound || unparsed.cpu_error != "malformed cpu list") return 5;
    return 0;
  });
  EXPECT_EQ(code, 0) << "2: arena, 3: binding, 4: description, 5: unparsed cpus";
}

// The real worker process, spawned by WorkerSupervisor as `numaserve serve`
// does, on (up to) two of this process's cpus.
class RealWorkerTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (supervisor_) supervisor_->Stop();
  }

  // x [n,16] -> MatMul W [16,8] -> Relu -> y [n,8].
  static std::string TinyModel() {
    OnnxModelBuilder b;
    b.Input("x", {-1, 16}).Output("y", {-1, 8});
    std::vector<float> w(16 * 8);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 7) * 0.125f - 0.25f;
    b.Initializer("w", kernels::Tensor({16, 8}, w));
    b.Node("MatMul", {"x", "w"}, {"xw"});
    b.Node("Relu", {"xw"}, {"y"});
    return b.Save("real_worker_tiny");
  }

  static std::vector<int> OwnCpus() {
    std::vector<int> cpus;
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return cpus;
    for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
      if (CPU_ISSET(c, &mask)) cpus.push_back(c);
    }
    return cpus;
  }

  // One worker on OwnCpus(), each cpu a core of its own.
  static affinity::WorkerPlacement OwnPlacement() {
    affinity::WorkerPlacement placement;
    placement.index = 0;
    placement.domain = "test";
    placement.cpus = OwnCpus();
    placement.num_threads = static_cast<int>(placement.cpus.size());
    placement.env = affinity::OpenMpEnvironment(placement.cpus, placement.num_threads);
    return placement;
  }

  // Starts one worker on OwnCpus() with the tiny model at `instances`.
  void Start(int instances, int64_t test_batch_compute_us = 0) {
    Start(OwnPlacement(), instances, test_batch_compute_us);
  }

  // The same on `placement`.
  void Start(const affinity::WorkerPlacement& placement, int instances,
             int64_t test_batch_compute_us = 0) {
    WorkerSupervisor::Options options;
    options.executable = NUMASERVE_BINARY;
    options.arena_bytes = size_t{1} << 20;
    options.restart_delay = 10ms;
    options.test_batch_compute_us = test_batch_compute_us;
    affinity::Plan plan;
    plan.workers.push_back(placement);
    WorkerSupervisor::ModelToLoad model;
    model.key = "tiny:1";
    model.name = "tiny";
    model.version = "1";
    model.path = TinyModel();
    model.gemm_backend = "onednn";
    model.instances = instances;
    auto s = WorkerSupervisor::Create(options, plan, {model}, nullptr, [] {});
    ASSERT_TRUE(s.ok()) << s.status();
    supervisor_ = *std::move(s);
    supervisor_->Start(60s);
    ASSERT_TRUE(supervisor_->HasModel(0, "tiny:1")) << supervisor_->LoadError("tiny:1");
  }

  // Runs `rows` rows on the worker (inputs at offset 0, outputs after them,
  // `output_bytes` of room); the reply.
  worker::Reply Run(int64_t rows, uint64_t output_bytes) {
    SharedArena& arena = supervisor_->arena(0);
    float* x = reinterpret_cast<float*>(arena.data());
    for (int64_t i = 0; i < rows * 16; ++i) x[i] = 1.0f;
    worker::Command command;
    auto* run = command.mutable_run();
    run->set_key("tiny:1");
    run->set_batch(rows);
    auto* in = run->add_inputs();
    in->set_offset(0);
    in->set_bytes(static_cast<uint64_t>(rows) * 16 * sizeof(float));
    auto* out = run->add_outputs();
    out->set_offset(4096);
    out->set_bytes(output_bytes);
    std::mutex mu;
    std::condition_variable cv;
    bool answered = false;
    worker::Reply reply;
    const bool sent = supervisor_->Send(0, command, [&](const worker::Reply& r, bool lost) {
      std::lock_guard<std::mutex> lock(mu);
      reply = r;
      if (lost) reply.set_error("lost: " + r.error());
      answered = true;
      cv.notify_all();
    });
    EXPECT_TRUE(sent);
    if (!sent) return reply;
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, 30s, [&] { return answered; }));
    return reply;
  }

  std::unique_ptr<WorkerSupervisor> supervisor_;
};

TEST_F(RealWorkerTest, OneInstanceRunsAndSaysWhereItsMemoryLies) {
  Start(1);
  EXPECT_EQ(supervisor_->Instances(0, "tiny:1"), 1);
  EXPECT_EQ(supervisor_->InstancesReport(0, "tiny:1"), "");
  if (std::ifstream("/proc/self/numa_maps")) {
    EXPECT_THAT(supervisor_->MemoryNodes(0),
                ::testing::MatchesRegex("[0-9]+=[0-9]+( [0-9]+=[0-9]+)*"));
  }
  worker::Reply reply = Run(3, 3 * 8 * sizeof(float));
  ASSERT_TRUE(reply.ok()) << reply.error();
  EXPECT_EQ(reply.instance(), 0);
  // The worker's own check of the server's buffers: INTERNAL.
  reply = Run(3, 8 * sizeof(float));
  EXPECT_FALSE(reply.ok());
  EXPECT_EQ(reply.code(), kInternal) << reply.error();
}

TEST_F(RealWorkerTest, PerCoreRunsOneInstancePerCore) {
  if (OwnCpus().size() < 2) GTEST_SKIP() << "needs 2 cpus";
  Start(kInstancesPerCore);
  EXPECT_EQ(supervisor_->Instances(0, "tiny:1"), 2);
  EXPECT_EQ(supervisor_->InstancesReport(0, "tiny:1"), "");
  worker::Reply reply = Run(2, 2 * 8 * sizeof(float));
  ASSERT_TRUE(reply.ok()) << reply.error();
  EXPECT_GE(reply.instance(), 0);
  EXPECT_LT(reply.instance(), 2);
}

TEST_F(RealWorkerTest, PerCoreCountsCoresNotTheirSmtThreads) {
  const std::vector<int> cpus = OwnCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs 2 cpus";
  // This machine's two cpus as the two hardware threads of one core, the
  // worker planned with --use-smt.
  affinity::TopologyOptions topology_options;
  topology_options.description =
      absl::StrCat("pack:1 core:1 pu:2(indexes=", cpus[0], ",", cpus[1], ")");
  auto topology = affinity::DiscoverTopology(topology_options);
  ASSERT_TRUE(topology.ok()) << topology.status();
  affinity::PlacementOptions options;
  options.use_smt = true;
  auto plan = affinity::MakePlan(*topology, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->workers.size(), 1u);
  Start(plan->workers[0], kInstancesPerCore);
  EXPECT_EQ(supervisor_->Instances(0, "tiny:1"), 1) << "one core, one copy (of 2 threads)";
  worker::Reply reply = Run(2, 2 * 8 * sizeof(float));
  ASSERT_TRUE(reply.ok()) << reply.error();
}

// The server passes --cores; one that does not parse stops the worker at
// once, naming the flag and the fault.
TEST(WorkerFlagsTest, AMalformedCoreListIsRefusedNamingTheFault) {
  for (const auto& [cores, fault] :
       std::vector<std::pair<std::string, std::string>>{{"0;0", "cpu 0 is in two cores"},
                                                        {"0;;1", "at core 1"},
                                                        {"0;x", "malformed cpu list 'x'"}}) {
    const std::string command = absl::StrCat(
        NUMASERVE_BINARY, " worker --index 0 --cpus 0 --cores '", cores, "' 2>&1 </dev/null");
    FILE* pipe = popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string output;
    char buffer[512];
    while (fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
    const int status = pclose(pipe);
    ASSERT_TRUE(WIFEXITED(status)) << output;
    EXPECT_EQ(WEXITSTATUS(status), 2) << output;
    EXPECT_THAT(output, HasSubstr("--cores: ")) << cores;
    EXPECT_THAT(output, HasSubstr(fault)) << cores;
  }
}

TEST_F(RealWorkerTest, AutoMeasuresAndPicksBetweenOneAndTheCores) {
  Start(kInstancesAuto);
  const int cores = static_cast<int>(OwnCpus().size());
  const int n = supervisor_->Instances(0, "tiny:1");
  EXPECT_GE(n, 1);
  EXPECT_LE(n, cores);
  const std::string report = supervisor_->InstancesReport(0, "tiny:1");
  EXPECT_THAT(report, HasSubstr("rows/s"));
  EXPECT_THAT(report, ::testing::EndsWith(absl::StrCat(" -> ", n)));
  EXPECT_THAT(report, HasSubstr(absl::StrCat("1x", cores, cores == 1 ? " thread " : " threads ")));
  worker::Reply reply = Run(2, 2 * 8 * sizeof(float));
  ASSERT_TRUE(reply.ok()) << reply.error();
}

TEST_F(RealWorkerTest, TestBatchComputeTimeHoldsEveryBatch) {
  for (int instances : {1, kInstancesPerCore}) {
    Start(instances, /*test_batch_compute_us=*/20000);
    worker::Reply reply = Run(2, 2 * 8 * sizeof(float));
    ASSERT_TRUE(reply.ok()) << reply.error();
    EXPECT_GE(reply.compute_ns(), 20'000'000) << FormatInstances(instances);
    supervisor_->Stop();
    supervisor_.reset();
  }
}

}  // namespace
}  // namespace numaserve::serving
