#include "serving/observability/model_statistics.h"

#include <gtest/gtest.h>

namespace numaserve::serving {
namespace {

TEST(ModelStatisticsTest, AccumulatesPerVersionAndBatchSize) {
  ModelStatistics stats;
  stats.Register("mlp", 1);
  stats.Register("cnn", 2);
  stats.RecordSuccess("mlp", 1, 3, 0.004, 0.001, 0.0001, 0.002, 0.0002);
  stats.RecordSuccess("mlp", 1, 1, 0.002, 0.001, 0.0001, 0.002, 0.0002);
  stats.RecordFailure("mlp", 1, 0.0005);
  stats.RecordExecution("mlp", 1, 4, 0.0001, 0.002, 0.0003);

  inference::ModelStatisticsResponse all;
  stats.Fill("", 0, &all);
  ASSERT_EQ(all.model_stats_size(), 2);  // cnn (registered, zeros) and mlp
  EXPECT_EQ(all.model_stats(0).name(), "cnn");
  EXPECT_EQ(all.model_stats(0).inference_count(), 0u);

  inference::ModelStatisticsResponse one;
  stats.Fill("mlp", 1, &one);
  ASSERT_EQ(one.model_stats_size(), 1);
  const auto& m = one.model_stats(0);
  EXPECT_EQ(m.version(), "1");
  EXPECT_EQ(m.inference_count(), 4u);
  EXPECT_EQ(m.execution_count(), 1u);
  EXPECT_GT(m.last_inference(), 0u);
  EXPECT_EQ(m.inference_stats().success().count(), 2u);
  EXPECT_EQ(m.inference_stats().success().ns(), 6000000u);
  EXPECT_EQ(m.inference_stats().fail().count(), 1u);
  EXPECT_EQ(m.inference_stats().fail().ns(), 500000u);
  EXPECT_EQ(m.inference_stats().queue().ns(), 2000000u);
  ASSERT_EQ(m.batch_stats_size(), 1);
  EXPECT_EQ(m.batch_stats(0).batch_size(), 4u);
  EXPECT_EQ(m.batch_stats(0).compute_infer().count(), 1u);
  EXPECT_EQ(m.batch_stats(0).compute_infer().ns(), 2000000u);

  inference::ModelStatisticsResponse none;
  stats.Fill("mlp", 2, &none);
  EXPECT_EQ(none.model_stats_size(), 0);
}

}  // namespace
}  // namespace numaserve::serving
