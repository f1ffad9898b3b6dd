#include "training/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

namespace numaserve::training {
namespace {

using kernels::Tensor;

TEST(OptimizerTest, SgdMomentumMatchesHandComputation) {
  OptimizerOptions o;
  o.momentum = 0.5f;
  Optimizer opt(o, {2});
  Tensor w({2}, {1.0f, -1.0f});
  const Tensor g({2}, {0.5f, 1.0f});
  opt.Update(0, 1, 0.1f, &w, g);  // v = g; w -= 0.1 v
  EXPECT_FLOAT_EQ(w.data[0], 0.95f);
  EXPECT_FLOAT_EQ(w.data[1], -1.1f);
  opt.Update(0, 2, 0.1f, &w, g);  // v = 0.5 g + g = 1.5 g
  EXPECT_FLOAT_EQ(w.data[0], 0.95f - 0.075f);
  EXPECT_FLOAT_EQ(w.data[1], -1.1f - 0.15f);
}

TEST(OptimizerTest, NesterovLooksAhead) {
  OptimizerOptions o;
  o.momentum = 0.5f;
  o.nesterov = true;
  Optimizer opt(o, {1});
  Tensor w({1}, {0.0f});
  const Tensor g({1}, {1.0f});
  opt.Update(0, 1, 1.0f, &w, g);  // v = 1; step g + mu v = 1.5
  EXPECT_FLOAT_EQ(w.data[0], -1.5f);
  opt.Update(0, 2, 1.0f, &w, g);  // v = 1.5; step 1 + 0.75
  EXPECT_FLOAT_EQ(w.data[0], -3.25f);
}

TEST(OptimizerTest, SgdWeightDecaySkipsBiases) {
  OptimizerOptions o;
  o.momentum = 0.0f;
  o.weight_decay = 0.1f;
  Optimizer opt(o, {1, 1});
  Tensor weight({1, 1}, {2.0f}), bias({1}, {2.0f});
  const Tensor zero_w({1, 1}, {0.0f}), zero_b({1}, {0.0f});
  opt.Update(0, 1, 1.0f, &weight, zero_w);
  opt.Update(1, 1, 1.0f, &bias, zero_b);
  EXPECT_FLOAT_EQ(weight.data[0], 2.0f - 0.2f);
  EXPECT_FLOAT_EQ(bias.data[0], 2.0f);
}

TEST(OptimizerTest, AdamWFirstStepIsLearningRateTimesSignPlusDecoupledDecay) {
  OptimizerOptions o;
  o.kind = OptimizerOptions::Kind::kAdamW;
  o.weight_decay = 0.01f;
  Optimizer opt(o, {2});
  Tensor w({1, 2}, {1.0f, 1.0f});
  const Tensor g({1, 2}, {3.0f, -0.001f});
  opt.Update(0, 1, 0.1f, &w, g);
  // Bias-corrected m/sqrt(v) = sign(g) on the first step.
  EXPECT_NEAR(w.data[0], 1.0f - 0.1f * (1.0f + 0.01f), 1e-5);
  EXPECT_NEAR(w.data[1], 1.0f - 0.1f * (-1.0f + 0.01f), 1e-4);
  ASSERT_EQ(opt.state().size(), 2u);  // m and v
}

TEST(ScheduleTest, WarmupThenCosine) {
  ScheduleOptions s;
  s.peak_lr = 1.0f;
  s.decay = ScheduleOptions::Decay::kCosine;
  s.warmup_steps = 4;
  s.total_steps = 14;
  s.min_lr = 0.0f;
  EXPECT_FLOAT_EQ(LearningRate(s, 0), 0.25f);
  EXPECT_FLOAT_EQ(LearningRate(s, 3), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(s, 4), 1.0f);
  EXPECT_NEAR(LearningRate(s, 9), 0.5f, 1e-6);
  EXPECT_NEAR(LearningRate(s, 14), 0.0f, 1e-6);
}

TEST(ScheduleTest, StepDecay) {
  ScheduleOptions s;
  s.peak_lr = 1.0f;
  s.decay = ScheduleOptions::Decay::kStep;
  s.step_every = 10;
  s.gamma = 0.5f;
  EXPECT_FLOAT_EQ(LearningRate(s, 9), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(s, 10), 0.5f);
  EXPECT_FLOAT_EQ(LearningRate(s, 25), 0.25f);
}

}  // namespace
}  // namespace numaserve::training
