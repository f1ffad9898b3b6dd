// The pull scheduler on a fake clock with a fake worker pool: which batch
// goes to which slot, when, and how the answers come back. Nothing sleeps.
#include "serving/scheduling/model_scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace numaserve::serving {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// Workers with a number of instances per model; every Run is recorded and
// stays running until the test completes it.
class FakePool final : public WorkerPool {
 public:
  struct Running {
    int worker;
    std::string key;
    int64_t rows;
    RunDoneFn done;
    std::vector<float> out;                          // row i = 10 * input row i
    bool profile = false;                            // InferenceTask::profile
    std::vector<std::vector<int64_t>> input_shapes;  // InferenceTask::input_shapes
  };

  explicit FakePool(int workers) : ready_(static_cast<size_t>(workers), true) {}
  void Hold(int worker, const std::string& key, int instances) {
    instances_[{worker, key}] = instances;
  }

  int size() const override { return static_cast<int>(ready_.size()); }
  bool Ready(int w) const override { return ready_[static_cast<size_t>(w)]; }
  bool HasModel(int w, const std::string& key) const override {
    return instances_.count({w, key}) > 0;
  }
  bool ModelExpected(const std::string&) const override { return expected; }
  int Instances(int w, const std::string& key) const override {
    auto it = instances_.find({w, key});
    return it == instances_.end() ? 1 : it->second;
  }
  int NumaNode(int w) const override { return w / 2; }
  size_t BatchBytesLimit() const override { return batch_bytes; }
  void Run(int w, const InferenceTask& task, RunDoneFn done) override {
    if (on_run) std::exchange(on_run, nullptr)();  // once, before the run is recorded
    Running r{w, task.model_key, task.rows, std::move(done), {}, task.profile, task.input_shapes};
    for (const auto& piece : task.inputs.at(0)) {
      const float* in = reinterpret_cast<const float*>(piece.first);
      for (size_t i = 0; i < piece.second / sizeof(float); ++i) r.out.push_back(10 * in[i]);
    }
    EXPECT_EQ(task.output_bytes.at(0), static_cast<size_t>(task.rows) * sizeof(float));
    running.push_back(std::move(r));
  }

  // Answers running batch `i` (in start order) with `status`.
  void Complete(size_t i, absl::Status status = absl::OkStatus(), bool lost = false,
                int instance = 0) {
    Running r = std::move(running.at(i));
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    RunOutcome outcome;
    outcome.status = status;
    outcome.lost = lost;
    outcome.instance = instance;
    outcome.compute_seconds = 0.01;
    if (status.ok()) outcome.outputs.push_back(reinterpret_cast<const char*>(r.out.data()));
    // A profiled run answers its profile, as the worker does.
    if (status.ok() && r.profile) outcome.profile_json = absl::StrCat("{\"batch\": ", r.rows, "}");
    r.done(outcome);
  }
  // Answers every batch running now, oldest first.
  void CompleteAll() {
    const size_t n = running.size();
    for (size_t i = 0; i < n; ++i) Complete(0);
  }
  int RunningOn(int w) const {
    return static_cast<int>(std::count_if(running.begin(), running.end(),
                                          [w](const Running& r) { return r.worker == w; }));
  }

  size_t batch_bytes = size_t{1} << 30;
  std::function<void()> on_run;  // the next Run calls it first (a slow input copy)
  bool expected = true;          // ModelExpected: a worker restarts with the model
  std::vector<bool> ready_;
  std::map<std::pair<int, std::string>, int> instances_;
  std::vector<Running> running;
};

// One caller's request of `rows` rows of one float each (value = its id).
struct Call {
  std::vector<float> input;
  bool answered = false;
  absl::Status status;
  std::vector<float> output;
  int64_t batch_rows = 0;
  std::string profile;  // InferenceTiming::profile
  // Batches running on the fake pool when this call was answered.
  size_t running_when_answered = 0;
};

class SchedulerTest : public ::testing::Test {
 protected:
  void Make(int workers, ModelScheduler::Options options = {}) {
    pool_ = std::make_unique<FakePool>(workers);
    scheduler_ = std::make_unique<ModelScheduler>(options, pool_.get(), nullptr, now_);
  }

  std::shared_ptr<RepositoryModel> Model(const std::string& name, int max_batch, int delay_us,
                                         std::vector<int> preferred = {}) {
    auto m = std::make_shared<RepositoryModel>();
    m->name = name;
    m->version = 1;
    m->info.inputs.push_back({"x", engine::DataType::kFloat32, {-1, 1}});
    m->info.outputs.push_back({"y", engine::DataType::kFloat32, {-1, 1}});
    m->info.batched = true;
    m->config.set_max_batch_size(max_batch);
    auto* d = m->config.mutable_dynamic_batching();
    d->set_max_queue_delay_microseconds(delay_us);
    for (int p : preferred) d->add_preferred_batch_size(p);
    EXPECT_TRUE(scheduler_->AddModel(m).ok());
    return m;
  }

  // `seq` > 0: a request of a shape-polymorphic model, x [rows, seq] (its
  // data one float per row, all the fake pool reads).
  std::shared_ptr<Call> Submit(const std::shared_ptr<RepositoryModel>& model, int64_t rows = 1,
                               absl::StatusCode expect = absl::StatusCode::kOk,
                               bool profile = false, int64_t seq = 0) {
    auto call = std::make_shared<Call>();
    for (int64_t i = 0; i < rows; ++i) call->input.push_back(static_cast<float>(next_id_++));
    auto p = std::make_shared<PendingInference>();
    p->model = model;
    p->rows = rows;
    p->profile = profile;
    p->bytes = 2 * static_cast<size_t>(rows) * sizeof(float);
    p->deadline = now_->Now() + std::chrono::seconds(60);
    p->parsed.rows = rows;
    p->parsed.inputs.emplace_back().Add(
        {reinterpret_cast<const char*>(call->input.data()), call->input.size() * sizeof(float)});
    p->parsed.output_bytes.push_back(static_cast<size_t>(rows) * sizeof(float));
    if (seq > 0) {
      p->parsed.input_shapes = {{rows, seq}};
      p->shape_key = {2, seq};
    }
    Call* c = call.get();
    FakePool* pool = pool_.get();
    p->done = [c, pool](const absl::Status& s, const std::vector<const char*>& outputs,
                        const InferenceTiming& timing) {
      c->answered = true;
      c->running_when_answered = pool->running.size();
      c->status = s;
      c->batch_rows = timing.batch_rows;
      c->profile = timing.profile;
      if (s.ok()) {
        const float* y = reinterpret_cast<const float*>(outputs.at(0));
        c->output.assign(y, y + c->input.size());
      }
    };
    p->reject = [c](const absl::Status& s) {
      c->answered = true;
      c->status = s;
    };
    EXPECT_EQ(scheduler_->Submit(p).code(), expect);
    calls_.push_back(call);
    return call;
  }

  void ExpectAnsweredCorrectly() {
    for (const auto& c : calls_) {
      ASSERT_TRUE(c->answered);
      ASSERT_TRUE(c->status.ok()) << c->status;
      for (size_t i = 0; i < c->input.size(); ++i) EXPECT_EQ(c->output[i], 10 * c->input[i]);
    }
  }

  std::vector<int64_t> RunningRows() const {
    std::vector<int64_t> rows;
    for (const auto& r : pool_->running) rows.push_back(r.rows);
    return rows;
  }

  base::FakeClock clock_;
  // The scheduler's clock and the requests' deadlines': clock_, or the real
  // one for the tests of the timer thread (which sleeps on the real clock).
  const base::Clock* now_ = &clock_;
  std::unique_ptr<FakePool> pool_;
  // Before scheduler_: ~ModelScheduler answers what is still queued.
  std::vector<std::shared_ptr<Call>> calls_;
  std::unique_ptr<ModelScheduler> scheduler_;
  int next_id_ = 1;
};

// How many times the thread of this process named `name` has run on a cpu
// (/proc/self/task/*/schedstat); -1 when there is no such thread.
int64_t ThreadTimeslices(const std::string& name) {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string found;
    std::getline(comm, found);
    if (found != name) continue;
    std::ifstream stat(task.path() / "schedstat");
    int64_t ns = 0, waited = 0, slices = -1;
    stat >> ns >> waited >> slices;
    return slices;
  }
  return -1;
}

TEST_F(SchedulerTest, AnIdleSchedulersTimerSleepsUntilSomethingIsDue) {
  // It once woke every 10 ms to look for cancelled calls, which take their
  // requests out of the queues themselves.
  now_ = base::Clock::Real();
  Make(1);
  scheduler_->Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // settled
  const int64_t before = ThreadTimeslices("scheduler");
  ASSERT_GE(before, 0) << "no thread named scheduler";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LE(ThreadTimeslices("scheduler") - before, 1);
  // A request waiting for an instance does not make it poll either: its
  // deadline (a minute away) is what the timer is set for.
  auto m = Model("m", 1, 0);
  pool_->Hold(0, m->key(), 1);
  Submit(m);                 // computes
  Submit(m);                 // a full batch of one: ready on the worker behind it
  auto waiting = Submit(m);  // waits in the queue
  EXPECT_EQ(scheduler_->pending(), 1u);
  const int64_t queued = ThreadTimeslices("scheduler");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LE(ThreadTimeslices("scheduler") - queued, 2);
  EXPECT_FALSE(waiting->answered);
  for (int i = 0; i < 3; ++i) pool_->CompleteAll();
  ExpectAnsweredCorrectly();
}

TEST_F(SchedulerTest, AnIdleSlotTakesARequestAtOnceWithoutDelay) {
  Make(1);
  auto m = Model("m", 8, 0);
  pool_->Hold(0, m->key(), 1);
  Submit(m);
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>{1}));
  pool_->CompleteAll();
  ExpectAnsweredCorrectly();
}

TEST_F(SchedulerTest, BatchesReachAWorkerInTheOrderTheyWereTakenFromTheQueue) {
  // The first request's inputs are still being copied (on its caller's
  // thread) when a second caller's request takes the worker's pipeline
  // slot: it is sent after the first, not beside it, so a worker runs a
  // queue's requests in their order (a stream's answers stay in order).
  Make(1);
  auto m = Model("m", 1, 0);
  pool_->Hold(0, m->key(), 1);
  std::shared_ptr<Call> second;
  pool_->on_run = [&] { std::thread([&] { second = Submit(m); }).join(); };
  auto first = Submit(m);
  ASSERT_NE(second, nullptr);
  ASSERT_EQ(pool_->running.size(), 2u);
  EXPECT_EQ(pool_->running[0].out, std::vector<float>{10 * first->input[0]});
  EXPECT_EQ(pool_->running[1].out, std::vector<float>{10 * second->input[0]});
  pool_->CompleteAll();
  ExpectAnsweredCorrectly();
}

TEST_F(SchedulerTest, APartialBatchNeverStacksOnABusyInstanceAFullOneMay) {
  Make(1);
  auto m = Model("m", 4, 0);
  pool_->Hold(0, m->key(), 1);
  Submit(m);  // runs
  Submit(m);  // partial: waits for the instance
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>{1}));
  Submit(m);
  Submit(m);
  Submit(m);  // 4 queued: a full batch takes the pipeline slot
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>{1, 4}));
  Submit(m);  // nothing more fits on the worker
  EXPECT_EQ(pool_->running.size(), 2u);
  // The instance frees and computes the pipelined full batch: the partial
  // one still waits for an idle instance.
  pool_->Complete(0);
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>{4}));
  pool_->Complete(0);
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>{1}));
  pool_->CompleteAll();
  ExpectAnsweredCorrectly();
}

TEST_F(SchedulerTest, AWorkerHoldsOneFullBatchReadyPerInstance) {
  // One worker of 4 instances holds as many batches ready as 4 workers of
  // one instance would: 4 computing, 4 waiting in its pipeline.
  Make(1);
  auto m = Model("m", 2, 0);
  pool_->Hold(0, m->key(), 4);
  for (int i = 0; i < 14; ++i) Submit(m);
  // The first 4 requests took the idle instances at once; then full
  // batches of 2 fill the pipeline, one per instance; 2 requests queue.
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>{1, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(scheduler_->pending(), 2u);
  pool_->Complete(0);
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>{1, 1, 1, 2, 2, 2, 2, 2}));
  EXPECT_EQ(scheduler_->pending(), 0u);
  pool_->CompleteAll();
  ExpectAnsweredCorrectly();
}

TEST_F(SchedulerTest, TheFreedSlotIsFilledBeforeItsCallersAreAnswered) {
  // Answering a batch's callers (gRPC completions, output copies) must not
  // keep its slot idle: the next batch is sent first.
  Make(1);
  auto m = Model("m", 2, 0);
  pool_->Hold(0, m->key(), 1);
  auto first = Submit(m);                 // runs alone
  for (int i = 0; i < 4; ++i) Submit(m);  // a full batch waits in the pipeline, one queues
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(scheduler_->pending(), 2u);
  pool_->Complete(0);
  ASSERT_TRUE(first->answered);
  // When `first` was answered the queued batch was already running.
  EXPECT_EQ(first->running_when_answered, 2u);
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>{2, 2}));
  pool_->CompleteAll();
  ExpectAnsweredCorrectly();
}

TEST_F(SchedulerTest, QueuedRowsAreSharedBetweenIdleInstances) {
  // 4 workers x 2 instances; 64 requests arrive within the delay.
  Make(4);
  auto m = Model("m", 32, 1000);
  for (int w = 0; w < 4; ++w) {
    pool_->Hold(w, m->key(), 2);
    pool_->ready_[static_cast<size_t>(w)] = false;  // the requests come first
  }
  for (int i = 0; i < 64; ++i) Submit(m);
  for (int w = 0; w < 4; ++w) pool_->ready_[static_cast<size_t>(w)] = true;
  scheduler_->Pump();
  // 64 rows make full batches (32): they are due at once, and shared.
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>(8, 8)));
  for (int w = 0; w < 4; ++w) EXPECT_EQ(pool_->RunningOn(w), 2) << "worker " << w;
  pool_->CompleteAll();
  ExpectAnsweredCorrectly();
}

TEST_F(SchedulerTest, APartialBatchWaitsForTheDelayThenSplitsOverIdleSlots) {
  Make(2);
  auto m = Model("m", 32, 1000);
  pool_->Hold(0, m->key(), 1);
  pool_->Hold(1, m->key(), 1);
  for (int i = 0; i < 6; ++i) Submit(m);
  EXPECT_TRUE(pool_->running.empty());
  clock_.Advance(microseconds(999));
  scheduler_->Pump();
  EXPECT_TRUE(pool_->running.empty());
  clock_.Advance(microseconds(1));
  scheduler_->Pump();
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(pool_->RunningOn(0), 1);
  EXPECT_EQ(pool_->RunningOn(1), 1);
  pool_->CompleteAll();
  ExpectAnsweredCorrectly();
}

TEST_F(SchedulerTest, EverySlotGetsItsShareUnderSteadyLoad) {
  // 8 workers x 2 instances = 16 slots, batches of 4 rows computing for a
  // fixed time; each caller sends its next request as soon as it is
  // answered; 2 x 16 x 4 callers.
  Make(8);
  auto m = Model("m", 4, 1000);
  for (int w = 0; w < 8; ++w) {
    pool_->Hold(w, m->key(), 2);
    pool_->ready_[static_cast<size_t>(w)] = false;  // the callers come first
  }
  const int kCallers = 2 * 16 * 4;
  for (int i = 0; i < kCallers; ++i) Submit(m);
  for (int w = 0; w < 8; ++w) pool_->ready_[static_cast<size_t>(w)] = true;
  scheduler_->Pump();
  std::vector<int> batches(8, 0);
  int64_t rows = 0;
  for (int round = 0; round < 50; ++round) {
    // Every instance of every worker computes and each worker holds one
    // full batch more per instance in its pipeline.
    for (int w = 0; w < 8; ++w) ASSERT_EQ(pool_->RunningOn(w), 4) << "round " << round;
    // Each worker's two computing batches (its oldest) finish, one after
    // the other; their callers send again at once.
    for (int w = 0; w < 8; ++w) {
      for (int k = 0; k < 2; ++k) {
        size_t i = 0;
        while (pool_->running[i].worker != w) ++i;
        rows += pool_->running[i].rows;
        ++batches[static_cast<size_t>(w)];
        size_t answered_before = 0;
        for (const auto& c : calls_) answered_before += c->answered;
        pool_->Complete(i);
        size_t answered_after = 0;
        for (const auto& c : calls_) answered_after += c->answered;
        for (size_t n = answered_before; n < answered_after; ++n) Submit(m);
      }
    }
  }
  // Every batch full, every worker the same number of batches.
  EXPECT_EQ(rows, 50 * 16 * 4);
  for (int w = 0; w < 8; ++w) EXPECT_EQ(batches[static_cast<size_t>(w)], 100) << "worker " << w;
}

TEST_F(SchedulerTest, ModelsSharingAWorkerTakeTurns) {
  Make(1);
  auto a = Model("a", 2, 0);
  auto b = Model("b", 2, 0);
  pool_->Hold(0, a->key(), 1);
  pool_->Hold(0, b->key(), 1);
  Submit(a);  // runs
  for (int i = 0; i < 4; ++i) Submit(a, 1);
  for (int i = 0; i < 4; ++i) Submit(b, 1);
  ASSERT_EQ(pool_->running.size(), 2u);  // a's batch + one full batch pipelined
  std::vector<std::string> order;
  for (int i = 0; i < 4; ++i) {
    order.push_back(pool_->running.back().key);
    pool_->Complete(0);
  }
  // After a's first full batch, b's and a's alternate.
  EXPECT_EQ(order[1] != order[2], true);
  EXPECT_EQ(order[2] != order[3], true);
  pool_->CompleteAll();
  ExpectAnsweredCorrectly();
}

TEST_F(SchedulerTest, OneProfilingRequestProfilesItsBatchAndOnlyItGetsTheProfile) {
  Make(1);
  auto m = Model("m", 4, 0);
  pool_->Hold(0, m->key(), 1);
  auto before = Submit(m);  // runs alone, unprofiled
  ASSERT_EQ(pool_->running.size(), 1u);
  EXPECT_FALSE(pool_->running[0].profile);
  // Three requests wait for the instance; the middle one asks for its profile.
  auto plain1 = Submit(m);
  auto asks = Submit(m, 1, absl::StatusCode::kOk, /*profile=*/true);
  auto plain2 = Submit(m);
  pool_->Complete(0);
  ASSERT_EQ(RunningRows(), (std::vector<int64_t>{3}));
  EXPECT_TRUE(pool_->running[0].profile) << "a request of the batch asked";
  pool_->Complete(0);
  ASSERT_TRUE(asks->answered);
  EXPECT_EQ(asks->profile, "{\"batch\": 3}");
  for (const auto& c : {before, plain1, plain2}) {
    ASSERT_TRUE(c->answered);
    EXPECT_EQ(c->profile, "") << "only the request that asked gets the profile";
  }
  // The next batch, where nobody asks, runs without it.
  auto after = Submit(m);
  ASSERT_EQ(pool_->running.size(), 1u);
  EXPECT_FALSE(pool_->running[0].profile);
  pool_->Complete(0);
  EXPECT_EQ(after->profile, "");
  ExpectAnsweredCorrectly();
}

TEST_F(SchedulerTest, ALostBatchRunsOnceMoreThenFailsUnavailable) {
  Make(2);
  auto m = Model("m", 4, 0);
  pool_->Hold(0, m->key(), 1);
  pool_->Hold(1, m->key(), 1);
  auto call = Submit(m);
  ASSERT_EQ(pool_->running.size(), 1u);
  pool_->Complete(0, absl::UnavailableError("worker 0 exited"), /*lost=*/true);
  ASSERT_EQ(pool_->running.size(), 1u);  // run again
  EXPECT_FALSE(call->answered);
  pool_->Complete(0, absl::UnavailableError("worker 1 exited"), /*lost=*/true);
  ASSERT_TRUE(call->answered);
  EXPECT_EQ(call->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(call->status.message().find("attempt 2 of 2"), std::string::npos) << call->status;
}

TEST_F(SchedulerTest, TheEnginesCodeReachesTheCaller) {
  Make(1);
  auto m = Model("m", 4, 0);
  pool_->Hold(0, m->key(), 1);
  auto call = Submit(m);
  pool_->Complete(0, absl::InvalidArgumentError("integer division by zero"));
  ASSERT_TRUE(call->answered);
  EXPECT_EQ(call->status.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, DeadlinesAndStop) {
  Make(1);
  auto m = Model("m", 4, 0);
  pool_->Hold(0, m->key(), 1);
  Submit(m);  // runs
  auto queued = Submit(m);
  clock_.Advance(std::chrono::seconds(61));
  scheduler_->Pump();
  ASSERT_TRUE(queued->answered);
  EXPECT_EQ(queued->status.code(), absl::StatusCode::kDeadlineExceeded);
  auto stopped = Submit(m);
  scheduler_->Stop();
  EXPECT_EQ(stopped->status.code(), absl::StatusCode::kUnavailable);
  pool_->CompleteAll();  // the running batch is still answered
  EXPECT_TRUE(calls_.front()->answered);
}

TEST_F(SchedulerTest, RemoveModelWaitsForItsBatchesWithoutSpinning) {
  Make(1);
  auto m = Model("m", 4, 0);
  pool_->Hold(0, m->key(), 1);
  Submit(m);
  std::thread completer([&] {
    std::this_thread::sleep_for(milliseconds(20));
    pool_->CompleteAll();
  });
  EXPECT_TRUE(scheduler_->RemoveModel(m->key(), std::chrono::seconds(10)));
  completer.join();
  ExpectAnsweredCorrectly();
  Submit(m, 1, absl::StatusCode::kUnavailable);
  calls_.pop_back();
}

// RemoveModel gave up waiting for a batch, whose worker then died under
// it: nobody would run it again, so its callers are answered at once,
// naming the model that was unloaded, not left to their deadline.
TEST_F(SchedulerTest, ABatchLostAfterItsModelWasRemovedIsAnsweredUnavailable) {
  Make(2);
  auto m = Model("m", 4, 0);
  pool_->Hold(0, m->key(), 1);
  pool_->Hold(1, m->key(), 1);
  auto first = Submit(m);
  auto second = Submit(m);
  ASSERT_EQ(pool_->running.size(), 2u);
  EXPECT_FALSE(scheduler_->RemoveModel(m->key(), milliseconds(0)));  // the drain times out
  pool_->Complete(0, absl::UnavailableError("worker 0 exited"), /*lost=*/true);
  pool_->Complete(0, absl::UnavailableError("worker 1 exited"), /*lost=*/true);
  for (const auto& c : {first, second}) {
    ASSERT_TRUE(c->answered);
    EXPECT_EQ(c->status.code(), absl::StatusCode::kUnavailable) << c->status;
    EXPECT_NE(c->status.message().find("model 'm' version 1 was unloaded"), std::string::npos)
        << c->status;
  }
  EXPECT_TRUE(pool_->running.empty());
}

TEST_F(SchedulerTest, BatchesStayWithinTheWorkersMemoryAndALargerRequestIsRefusedAlone) {
  Make(1);
  pool_->batch_bytes = 24;  // 3 rows of 8 bytes (a float in, a float out)
  auto m = Model("m", 8, 1000);
  pool_->Hold(0, m->key(), 1);
  pool_->ready_[0] = false;
  for (int i = 0; i < 5; ++i) Submit(m);
  Submit(m, 4, absl::StatusCode::kResourceExhausted);  // 32 bytes: never fits
  calls_.pop_back();
  pool_->ready_[0] = true;
  clock_.Advance(microseconds(1000));
  scheduler_->Pump();
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>{3}));
  pool_->Complete(0);
  EXPECT_EQ(RunningRows(), (std::vector<int64_t>{2}));
  pool_->CompleteAll();
  ExpectAnsweredCorrectly();
}

TEST_F(SchedulerTest, AWorkerThatIsNotReadyGetsNothing) {
  Make(2);
  auto m = Model("m", 4, 0);
  pool_->Hold(0, m->key(), 1);
  pool_->Hold(1, m->key(), 1);
  pool_->ready_[0] = false;
  Submit(m);
  Submit(m);
  EXPECT_EQ(pool_->RunningOn(0), 0);
  EXPECT_EQ(pool_->RunningOn(1), 1);
  pool_->ready_[0] = true;
  scheduler_->Pump();
  EXPECT_EQ(pool_->RunningOn(0), 1);
  pool_->CompleteAll();
  ExpectAnsweredCorrectly();
}

// The only worker dies under a batch and restarts: the batch and the
// requests that arrive meanwhile wait for it instead of failing.
TEST_F(SchedulerTest, WorkWaitsForTheOnlyWorkerWhileItRestarts) {
  Make(1);
  auto m = Model("m", 4, 0);
  pool_->Hold(0, m->key(), 1);
  Submit(m);
  ASSERT_EQ(pool_->running.size(), 1u);
  pool_->ready_[0] = false;  // the supervisor saw it exit
  pool_->Complete(0, absl::UnavailableError("worker 0 exited"), /*lost=*/true);
  Submit(m);
  Submit(m);
  EXPECT_TRUE(pool_->running.empty());
  for (const auto& c : calls_) EXPECT_FALSE(c->answered);
  pool_->ready_[0] = true;  // restarted, the model loaded again
  scheduler_->Pump();
  ASSERT_FALSE(pool_->running.empty());
  while (!pool_->running.empty()) pool_->CompleteAll();
  ExpectAnsweredCorrectly();
}

// ... but once no worker can hold the model again (its load failed, or it
// was marked failed after crashing workers), nothing waits forever.
TEST_F(SchedulerTest, WorkForAModelNoWorkerWillHoldFailsAtOnce) {
  Make(1);
  auto m = Model("m", 4, 0);
  pool_->Hold(0, m->key(), 1);
  auto lost = Submit(m);
  pool_->ready_[0] = false;
  pool_->Complete(0, absl::UnavailableError("worker 0 exited"), /*lost=*/true);
  auto queued = Submit(m);
  EXPECT_FALSE(lost->answered);
  EXPECT_FALSE(queued->answered);
  pool_->expected = false;
  pool_->instances_.clear();
  pool_->ready_[0] = true;  // back, without the model
  scheduler_->Pump();
  for (const auto& c : {lost, queued}) {
    ASSERT_TRUE(c->answered);
    EXPECT_EQ(c->status.code(), absl::StatusCode::kUnavailable) << c->status;
    EXPECT_NE(c->status.message().find("no worker holds it"), std::string::npos) << c->status;
  }
  EXPECT_TRUE(pool_->running.empty());
}

// A shape-polymorphic model (a dynamic dim besides the batch): requests
// batch only with requests of their dims besides dim 0, the oldest shape
// first, and each batch carries its signature with dim 0 at the batch's
// rows; a model run at a batch size alone carries none.
TEST_F(SchedulerTest, ABatchOfAShapePolymorphicModelCarriesItsSignature) {
  Make(1);
  auto m = Model("m", 8, 0);
  m->info.inputs[0].shape = {-1, -1};
  m->signature_shapes = [](const std::vector<std::vector<int64_t>>& in)
      -> absl::StatusOr<std::vector<std::vector<int64_t>>> { return in; };
  pool_->Hold(0, m->key(), 1);
  Submit(m, 1, absl::StatusCode::kOk, false, /*seq=*/2);  // runs at once
  Submit(m, 1, absl::StatusCode::kOk, false, 3);
  Submit(m, 2, absl::StatusCode::kOk, false, 2);
  Submit(m, 1, absl::StatusCode::kOk, false, 3);
  Submit(m, 1, absl::StatusCode::kOk, false, 2);
  using Shapes = std::vector<std::vector<int64_t>>;
  ASSERT_EQ(pool_->running.size(), 1u);
  EXPECT_EQ(pool_->running[0].input_shapes, (Shapes{{1, 2}}));
  pool_->CompleteAll();
  ASSERT_EQ(pool_->running.size(), 1u);
  EXPECT_EQ(pool_->running[0].input_shapes, (Shapes{{2, 3}}));  // the two seq 3 requests
  pool_->CompleteAll();
  ASSERT_EQ(pool_->running.size(), 1u);
  EXPECT_EQ(pool_->running[0].input_shapes, (Shapes{{3, 2}}));  // 2 + 1 rows of seq 2
  pool_->CompleteAll();
  for (const auto& c : calls_) EXPECT_TRUE(c->answered && c->status.ok()) << c->status;

  auto plain = Model("plain", 8, 0);
  pool_->Hold(0, plain->key(), 1);
  Submit(plain, 2);
  ASSERT_EQ(pool_->running.size(), 1u);
  EXPECT_TRUE(pool_->running[0].input_shapes.empty());
  pool_->CompleteAll();
}

}  // namespace
}  // namespace numaserve::serving
