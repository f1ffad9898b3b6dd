#include "training/batch_prefetcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "training/record_file.h"

namespace numaserve::training {
namespace {

Dataset MakeData(int64_t n) {
  Dataset d;
  d.size = n;
  d.example_dims = {2, 2};
  for (int64_t i = 0; i < n * 4; ++i) d.images.push_back(static_cast<uint8_t>(i % 251));
  for (int64_t i = 0; i < n; ++i) d.labels.push_back(static_cast<uint8_t>(i % 10));
  return d;
}

TEST(BatchPrefetcherTest, SameBatchesAsDirectGatherAcrossEpochsAndJumps) {
  const Dataset data = MakeData(50);  // 6 steps of 8 per epoch
  BatchPrefetcher prefetcher(&data, {.seed = 5, .global_batch = 8, .rank = 1, .ranks = 2});
  for (int64_t step : {0, 1, 2, 5, 6, 7, 13, 3, 4}) {  // epoch boundary, then jumps back
    kernels::Tensor got, want;
    std::vector<uint8_t> got_labels, want_labels;
    ASSERT_TRUE(prefetcher.Get(step, &got, &got_labels).ok());
    const std::vector<int64_t> order = EpochOrder(50, 5, step / 6);
    GatherBatch(data, &order[(step % 6) * 8 + 4], 4, &want, &want_labels);
    EXPECT_EQ(got.shape, want.shape) << "step " << step;
    EXPECT_EQ(got.data, want.data) << "step " << step;
    EXPECT_EQ(got_labels, want_labels) << "step " << step;
  }
}

// Each rank reads from a record file only the records of its own slices of
// the global batches, and gets the batches of the whole-file path.
TEST(BatchPrefetcherTest, RecordFileShardReadsOnlyItsRecordsAndMatchesTheWholeFile) {
  const Dataset data = MakeData(50);  // 6 steps of 8 per epoch
  const std::string path =
      ::testing::TempDir() + "/prefetch_" + std::to_string(getpid()) + ".nsrec";
  ASSERT_TRUE(WriteRecordFile(path, data).ok());
  constexpr int64_t kSteps = 14;  // into the third epoch
  int64_t all_records = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const BatchPrefetcherOptions options = {
        .seed = 5, .global_batch = 8, .rank = rank, .ranks = 2, .total_steps = kSteps};
    absl::StatusOr<std::unique_ptr<RecordFileReader>> reader = RecordFileReader::Open(path, 0);
    ASSERT_TRUE(reader.ok()) << reader.status();
    const RecordFileReader::Stats opened = (*reader)->stats();
    std::multiset<int64_t> own;  // this rank's examples of every step
    {
      BatchPrefetcher from_file(reader->get(), options);
      BatchPrefetcher whole(&data, options);
      for (int64_t step = 0; step < kSteps; ++step) {
        kernels::Tensor got, want;
        std::vector<uint8_t> got_labels, want_labels;
        ASSERT_TRUE(from_file.Get(step, &got, &got_labels).ok());
        ASSERT_TRUE(whole.Get(step, &want, &want_labels).ok());
        EXPECT_EQ(got.shape, want.shape) << "rank " << rank << " step " << step;
        EXPECT_EQ(got.data, want.data) << "rank " << rank << " step " << step;
        EXPECT_EQ(got_labels, want_labels) << "rank " << rank << " step " << step;
        for (int64_t i : from_file.Indices(step)) {
          // The rank's slice: positions [rank * 4, rank * 4 + 4) of the step.
          const std::vector<int64_t> order = EpochOrder(50, 5, step / 6);
          const auto at = std::find(order.begin(), order.end(), i) - order.begin();
          EXPECT_EQ(at / 8, step % 6);
          EXPECT_EQ((at % 8) / 4, rank);
          own.insert(i);
        }
      }
    }  // the prefetchers are done: nothing is read past the last step
    const RecordFileReader::Stats read = (*reader)->stats();
    EXPECT_EQ(read.records - opened.records, static_cast<int64_t>(own.size()));
    EXPECT_EQ(read.records - opened.records, kSteps * 4);
    EXPECT_EQ(read.bytes - opened.bytes, kSteps * 4 * (*reader)->record_bytes());
    all_records += read.records - opened.records;
  }
  // Both ranks together read each step's global batch once: 14 x 8 records
  // where each loading the whole file would read 2 x 50 per epoch.
  EXPECT_EQ(all_records, kSteps * 8);
}

TEST(BatchPrefetcherTest, ReadErrorsComeBackFromGet) {
  const Dataset data = MakeData(16);
  const std::string path =
      ::testing::TempDir() + "/prefetch_err_" + std::to_string(getpid()) + ".nsrec";
  ASSERT_TRUE(WriteRecordFile(path, data).ok());
  absl::StatusOr<std::unique_ptr<RecordFileReader>> reader = RecordFileReader::Open(path, 0);
  ASSERT_TRUE(reader.ok());
  ASSERT_EQ(truncate(path.c_str(), 20), 0);
  BatchPrefetcher prefetcher(reader->get(), {.seed = 1, .global_batch = 8});
  kernels::Tensor batch;
  std::vector<uint8_t> labels;
  absl::Status s = prefetcher.Get(0, &batch, &labels);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path + ": truncated at offset"), std::string::npos) << s;
}

}  // namespace
}  // namespace numaserve::training
