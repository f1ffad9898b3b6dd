#include "serving/scheduling/dynamic_batcher.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace numaserve::serving {
namespace {

using std::chrono::microseconds;

// A batcher on a fake clock whose "workers" are a flag; records every batch
// (as row counts per request) and every rejection.
class BatcherTest : public ::testing::Test {
 protected:
  void Make(DynamicBatcher::Options options) {
    auto b = DynamicBatcher::Create(
        options, &clock_,
        [this](bool full) {
          fulls_.push_back(full);
          return worker_free_ || (full && slot_free_);
        },
        [this](Batch batch) {
          std::vector<int64_t> rows;
          for (const auto& r : batch) rows.push_back(r->rows);
          batches_.push_back(rows);
        });
    ASSERT_TRUE(b.ok()) << b.status();
    batcher_ = *std::move(b);
  }

  std::shared_ptr<BatchRequest> Request(int64_t rows) {
    auto r = std::make_shared<BatchRequest>();
    r->rows = rows;
    r->reject = [this](const absl::Status& s) { rejected_.push_back(s.code()); };
    return r;
  }

  void Enqueue(int64_t rows) { ASSERT_TRUE(batcher_->Enqueue(Request(rows)).ok()); }

  base::FakeClock clock_;
  bool worker_free_ = true;  // an idle worker: takes any batch
  bool slot_free_ = false;   // a busy worker with a free slot: takes only full batches
  std::vector<bool> fulls_;  // what can_dispatch was told, in order
  std::unique_ptr<DynamicBatcher> batcher_;
  std::vector<std::vector<int64_t>> batches_;
  std::vector<absl::StatusCode> rejected_;
};

using Rows = std::vector<std::vector<int64_t>>;

TEST_F(BatcherTest, WithoutBatchingEveryRequestIsItsOwnBatch) {
  Make({.max_batch_rows = 0});
  Enqueue(3);
  Enqueue(1);
  EXPECT_EQ(batches_, (Rows{{3}, {1}}));
}

TEST_F(BatcherTest, WaitsForTheDelayThenSendsWhatIsQueued) {
  Make({.max_batch_rows = 8, .max_queue_delay = microseconds(100)});
  Enqueue(1);
  const base::Clock::TimePoint first = clock_.Now();
  clock_.Advance(microseconds(40));
  Enqueue(2);
  EXPECT_TRUE(batches_.empty());
  EXPECT_EQ(batcher_->Poll(), first + microseconds(100));
  clock_.Advance(microseconds(59));
  batcher_->Poll();
  EXPECT_TRUE(batches_.empty());
  clock_.Advance(microseconds(1));
  EXPECT_EQ(batcher_->Poll(), base::Clock::TimePoint::max());
  EXPECT_EQ(batches_, (Rows{{1, 2}}));
  EXPECT_EQ(batcher_->queued_requests(), 0u);
}

TEST_F(BatcherTest, EnqueueHandsBackWhenItsQueueNeedsPollingAgain) {
  Make({.max_batch_rows = 8, .max_queue_delay = microseconds(100)});
  base::Clock::TimePoint next{};
  ASSERT_TRUE(batcher_->Enqueue(Request(1), &next).ok());
  EXPECT_EQ(next, clock_.Now() + microseconds(100));  // waiting for company
  ASSERT_TRUE(batcher_->Enqueue(Request(7), &next).ok());
  EXPECT_EQ(batches_, (Rows{{1, 7}}));  // full: sent at once
  EXPECT_EQ(next, base::Clock::TimePoint::max());
}

TEST_F(BatcherTest, FullBatchTakesABusyWorkersFreeSlotPartialOneWaitsForAnIdleWorker) {
  Make({.max_batch_rows = 4});
  worker_free_ = false;
  slot_free_ = true;
  Enqueue(1);
  EXPECT_TRUE(batches_.empty());  // partial: later requests may still join it
  EXPECT_FALSE(fulls_.back());
  Enqueue(1);
  Enqueue(2);  // 4 rows: full
  EXPECT_EQ(batches_, (Rows{{1, 1, 2}}));
  Enqueue(1);
  Enqueue(2);
  EXPECT_EQ(batches_.size(), 1u);
  worker_free_ = true;  // the worker finished: whatever is queued goes
  batcher_->Poll();
  EXPECT_EQ(batches_, (Rows{{1, 1, 2}, {1, 2}}));
}

TEST_F(BatcherTest, DelayedPartialBatchStillWaitsForAnIdleWorker) {
  Make({.max_batch_rows = 8, .max_queue_delay = microseconds(100)});
  worker_free_ = false;
  slot_free_ = true;
  Enqueue(1);
  clock_.Advance(microseconds(100));
  batcher_->Poll();
  EXPECT_TRUE(batches_.empty());
  EXPECT_FALSE(fulls_.back());
  worker_free_ = true;
  batcher_->Poll();
  EXPECT_EQ(batches_, (Rows{{1}}));
}

TEST_F(BatcherTest, PreferredSizeCountsAsFull) {
  Make({.max_batch_rows = 8, .preferred_batch_rows = {2}, .max_queue_delay = microseconds(1000)});
  worker_free_ = false;
  slot_free_ = true;
  Enqueue(1);
  Enqueue(1);
  EXPECT_EQ(batches_, (Rows{{1, 1}}));
  EXPECT_TRUE(fulls_.back());
}

TEST_F(BatcherTest, ZeroDelaySendsAtOnceWhenAWorkerIsFree) {
  Make({.max_batch_rows = 8});
  Enqueue(1);
  Enqueue(1);
  EXPECT_EQ(batches_, (Rows{{1}, {1}}));
}

TEST_F(BatcherTest, GathersWhileWorkersAreBusy) {
  Make({.max_batch_rows = 8});
  worker_free_ = false;
  for (int i = 0; i < 5; ++i) Enqueue(1);
  EXPECT_TRUE(batches_.empty());
  worker_free_ = true;
  batcher_->Poll();
  EXPECT_EQ(batches_, (Rows{{1, 1, 1, 1, 1}}));
}

TEST_F(BatcherTest, FullBatchGoesAtOnceWithoutWaitingForTheDelay) {
  Make({.max_batch_rows = 4, .max_queue_delay = microseconds(1000000)});
  for (int i = 0; i < 4; ++i) Enqueue(1);
  EXPECT_EQ(batches_, (Rows{{1, 1, 1, 1}}));
}

TEST_F(BatcherTest, MultiRowRequestsCountAsRowsAndAreNeverSplit) {
  Make({.max_batch_rows = 4, .max_queue_delay = microseconds(1000)});
  Enqueue(3);
  EXPECT_TRUE(batches_.empty());
  Enqueue(2);  // 3 + 2 > 4: the first goes alone, the second waits
  EXPECT_EQ(batches_, (Rows{{3}}));
  Enqueue(2);  // 2 + 2 = 4: full
  EXPECT_EQ(batches_, (Rows{{3}, {2, 2}}));
}

TEST_F(BatcherTest, NeverExceedsTheMaximumWhenWorkersFreeUp) {
  Make({.max_batch_rows = 4});
  worker_free_ = false;
  for (int i = 0; i < 10; ++i) Enqueue(1);
  worker_free_ = true;
  batcher_->Poll();
  EXPECT_EQ(batches_, (Rows{{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1}}));
}

TEST_F(BatcherTest, PreferredSizeGoesBeforeTheDelay) {
  Make(
      {.max_batch_rows = 8, .preferred_batch_rows = {2, 6}, .max_queue_delay = microseconds(1000)});
  Enqueue(1);
  EXPECT_TRUE(batches_.empty());
  Enqueue(1);
  EXPECT_EQ(batches_, (Rows{{1, 1}}));
}

TEST_F(BatcherTest, AfterTheDelayTheLargestPreferredPrefixGoesFirst) {
  Make({.max_batch_rows = 8, .preferred_batch_rows = {4}, .max_queue_delay = microseconds(100)});
  worker_free_ = false;  // five queue up while the workers are busy
  for (int i = 0; i < 5; ++i) Enqueue(1);
  worker_free_ = true;
  batcher_->Poll();
  EXPECT_TRUE(batches_.empty());  // 5 is neither full nor preferred: wait for the delay
  clock_.Advance(microseconds(100));
  batcher_->Poll();
  // 4 is preferred; the fifth has waited as long, so it follows alone.
  EXPECT_EQ(batches_, (Rows{{1, 1, 1, 1}, {1}}));
}

TEST_F(BatcherTest, DeadlinePassingInTheQueueAnswersDeadlineExceededAndNeverComputes) {
  Make({.max_batch_rows = 8});
  worker_free_ = false;
  auto r = Request(1);
  r->deadline = clock_.Now() + microseconds(50);
  ASSERT_TRUE(batcher_->Enqueue(r).ok());
  Enqueue(1);  // no deadline
  EXPECT_EQ(batcher_->Poll(), r->deadline);
  clock_.Advance(microseconds(50));
  batcher_->Poll();
  EXPECT_EQ(rejected_, std::vector<absl::StatusCode>{absl::StatusCode::kDeadlineExceeded});
  worker_free_ = true;
  batcher_->Poll();
  EXPECT_EQ(batches_, (Rows{{1}}));  // only the one without a deadline
}

TEST_F(BatcherTest, CancelledCallsLeaveTheQueue) {
  Make({.max_batch_rows = 8});
  worker_free_ = false;
  bool cancelled = false;
  auto r = Request(2);
  r->is_cancelled = [&cancelled] { return cancelled; };
  ASSERT_TRUE(batcher_->Enqueue(r).ok());
  Enqueue(1);
  cancelled = true;
  batcher_->Poll();
  EXPECT_EQ(rejected_, std::vector<absl::StatusCode>{absl::StatusCode::kCancelled});
  EXPECT_EQ(batcher_->queued_requests(), 1u);
  worker_free_ = true;
  batcher_->Poll();
  EXPECT_EQ(batches_, (Rows{{1}}));
}

TEST_F(BatcherTest, CancelTakesAQueuedRequestOutAtOnceWithoutAPoll) {
  Make({.max_batch_rows = 4, .max_queue_delay = microseconds(1000)});
  auto first = Request(1);
  auto second = Request(2);
  ASSERT_TRUE(batcher_->Enqueue(first).ok());
  ASSERT_TRUE(batcher_->Enqueue(second).ok());
  EXPECT_TRUE(batcher_->Cancel(first.get(), absl::CancelledError("cancelled")));
  // Answered by Cancel itself: no clock advance, no Poll.
  EXPECT_EQ(rejected_, std::vector<absl::StatusCode>{absl::StatusCode::kCancelled});
  EXPECT_EQ(batcher_->queued_requests(), 1u);
  // A second cancel, or one of a request that is not queued, does nothing.
  EXPECT_FALSE(batcher_->Cancel(first.get(), absl::CancelledError("again")));
  EXPECT_EQ(rejected_.size(), 1u);
  // The cancelled rows no longer count toward the batch: 2 + 2 fill it.
  Enqueue(2);
  EXPECT_EQ(batches_, (Rows{{2, 2}}));
  EXPECT_FALSE(batcher_->Cancel(second.get(), absl::CancelledError("too late")));
  EXPECT_EQ(rejected_.size(), 1u);
}

TEST_F(BatcherTest, FullQueueRefusesAtOnceAndRecovers) {
  Make({.max_batch_rows = 8, .max_queue_size = 2});
  worker_free_ = false;
  Enqueue(1);
  Enqueue(1);
  absl::Status s = batcher_->Enqueue(Request(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(rejected_.empty());  // the caller answers a refused request
  worker_free_ = true;
  batcher_->Poll();
  EXPECT_EQ(batches_, (Rows{{1, 1}}));
  EXPECT_TRUE(batcher_->Enqueue(Request(1)).ok());
}

TEST_F(BatcherTest, StopRejectsWhatIsQueuedAndRefusesMore) {
  Make({.max_batch_rows = 8});
  worker_free_ = false;
  Enqueue(1);
  batcher_->Stop(absl::UnavailableError("stopping"));
  EXPECT_EQ(rejected_, std::vector<absl::StatusCode>{absl::StatusCode::kUnavailable});
  EXPECT_EQ(batcher_->Enqueue(Request(1)).code(), absl::StatusCode::kUnavailable);
}

TEST(DynamicBatcherCreate, RejectsInconsistentOptions) {
  base::FakeClock clock;
  auto yes = [](bool) { return true; };
  auto sink = [](Batch) {};
  EXPECT_FALSE(
      DynamicBatcher::Create({.max_batch_rows = 4, .preferred_batch_rows = {8}}, &clock, yes, sink)
          .ok());
  EXPECT_FALSE(DynamicBatcher::Create({.max_batch_rows = -1}, &clock, yes, sink).ok());
  EXPECT_FALSE(DynamicBatcher::Create({.max_queue_size = 0}, &clock, yes, sink).ok());
  EXPECT_TRUE(DynamicBatcher::Create({.max_batch_rows = 4}, &clock, yes, sink).ok());
  EXPECT_FALSE(DynamicBatcher::Create({.priority_levels = 0}, &clock, yes, sink).ok());
  EXPECT_FALSE(DynamicBatcher::Create({.priority_levels = 2, .max_priority_wait = microseconds(0)},
                                      &clock, yes, sink)
                   .ok());
}

// Priorities, on a pulled batcher (as the scheduler uses it): requests are
// told apart by an id.
struct Tagged : BatchRequest {
  int id = 0;
};

class PriorityTest : public ::testing::Test {
 protected:
  void Make(DynamicBatcher::Options options) {
    auto b = DynamicBatcher::Create(options, &clock_, nullptr, nullptr);
    ASSERT_TRUE(b.ok()) << b.status();
    batcher_ = *std::move(b);
  }
  void Enqueue(int id, uint64_t priority, int64_t rows = 1) {
    auto r = std::make_shared<Tagged>();
    r->id = id;
    r->rows = rows;
    r->priority = priority;
    ASSERT_TRUE(batcher_->Enqueue(std::move(r)).ok());
  }
  // The ids of the next batch of at most `max_requests` requests and `max_rows` rows.
  std::vector<int> Take(size_t max_requests = 1, int64_t max_rows = 64) {
    std::vector<int> ids;
    for (const auto& r : batcher_->Take(max_requests, max_rows)) {
      ids.push_back(static_cast<const Tagged&>(*r).id);
    }
    return ids;
  }

  base::FakeClock clock_;
  std::unique_ptr<DynamicBatcher> batcher_;
};

TEST_F(PriorityTest, HigherLevelsGoFirstEachInArrivalOrder) {
  Make({.max_batch_rows = 0, .priority_levels = 3});
  Enqueue(1, 2);
  Enqueue(2, 3);
  Enqueue(3, 2);
  Enqueue(4, 1);
  Enqueue(5, 1);
  Enqueue(6, 3);
  std::vector<int> order;
  while (batcher_->queued_requests() > 0) order.push_back(Take().at(0));
  EXPECT_EQ(order, (std::vector<int>{4, 5, 1, 3, 2, 6}));
}

TEST_F(PriorityTest, BatchesFormFromTheHighestNonEmptyLevel) {
  Make({.max_batch_rows = 4, .priority_levels = 2});
  for (int id = 1; id <= 3; ++id) Enqueue(id, 2);
  Enqueue(10, 1, 2);
  Enqueue(11, 1);
  DynamicBatcher::Due due = batcher_->Peek();
  EXPECT_EQ(due.queued_rows, 6);
  EXPECT_EQ(due.requests, 3u);  // 10 (2 rows), 11 and 1 make 4 rows: full
  EXPECT_TRUE(due.full);
  EXPECT_EQ(Take(due.requests, 4), (std::vector<int>{10, 11, 1}));
  EXPECT_EQ(Take(4, 4), (std::vector<int>{2, 3}));
}

TEST_F(PriorityTest, ALowLevelThatWaitedMaxPriorityWaitGoesAheadOfNewerHighOnes) {
  Make({.max_batch_rows = 0, .priority_levels = 2, .max_priority_wait = microseconds(100)});
  Enqueue(1, 2);  // low, at t=0
  clock_.Advance(microseconds(50));
  Enqueue(2, 2);  // low, at t=50
  Enqueue(3, 1);  // high, at t=50
  // Until it has waited 100 us, the low request waits behind the high one.
  EXPECT_EQ(batcher_->NextWake(), clock_.Now() + microseconds(50));
  clock_.Advance(microseconds(49));
  batcher_->DropExpired();
  EXPECT_EQ(Take(), std::vector<int>{3});
  Enqueue(4, 1);                    // high, at t=99
  clock_.Advance(microseconds(1));  // t=100: request 1 has waited max_priority_wait
  Enqueue(5, 1);
  EXPECT_EQ(Take(), std::vector<int>{1});
  EXPECT_EQ(Take(), std::vector<int>{4});
  clock_.Advance(microseconds(50));  // t=150: request 2 too
  EXPECT_EQ(Take(), std::vector<int>{2});
  EXPECT_EQ(Take(), std::vector<int>{5});
}

TEST_F(PriorityTest, CancelAndDeadlinesWorkOnEveryLevel) {
  Make({.max_batch_rows = 0, .priority_levels = 2});
  auto low = std::make_shared<Tagged>();
  low->id = 1;
  low->priority = 2;
  low->deadline = clock_.Now() + microseconds(10);
  ASSERT_TRUE(batcher_->Enqueue(low).ok());
  auto high = std::make_shared<Tagged>();
  high->id = 2;
  high->priority = 1;
  ASSERT_TRUE(batcher_->Enqueue(high).ok());
  Enqueue(3, 2);
  EXPECT_TRUE(batcher_->Cancel(high.get(), absl::CancelledError("gone")));
  clock_.Advance(microseconds(10));
  batcher_->DropExpired();
  EXPECT_EQ(batcher_->queued_requests(), 1u);
  EXPECT_EQ(Take(), std::vector<int>{3});
}

// Requests of a shape-polymorphic model batch together only where their
// dims besides dim 0 are equal (BatchRequest::shape_key: here a sequence
// length). Each batch is recorded as its requests' sequence lengths.
class ShapeBatcherTest : public ::testing::Test {
 protected:
  void Make(DynamicBatcher::Options options, bool pulled = false) {
    auto b = DynamicBatcher::Create(
        options, &clock_, pulled ? DynamicBatcher::CanDispatchFn() : [](bool) { return true; },
        pulled ? DynamicBatcher::DispatchFn()
               : [this](Batch batch) { batches_.push_back(Seqs(batch)); });
    ASSERT_TRUE(b.ok()) << b.status();
    batcher_ = *std::move(b);
  }
  static std::vector<int64_t> Seqs(const Batch& batch) {
    std::vector<int64_t> seqs;
    for (const auto& r : batch) seqs.push_back(r->shape_key.at(1));
    return seqs;
  }
  // A request of one row of a [rows, seq, 8] input: its key is the rank,
  // then the dims besides dim 0.
  void Enqueue(int64_t seq, int64_t rows = 1) {
    auto r = std::make_shared<BatchRequest>();
    r->rows = rows;
    r->shape_key = {3, seq, 8};
    ASSERT_TRUE(batcher_->Enqueue(std::move(r)).ok());
  }

  base::FakeClock clock_;
  std::unique_ptr<DynamicBatcher> batcher_;
  std::vector<std::vector<int64_t>> batches_;
};

TEST_F(ShapeBatcherTest, OnlyRequestsOfOneShapeShareABatchTheOldestShapeFirst) {
  Make({.max_batch_rows = 8, .max_queue_delay = microseconds(100)});
  Enqueue(16);
  Enqueue(32);
  Enqueue(16);
  Enqueue(32);
  Enqueue(64);
  EXPECT_TRUE(batches_.empty());
  clock_.Advance(microseconds(100));
  batcher_->Poll();
  EXPECT_EQ(batches_, (Rows{{16, 16}, {32, 32}, {64}}));
  EXPECT_EQ(batcher_->queued_requests(), 0u);
}

TEST_F(ShapeBatcherTest, AFullBatchOfTheFrontsShapeLeavesTheOtherShapesInPlace) {
  Make({.max_batch_rows = 2, .max_queue_delay = microseconds(100)});
  Enqueue(16);
  Enqueue(32);
  Enqueue(16);  // two rows of seq 16: full, at once
  EXPECT_EQ(batches_, (Rows{{16, 16}}));
  EXPECT_EQ(batcher_->queued_requests(), 1u);
  Enqueue(64);
  Enqueue(64);  // full, but behind the older seq 32
  EXPECT_EQ(batches_, (Rows{{16, 16}}));
  clock_.Advance(microseconds(100));  // the seq 32 request's delay is over
  batcher_->Poll();
  EXPECT_EQ(batches_, (Rows{{16, 16}, {32}, {64, 64}}));
}

TEST_F(ShapeBatcherTest, AShapeNeverWaitsBehindAStreamOfAnother) {
  Make({.max_batch_rows = 4, .max_queue_delay = microseconds(100)});
  Enqueue(32);
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(microseconds(40));
    Enqueue(16);
    Enqueue(16);
  }
  // The seq 32 request waited its delay and goes first, alone; the six
  // seq 16 requests follow in full batches.
  EXPECT_EQ(batches_, (Rows{{32}, {16, 16, 16, 16}}));
  clock_.Advance(microseconds(100));
  batcher_->Poll();
  EXPECT_EQ(batches_, (Rows{{32}, {16, 16, 16, 16}, {16, 16}}));
}

TEST_F(ShapeBatcherTest, TakeFormsTheFrontsShapeOnly) {
  Make({.max_batch_rows = 8}, /*pulled=*/true);
  Enqueue(16);
  Enqueue(32, 2);
  Enqueue(16, 3);
  Enqueue(32);
  Enqueue(16, 5);  // 1 + 3 + 5 rows: over 8
  EXPECT_EQ(Seqs(batcher_->Take(8, 8)), (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(Seqs(batcher_->Take(8, 8)), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(Seqs(batcher_->Take(8, 8)), (std::vector<int64_t>{16}));
  EXPECT_EQ(batcher_->queued_requests(), 0u);
}

TEST_F(ShapeBatcherTest, DueCountsTheFrontsShapeOnly) {
  Make({.max_batch_rows = 2, .max_queue_delay = microseconds(100)}, /*pulled=*/true);
  Enqueue(16);
  Enqueue(32);
  EXPECT_EQ(batcher_->Peek().requests, 0u);  // neither shape is full
  Enqueue(16);
  const DynamicBatcher::Due due = batcher_->Peek();
  EXPECT_EQ(due.requests, 2u);
  EXPECT_TRUE(due.full);
  EXPECT_EQ(due.queued_rows, 3);
}

}  // namespace
}  // namespace numaserve::serving
