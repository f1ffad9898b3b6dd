// WorkerSupervisor on real processes: tests/server/fake_worker.cc speaks
// the worker protocol and aborts on request, so restarts, the crash
// accounting that bounds crash loops, and what a spawned worker inherits
// (signal mask and dispositions) are tested on processes that really die.
#include "serving/workers/worker_supervisor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "serving/repository/model_config.h"

namespace numaserve::serving {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// Sets environment variables for the workers this test spawns (they copy
// the environment at spawn), unset again at the end of the test.
class ScopedEnv {
 public:
  void Set(const std::string& name, const std::string& value) {
    setenv(name.c_str(), value.c_str(), 1);
    names_.push_back(name);
  }
  ~ScopedEnv() {
    for (const auto& n : names_) unsetenv(n.c_str());
  }

 private:
  std::vector<std::string> names_;
};

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_ = ::testing::TempDir() + "/fake_worker_" + std::to_string(getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".log";
    std::remove(log_.c_str());
    env_.Set("FAKE_WORKER_LOG", log_);
  }
  void TearDown() override {
    if (supervisor_) supervisor_->Stop();
    std::remove(log_.c_str());
    for (const auto& path : released_) std::remove(path.c_str());
  }

  static WorkerSupervisor::ModelToLoad Model(const std::string& key) {
    WorkerSupervisor::ModelToLoad m;
    m.key = key;
    m.name = key.substr(0, key.find(':'));
    m.version = "1";
    m.path = "/nonexistent/" + key;
    return m;
  }

  // `adjust`, when given, changes the options and the worker's placement.
  void Create(std::vector<WorkerSupervisor::ModelToLoad> models,
              const std::function<void(WorkerSupervisor::Options*, affinity::WorkerPlacement*)>&
                  adjust = nullptr) {
    WorkerSupervisor::Options options;
    options.executable = FAKE_WORKER;
    options.arena_bytes = size_t{1} << 20;
    options.restart_delay = 10ms;
    options.max_model_crashes = 2;
    affinity::Plan plan;
    affinity::WorkerPlacement placement;
    placement.index = 0;
    placement.domain = "test";
    if (adjust) adjust(&options, &placement);
    plan.workers.push_back(placement);
    auto s =
        WorkerSupervisor::Create(options, plan, std::move(models), nullptr, [this] { ++changes_; });
    ASSERT_TRUE(s.ok()) << s.status();
    supervisor_ = *std::move(s);
  }

  // The latest line of the fake workers' log that starts with `word` and a
  // space ("args worker --index 0 ...").
  std::string Line(const std::string& word) const {
    std::ifstream in(log_);
    std::string found;
    for (std::string l; std::getline(in, l);) {
      if (l.rfind(word + " ", 0) == 0) found = l;
    }
    return found;
  }

  // The arguments the latest fake worker started with ("args worker ...").
  std::string Args() const { return Line("args"); }

  // Lines of the fake workers' log equal to `line`.
  int Count(const std::string& line) const {
    std::ifstream in(log_);
    int n = 0;
    for (std::string l; std::getline(in, l);) n += l == line;
    return n;
  }

  // Sends a batch of `rows` of `key` to worker 0; true when it succeeded,
  // false when the worker was lost (or not ready).
  bool Run(const std::string& key, int64_t rows) {
    worker::Command command;
    command.mutable_run()->set_key(key);
    command.mutable_run()->set_batch(rows);
    std::mutex mu;
    std::condition_variable cv;
    int answer = -1;
    if (!supervisor_->Send(0, command, [&](const worker::Reply& reply, bool lost) {
          std::lock_guard<std::mutex> lock(mu);
          answer = !lost && reply.ok();
          cv.notify_all();
        })) {
      return false;
    }
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, 10s, [&] { return answer >= 0; }));
    return answer == 1;
  }

  // Waits (10 s at most) until the fake workers' log has the line `line`.
  bool WaitForLine(const std::string& line) const {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (Count(line) > 0) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }

  // The first line of the fake workers' log that starts with `prefix`,
  // waited for (10 s at most); empty when none came.
  std::string WaitForLineStartingWith(const std::string& prefix) const {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(log_);
      for (std::string l; std::getline(in, l);) {
        if (l.rfind(prefix, 0) == 0) return l;
      }
      std::this_thread::sleep_for(5ms);
    }
    return "";
  }

  // Makes the workers started from now on hold their answer to the load of
  // a key until Release(key).
  void HoldLoads() { env_.Set("FAKE_WORKER_HOLD_LOADS", log_ + ".hold"); }
  void Release(const std::string& key) {
    const std::string path = log_ + ".hold." + key;
    std::ofstream(path).close();
    released_.push_back(path);
  }

  // SIGKILLs worker 0 (its replacement starts with the environment as it is
  // now); returns the pid killed.
  pid_t KillWorker() {
    const pid_t pid = supervisor_->Pid(0);
    EXPECT_GT(pid, 0);
    if (pid > 0) {
      EXPECT_EQ(kill(pid, SIGKILL), 0);
    }
    return pid;
  }

  bool WaitReady() {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (supervisor_->Ready(0)) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }

  std::string log_;
  std::vector<std::string> released_;  // files made by Release()
  ScopedEnv env_;
  base::FakeClock clock_;        // for tests that set Options::clock; outlives supervisor_
  std::atomic<int> changes_{0};  // calls of the supervisor's on_change
  std::unique_ptr<WorkerSupervisor> supervisor_;
};

TEST_F(SupervisorTest, OnChangeFollowsLoadsAndReadinessNotEachBatch) {
  // A batch's reply reaches the scheduler through its ReplyFn; pumping the
  // scheduler again after each one cost the front end its work twice.
  Create({Model("good:1")});
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  std::this_thread::sleep_for(100ms);
  const int ready = changes_.load();
  EXPECT_GE(ready, 1) << "the worker's readiness";
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Run("good:1", 1));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(changes_.load(), ready) << "after 20 batches";
  ASSERT_TRUE(supervisor_->LoadModel(Model("other:1"), 10s).ok());
  std::this_thread::sleep_for(100ms);
  EXPECT_GT(changes_.load(), ready) << "after a load";
}

TEST_F(SupervisorTest, AModelWhoseLoadCrashesTheWorkerIsSentTwiceThenMarkedFailed) {
  env_.Set("FAKE_WORKER_CRASH_LOAD", "bad");
  // The bad model is sent first: when it kills the worker the good one is
  // still queued behind it, and must not be blamed.
  Create({Model("bad:1"), Model("good:1")});
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  EXPECT_TRUE(supervisor_->ModelAvailable("good:1"));
  EXPECT_FALSE(supervisor_->ModelAvailable("bad:1"));
  EXPECT_THAT(supervisor_->LoadError("bad:1"),
              HasSubstr("crashed the worker 2 times while loading; not loaded again"));
  EXPECT_THAT(supervisor_->LoadError("bad:1"), HasSubstr("signal 6"));
  EXPECT_EQ(supervisor_->LoadError("good:1"), "");
  // Start() returned with the outcome known: the third worker serves.
  const pid_t pid = supervisor_->Pid(0);
  EXPECT_TRUE(Run("good:1", 1));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(supervisor_->Pid(0), pid) << "the worker restarted again";
  EXPECT_EQ(Count("load bad:1"), 2);
  EXPECT_EQ(Count("load good:1"), 1) << "only the third worker got as far as the good model";
}

TEST_F(SupervisorTest, LoadModelOfACrashingModelFailsAndIsNotResentForever) {
  env_.Set("FAKE_WORKER_CRASH_LOAD", "bad");
  Create({Model("good:1")});
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  absl::Status s = supervisor_->LoadModel(Model("bad:2"), 10s);
  EXPECT_FALSE(s.ok());
  // The worker comes back (resending bad:2 once more, which kills it
  // again), then serves the good model without it.
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(WaitReady());
  EXPECT_TRUE(supervisor_->ModelAvailable("good:1"));
  EXPECT_FALSE(supervisor_->ModelAvailable("bad:2"));
  EXPECT_THAT(supervisor_->LoadError("bad:2"), HasSubstr("crashed the worker 2 times"));
  std::this_thread::sleep_for(200ms);
  EXPECT_LE(Count("load bad:2"), 2);
  EXPECT_TRUE(Run("good:1", 1));
}

TEST_F(SupervisorTest, AModelWhoseFirstBatchCrashesTheWorkerIsMarkedFailedAfterTwo) {
  env_.Set("FAKE_WORKER_CRASH_RUN", "bad");
  Create({Model("bad:1"), Model("good:1")});
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  ASSERT_TRUE(supervisor_->ModelAvailable("bad:1"));
  EXPECT_FALSE(Run("bad:1", 1));
  ASSERT_TRUE(WaitReady());
  EXPECT_TRUE(supervisor_->ModelAvailable("bad:1")) << "one crash: loaded again";
  EXPECT_FALSE(Run("bad:1", 1));
  ASSERT_TRUE(WaitReady());
  EXPECT_FALSE(supervisor_->ModelAvailable("bad:1"));
  EXPECT_THAT(supervisor_->LoadError("bad:1"),
              HasSubstr("crashed the worker 2 times while running batches; not loaded again"));
  EXPECT_EQ(Count("load bad:1"), 2) << "the third worker does not load it";
  EXPECT_TRUE(Run("good:1", 1));
}

// A request that kills the worker (batches of 99 rows here; one that runs
// it out of memory in a real worker) is the model's to answer for even
// when the model has run batches before: the router retries the batch
// once, so each such request would otherwise kill a worker twice, and the
// same request sent again would go on killing workers, taking the batches
// of other models queued on them along. Before, crashes of a model that
// had run a batch were not charged (CrashesOfAModelThatHasRunAreNotChargedToIt).
TEST_F(SupervisorTest, CrashesOfAModelThatHasRunAreChargedToIt) {
  env_.Set("FAKE_WORKER_CRASH_BATCH", "99");
  Create({Model("victim:1"), Model("good:1")});
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  ASSERT_TRUE(Run("victim:1", 1));
  EXPECT_FALSE(Run("victim:1", 99));
  ASSERT_TRUE(WaitReady());
  EXPECT_TRUE(supervisor_->ModelAvailable("victim:1")) << "one crash: loaded again";
  EXPECT_EQ(supervisor_->LoadError("victim:1"), "");
  ASSERT_TRUE(Run("victim:1", 1));
  EXPECT_FALSE(Run("victim:1", 99));
  ASSERT_TRUE(WaitReady());
  EXPECT_FALSE(supervisor_->ModelAvailable("victim:1"));
  EXPECT_FALSE(supervisor_->ModelExpected("victim:1"));
  EXPECT_THAT(supervisor_->LoadError("victim:1"),
              HasSubstr("crashed the worker 2 times while running batches; not loaded again"));
  EXPECT_THAT(supervisor_->LoadError("victim:1"), HasSubstr("signal 6"));
  EXPECT_EQ(Count("load victim:1"), 2) << "the third worker does not load it";
  EXPECT_TRUE(Run("good:1", 1));
  // Loaded again by request: its charges are cleared.
  ASSERT_TRUE(supervisor_->LoadModel(Model("victim:1"), 10s).ok());
  EXPECT_EQ(supervisor_->LoadError("victim:1"), "");
  EXPECT_TRUE(Run("victim:1", 1));
  EXPECT_FALSE(Run("victim:1", 99));
  ASSERT_TRUE(WaitReady());
  EXPECT_TRUE(supervisor_->ModelAvailable("victim:1")) << "one crash since the load";
}

// Crashes older than crash_window no longer count: a worker killed now and
// then while it ran some batch does not add up to its model's failure.
TEST_F(SupervisorTest, ACrashOlderThanTheWindowIsNotCounted) {
  env_.Set("FAKE_WORKER_CRASH_BATCH", "99");
  Create({Model("m:1")}, [this](WorkerSupervisor::Options* options, affinity::WorkerPlacement*) {
    options->clock = &clock_;
    options->crash_window = 600s;
  });
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  EXPECT_FALSE(Run("m:1", 99));
  ASSERT_TRUE(WaitReady());
  clock_.Advance(601s);
  EXPECT_FALSE(Run("m:1", 99));
  ASSERT_TRUE(WaitReady());
  EXPECT_TRUE(supervisor_->ModelAvailable("m:1")) << "the first crash is out of the window";
  EXPECT_EQ(supervisor_->LoadError("m:1"), "");
  clock_.Advance(599s);
  EXPECT_FALSE(Run("m:1", 99));
  ASSERT_TRUE(WaitReady());
  EXPECT_FALSE(supervisor_->ModelAvailable("m:1"));
  EXPECT_THAT(supervisor_->LoadError("m:1"), HasSubstr("crashed the worker 2 times"));
}

// The crash is charged to the batch the worker died on; a batch of another
// model queued behind it is answered as lost (the router runs it again, or
// answers UNAVAILABLE after the second loss) and its model is not charged.
TEST_F(SupervisorTest, ABatchQueuedBehindTheCrashIsLostButNotCharged) {
  env_.Set("FAKE_WORKER_CRASH_BATCH", "99");
  Create({Model("bad:1"), Model("good:1")},
         [](WorkerSupervisor::Options* options, affinity::WorkerPlacement*) {
           options->max_model_crashes = 1;
         });
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<bool, std::string>> lost;  // worker_lost, error
  for (const auto& [key, rows] : {std::pair<std::string, int64_t>{"bad:1", 99}, {"good:1", 1}}) {
    worker::Command command;
    command.mutable_run()->set_key(key);
    command.mutable_run()->set_batch(rows);
    ASSERT_TRUE(supervisor_->Send(0, command, [&](const worker::Reply& reply, bool worker_lost) {
      std::lock_guard<std::mutex> lock(mu);
      lost.emplace_back(worker_lost, reply.error());
      cv.notify_all();
    }));
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return lost.size() == 2; }));
    for (const auto& [worker_lost, error] : lost) {
      EXPECT_TRUE(worker_lost);
      EXPECT_THAT(error, HasSubstr("signal 6"));
    }
  }
  ASSERT_TRUE(WaitReady());
  EXPECT_FALSE(supervisor_->ModelAvailable("bad:1"));
  EXPECT_THAT(supervisor_->LoadError("bad:1"),
              HasSubstr("crashed the worker 1 time while running batches"));
  EXPECT_TRUE(supervisor_->ModelAvailable("good:1"));
  EXPECT_EQ(supervisor_->LoadError("good:1"), "");
  EXPECT_TRUE(Run("good:1", 1));
}

// A restarted worker is sent the models of the list as it was when it
// started. A model loaded once that was sent (the worker, not ready, is not
// sent it by LoadModel) is loaded there before it turns ready.
TEST_F(SupervisorTest, AModelLoadedWhileAWorkerRestartsIsLoadedThere) {
  Create({Model("a:1")});
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  HoldLoads();
  const pid_t first = KillWorker();
  ASSERT_TRUE(WaitForLine("hold load a:1"));
  // The only worker is not ready: no worker answers (nor holds it yet).
  EXPECT_FALSE(supervisor_->LoadModel(Model("b:1"), 5s).ok());
  EXPECT_TRUE(supervisor_->ModelExpected("b:1"));
  Release("a:1");
  Release("b:1");
  ASSERT_TRUE(WaitReady());
  EXPECT_NE(supervisor_->Pid(0), first);
  EXPECT_TRUE(supervisor_->HasModel(0, "a:1"));
  EXPECT_TRUE(supervisor_->HasModel(0, "b:1"));
  EXPECT_EQ(Count("load b:1"), 1);
  EXPECT_TRUE(Run("b:1", 1));
}

// The unload of a model the restarted worker was sent reaches it, and the
// worker never counts as holding it.
TEST_F(SupervisorTest, AModelUnloadedWhileAWorkerRestartsIsFreedThere) {
  Create({Model("a:1"), Model("b:1")});
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  HoldLoads();
  KillWorker();
  ASSERT_TRUE(WaitForLine("hold load a:1"));
  supervisor_->UnloadModel("b:1");
  EXPECT_FALSE(supervisor_->ModelExpected("b:1"));
  Release("a:1");
  Release("b:1");
  ASSERT_TRUE(WaitReady());
  EXPECT_FALSE(supervisor_->HasModel(0, "b:1"));
  EXPECT_FALSE(supervisor_->ModelAvailable("b:1"));
  EXPECT_TRUE(WaitForLine("unload b:1")) << "the restarted worker keeps b:1";
  EXPECT_TRUE(supervisor_->HasModel(0, "a:1"));
  EXPECT_TRUE(Run("a:1", 1));
}

// The comparison repeats until nothing changed during the last loads: a
// model loaded and one unloaded while the added model loads are handled in
// the next round.
TEST_F(SupervisorTest, LoadsAndUnloadsDuringEachRoundOfARestartAreApplied) {
  Create({Model("a:1")});
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  HoldLoads();
  KillWorker();
  ASSERT_TRUE(WaitForLine("hold load a:1"));
  EXPECT_FALSE(supervisor_->LoadModel(Model("b:1"), 5s).ok());
  Release("a:1");
  ASSERT_TRUE(WaitForLine("hold load b:1"));
  EXPECT_FALSE(supervisor_->Ready(0));
  EXPECT_FALSE(supervisor_->LoadModel(Model("c:1"), 5s).ok());
  supervisor_->UnloadModel("a:1");
  Release("b:1");
  ASSERT_TRUE(WaitForLine("hold load c:1"));
  EXPECT_FALSE(supervisor_->Ready(0));
  Release("c:1");
  ASSERT_TRUE(WaitReady());
  EXPECT_FALSE(supervisor_->HasModel(0, "a:1"));
  EXPECT_TRUE(supervisor_->HasModel(0, "b:1"));
  EXPECT_TRUE(supervisor_->HasModel(0, "c:1"));
  EXPECT_TRUE(WaitForLine("unload a:1"));
  EXPECT_TRUE(Run("c:1", 1));
}

// SIGTERM while a worker restarts: Stop() comes after the new worker was
// spawned and before its hello. It is stopped like the others, killed
// after stop_grace, and Stop() returns.
TEST_F(SupervisorTest, StopWhileAWorkerRestartsReturnsWithinTheGrace) {
  Create({Model("a:1")}, [](WorkerSupervisor::Options* options, affinity::WorkerPlacement*) {
    options->stop_grace = 200ms;
  });
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  env_.Set("FAKE_WORKER_HOLD_HELLO", log_ + ".hello");  // never made: held until killed
  KillWorker();
  const std::string line = WaitForLineStartingWith("hold hello ");
  ASSERT_NE(line, "") << "the worker was not restarted";
  const pid_t held = std::stoi(line.substr(std::string("hold hello ").size()));
  auto stopped = std::async(std::launch::async, [this] { supervisor_->Stop(); });
  const bool in_time = stopped.wait_for(5s) == std::future_status::ready;
  EXPECT_TRUE(in_time) << "Stop() still waits for a worker that has not said hello";
  if (!in_time) {
    kill(held, SIGKILL);  // lets Stop() return, so the test ends
    stopped.wait();
  }
  EXPECT_EQ(kill(held, 0), -1) << "the held worker outlived Stop()";
  EXPECT_EQ(errno, ESRCH);
}

TEST_F(SupervisorTest, TestBatchComputeTimeIsPassedToEveryWorker) {
  Create({Model("good:1")}, [](WorkerSupervisor::Options* options, affinity::WorkerPlacement*) {
    options->test_batch_compute_us = 20000;
  });
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  EXPECT_THAT(Args(), HasSubstr(" --test-batch-compute-us 20000"));
}

TEST_F(SupervisorTest, NoTestBatchComputeTimeByDefault) {
  Create({Model("good:1")});
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  EXPECT_THAT(Args(), HasSubstr("worker --index 0"));
  EXPECT_THAT(Args(), Not(HasSubstr("--test-batch-compute-us")));
}

// The log settings reach workers on their command line, not through the
// environment: the server's current ones, restarts included.
TEST_F(SupervisorTest, WorkersGetTheServersLogSettings) {
  const base::LogOptions before = base::CurrentLogOptions();
  base::ConfigureLog({.format = base::LogFormat::kJson, .level = base::LogLevel::kWarning});
  Create({Model("good:1")});
  supervisor_->Start(30s);
  const bool ready = WaitReady();
  base::ConfigureLog(before);
  ASSERT_TRUE(ready);
  EXPECT_THAT(Args(), HasSubstr(" --log-format json --log-level warning"));
  EXPECT_EQ(getenv("NUMASERVE_LOG_FORMAT"), nullptr);
}

// The process settings (process_options.h) reach workers as flags, the
// server's own; their variables, set in the server's environment, do not
// (docs/security.md, "Round two: hidden configuration").
TEST_F(SupervisorTest, WorkersGetTheProcessSettingsAsFlagsAndNotTheirVariables) {
  env_.Set("NUMASERVE_MAX_ISA", "avx512");
  env_.Set("NUMASERVE_BLIS_ARCH", "generic");
  env_.Set("NUMASERVE_OPENBLAS_CORE", "Prescott");
  env_.Set("NUMASERVE_GEMM_CACHE", "/var/tmp/from_the_environment.tsv");
  env_.Set("NUMASERVE_PROFILE_STEPS", "1");
  env_.Set("NUMASERVE_TRAINING_REFERENCE_OPS", "1");
  env_.Set("NUMASERVE_UNRELATED", "kept");
  Create({Model("good:1")}, [](WorkerSupervisor::Options* options, affinity::WorkerPlacement*) {
    options->process = {.max_isa = "avx2",
                        .blis_arch = "zen",
                        .openblas_core = "Zen",
                        .gemm_cache = "/var/tmp/choices.tsv",
                        .profile_steps = true,
                        .training_reference_ops = true};
  });
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  EXPECT_THAT(Args(), HasSubstr(" --max-isa=avx2 --blis-arch=zen --openblas-core=Zen "
                                "--gemm-cache=/var/tmp/choices.tsv --profile-steps"));
  EXPECT_THAT(Args(), Not(HasSubstr("--training-reference-ops")));  // not a worker's
  const std::string env = Line("env");
  EXPECT_THAT(env, HasSubstr(" NUMASERVE_UNRELATED=kept"));
  for (const char* name :
       {"NUMASERVE_MAX_ISA", "NUMASERVE_BLIS_ARCH", "NUMASERVE_OPENBLAS_CORE",
        "NUMASERVE_GEMM_CACHE", "NUMASERVE_PROFILE_STEPS", "NUMASERVE_TRAINING_REFERENCE_OPS"}) {
    EXPECT_THAT(env, Not(HasSubstr(name)));
  }
}

TEST_F(SupervisorTest, AWorkerGetsTheDefaultGemmCacheAndNoOtherProcessFlag) {
  Create({Model("good:1")});
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  EXPECT_THAT(Args(), HasSubstr(" --gemm-cache="));
  for (const char* flag : {"--max-isa", "--blis-arch", "--openblas-core", "--profile-steps"}) {
    EXPECT_THAT(Args(), Not(HasSubstr(flag)));
  }
}

TEST_F(SupervisorTest, InstancesAreWhatTheWorkerSaysItRuns) {
  env_.Set("FAKE_WORKER_INSTANCES", "3");
  WorkerSupervisor::ModelToLoad model = Model("auto:1");
  model.instances = kInstancesAuto;
  Create({model});
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  EXPECT_EQ(supervisor_->Instances(0, "auto:1"), 3);
  EXPECT_EQ(supervisor_->InstancesReport(0, "auto:1"), "fake measurement");
  EXPECT_EQ(supervisor_->MemoryNodes(0), "0=7");
  // Unloaded: nothing left of it.
  supervisor_->UnloadModel("auto:1");
  EXPECT_EQ(supervisor_->Instances(0, "auto:1"), 1);
  EXPECT_EQ(supervisor_->InstancesReport(0, "auto:1"), "");
}

TEST_F(SupervisorTest, AWorkerThatDoesNotSayRunsWhatWasAskedFor) {
  WorkerSupervisor::ModelToLoad two = Model("two:1"), per_core = Model("per_core:1");
  two.instances = 2;
  per_core.instances = kInstancesPerCore;
  Create({two, per_core});
  supervisor_->Start(30s);
  ASSERT_TRUE(WaitReady());
  EXPECT_EQ(supervisor_->Instances(0, "two:1"), 2);
  EXPECT_EQ(supervisor_->Instances(0, "per_core:1"), 1);
  EXPECT_EQ(supervisor_->InstancesReport(0, "two:1"), "");
  EXPECT_EQ(supervisor_->MemoryNodes(0), "");
}

TEST_F(SupervisorTest, ArenaOfAWorkerWithAutoOrPerCoreModelsHoldsABatchPerThreadPlusOne) {
  for (int instances : {kInstancesAuto, kInstancesPerCore}) {
    WorkerSupervisor::ModelToLoad model = Model("m:1");
    model.instances = instances;
    Create({model}, [](WorkerSupervisor::Options*, affinity::WorkerPlacement* placement) {
      placement->cpus = {0, 1, 2, 3};
      placement->num_threads = 4;
    });
    EXPECT_EQ(supervisor_->arena(0).size(), ArenaBytesForBatches(size_t{1} << 20, 5))
        << FormatInstances(instances);
    supervisor_.reset();
  }
  Create({Model("m:1")});
  EXPECT_EQ(supervisor_->arena(0).size(), ArenaBytesForBatches(size_t{1} << 20, 2));
}

// "SigBlk:\t0000000000004000" -> the mask.
uint64_t StatusMask(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::stoull(line.substr(field.size() + 1), nullptr, 16);
    }
  }
  ADD_FAILURE() << "no " << field << " for pid " << pid;
  return ~uint64_t{0};
}

TEST_F(SupervisorTest, WorkersStartWithNoSignalBlockedOrIgnored) {
  // As `numaserve serve` does: SIGINT/SIGTERM blocked (for sigwait) and
  // SIGPIPE ignored before any thread starts; threads inherit both, and so
  // would an exec'd worker.
  sigset_t blocked, old_mask;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &blocked, &old_mask), 0);
  struct sigaction ignore = {}, old_pipe = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGPIPE, &ignore, &old_pipe), 0);
  Create({});
  supervisor_->Start(30s);
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  sigaction(SIGPIPE, &old_pipe, nullptr);
  ASSERT_TRUE(WaitReady());
  const pid_t pid = supervisor_->Pid(0);
  ASSERT_GT(pid, 0);
  // Every signal a program can set (1-31, SIGRTMIN-SIGRTMAX): glibc keeps
  // 32 and 33 for itself (sigaction refuses them), so whatever the test
  // runner left on those is inherited and not ours to reset.
  uint64_t settable = 0;
  for (int sig = 1; sig <= 64; ++sig) {
    if (sig < 32 || (sig >= SIGRTMIN && sig <= SIGRTMAX)) settable |= uint64_t{1} << (sig - 1);
  }
  EXPECT_EQ(StatusMask(pid, "SigBlk") & settable, 0u);
  EXPECT_EQ(StatusMask(pid, "SigIgn") & settable, 0u);
  // SIGTERM reaches it: the worker dies and a new one starts.
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline && supervisor_->Pid(0) == pid) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_NE(supervisor_->Pid(0), pid) << "SIGTERM did not end the worker";
}

}  // namespace
}  // namespace numaserve::serving
