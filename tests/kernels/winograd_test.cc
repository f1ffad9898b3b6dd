// The own AVX2 Winograd F(4x4, 3x3) (kernels/cpu/winograd.h) against the
// scalar reference conv: edge tiles, asymmetric and zero padding, output
// channels padded to 16, bias, residual sum, ReLU and a fake-quantize, on
// 1, 2, 3 and 16 threads (a chunk per thread, a team sharing few tiles, and
// the split a 16-core worker makes; more threads than cores still tests
// the split).

#include "kernels/cpu/winograd.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/ref/conv_ref.h"
#include "tests/kernels/test_util.h"

namespace numaserve::kernels::cpu {
namespace {

struct Case {
  std::string name;
  int64_t n, c, k, h, w;
  int64_t pt, pl, pb, pr;
  bool bias, sum, relu;
};

// [N][C][H][W] <-> [N][C/8][H][W][8].
std::vector<float> ToBlocked(const std::vector<float>& x, int64_t n, int64_t c, int64_t hw) {
  std::vector<float> y(x.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t p = 0; p < hw; ++p) {
        y[((i * (c / 8) + ch / 8) * hw + p) * 8 + ch % 8] = x[(i * c + ch) * hw + p];
      }
    }
  }
  return y;
}

std::vector<float> FromBlocked(const std::vector<float>& y, int64_t n, int64_t c, int64_t hw) {
  std::vector<float> x(y.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t p = 0; p < hw; ++p) {
        x[(i * c + ch) * hw + p] = y[((i * (c / 8) + ch / 8) * hw + p) * 8 + ch % 8];
      }
    }
  }
  return x;
}

class WinogradF4x3Test : public ::testing::TestWithParam<std::tuple<Case, int>> {};

TEST_P(WinogradF4x3Test, MatchesTheReferenceConv) {
  if (GetDispatchDecision().max_tier == IsaTier::kScalar) GTEST_SKIP() << "no AVX2 + FMA";
  const Case& t = std::get<0>(GetParam());
  const int threads = std::get<1>(GetParam());
  WinogradConvShape s;
  s.batch = t.n;
  s.in_channels = t.c;
  s.out_channels = t.k;
  s.in_h = t.h;
  s.in_w = t.w;
  s.out_h = t.h + t.pt + t.pb - 2;
  s.out_w = t.w + t.pl + t.pr - 2;
  s.pad_top = t.pt;
  s.pad_left = t.pl;
  const int64_t out_hw = s.out_h * s.out_w;

  Tensor x({t.n, t.c, t.h, t.w}), w({t.k, t.c, 3, 3}), b({t.k});
  x.data = testing::RandomValues(x.size(), 1);
  w.data = testing::RandomValues(w.size(), 2);
  b.data = testing::RandomValues(t.k, 3);
  WindowParams p{{3, 3}, {1, 1}, {1, 1}, {t.pt, t.pl}, {t.pb, t.pr}};
  auto ref = ConvRef(x, w, t.bias ? &b : nullptr, p, 1, {t.n, t.k, s.out_h, s.out_w});
  ASSERT_TRUE(ref.ok()) << ref.status();
  const std::vector<float> residual = testing::RandomValues(t.n * t.k * out_hw, 4);
  std::vector<float> expected = ref->data;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (t.sum) expected[i] += residual[i];
    if (t.relu) expected[i] = std::max(expected[i], 0.0f);
  }

  const WinogradF4x3Weights weights = TransformWinogradF4x3Weights(w.data.data(), t.k, t.c);
  EXPECT_EQ(weights.padded_out_channels % 16, 0);
  const std::vector<float> src = ToBlocked(x.data, t.n, t.c, t.h * t.w);
  // Without a sum, dst starts as NaN: every output must be written.
  std::vector<float> dst =
      t.sum ? ToBlocked(residual, t.n, t.k, out_hw) : std::vector<float>(expected.size(), NAN);
  const WinogradEpilogue e{.bias = t.bias ? b.data.data() : nullptr, .sum = t.sum, .relu = t.relu};
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const WinogradF4x3Plan plan = PlanWinogradF4x3(weights, s);
  std::vector<float> scratch(plan.scratch_floats);
  winograd_f4x3_conv_avx2(weights, s, plan, e, src.data(), dst.data(), scratch.data());
  omp_set_num_threads(saved);
  EXPECT_EQ(plan.threads, threads);
  const std::vector<float> got = FromBlocked(dst, t.n, t.k, out_hw);

  double scale = 0, max_diff = 0;
  size_t worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::fabs(expected[i])));
    const double d = std::fabs(static_cast<double>(got[i]) - expected[i]);
    if (!(d <= max_diff)) {  // NaN counts as the worst
      max_diff = std::isnan(d) ? INFINITY : d;
      worst = i;
    }
  }
  ASSERT_GT(scale, 0.5);
  // F(4x4, 3x3) in FP32 rounds within about 1e-5 of the output's scale for
  // these channel counts; 1e-4 leaves room, and a wrong tap, tile or
  // channel is off by the size of a weight times an input (~0.1-1).
  EXPECT_LT(max_diff, 1e-4 * scale)
      << "at " << worst << ": " << got[worst] << " vs " << expected[worst];
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, WinogradF4x3Test,
    ::testing::Combine(::testing::Values(
                           // name, n, c, k, h, w, pads t l b r, bias, sum, relu
                           Case{"one_tile_exact", 1, 8, 16, 6, 6, 0, 0, 0, 0, false, false, false},
                           Case{"same_pad_edge_tiles", 1, 16, 16, 9, 9, 1, 1, 1, 1, true, false,
                                true},
                           Case{"not_square", 2, 8, 24, 7, 13, 1, 1, 1, 1, true, true, false},
                           Case{"asymmetric_pads", 1, 24, 8, 10, 11, 2, 0, 1, 2, false, true, true},
                           Case{"one_pixel", 3, 8, 8, 1, 1, 1, 1, 1, 1, true, false, false},
                           Case{"many_tiles", 2, 16, 32, 20, 20, 1, 1, 1, 1, true, true, true},
                           Case{"several_chunks", 2, 64, 64, 56, 56, 1, 1, 1, 1, true, false, true},
                           Case{"wide_channels", 1, 256, 40, 7, 7, 1, 1, 1, 1, true, false, false}),
                       ::testing::Values(1, 2, 3, 16)),
    [](const auto& info) {
      return std::get<0>(info.param).name + "_" + std::to_string(std::get<1>(info.param)) +
             "_threads";
    });

// The fake-quantize epilogue (a QuantizeLinear -> DequantizeLinear pair
// folded into the conv) after bias and ReLU: every output is an integer
// multiple of the scale within [lo, hi] steps, equal to the reference
// conv's value quantized the same way, except where that value lies so
// close to a rounding boundary that the Winograd's rounding (within 1e-4 of
// the output's scale) may cross it; there it is one step away.
TEST(WinogradF4x3Test, FakeQuantizeEpilogueMatchesTheQuantizedReference) {
  if (GetDispatchDecision().max_tier == IsaTier::kScalar) GTEST_SKIP() << "no AVX2 + FMA";
  const int64_t n = 2, c = 32, k = 24, h = 14, w = 14;
  WinogradConvShape s;
  s.batch = n;
  s.in_channels = c;
  s.out_channels = k;
  s.in_h = h;
  s.in_w = w;
  s.out_h = h;
  s.out_w = w;
  s.pad_top = 1;
  s.pad_left = 1;
  Tensor x({n, c, h, w}), wt({k, c, 3, 3}), b({k});
  x.data = testing::RandomValues(x.size(), 5);
  wt.data = testing::RandomValues(wt.size(), 6);
  b.data = testing::RandomValues(k, 7);
  WindowParams p{{3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}};
  auto ref = ConvRef(x, wt, &b, p, 1, {n, k, h, w});
  ASSERT_TRUE(ref.ok()) << ref.status();
  double range = 0;
  for (float v : ref->data) range = std::max(range, static_cast<double>(std::fabs(v)));
  ASSERT_GT(range, 0.5);
  // uint8 with zero point 3: [0 - 3, 255 - 3] steps, and a scale that puts
  // the largest outputs beyond hi, so the clamp is exercised too.
  const float scale = static_cast<float>(range / 120.0);
  const WinogradFakeQuantize fq{
      .inverse_scale = 1.0f / scale, .lo = -3.0f, .hi = 100.0f, .scale = scale};
  const WinogradF4x3Weights weights = TransformWinogradF4x3Weights(wt.data.data(), k, c);
  const std::vector<float> src = ToBlocked(x.data, n, c, h * w);
  std::vector<float> dst(ref->data.size(), NAN);
  const WinogradEpilogue e{.bias = b.data.data(), .relu = true, .fake_quantize = &fq};
  const WinogradF4x3Plan plan = PlanWinogradF4x3(weights, s);
  std::vector<float> scratch(plan.scratch_floats);
  winograd_f4x3_conv_avx2(weights, s, plan, e, src.data(), dst.data(), scratch.data());
  const std::vector<float> got = FromBlocked(dst, n, k, h * w);

  int clamped = 0, near_boundary = 0, off_by_one_step = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float relu = std::max(ref->data[i], 0.0f);
    const float steps = relu * fq.inverse_scale;
    const float expected = std::clamp(std::nearbyint(steps), fq.lo, fq.hi) * fq.scale;
    const float got_steps = std::nearbyint(got[i] / fq.scale);
    ASSERT_EQ(got[i], got_steps * fq.scale) << "at " << i << ": not a whole step";
    ASSERT_GE(got_steps, fq.lo) << "at " << i;
    ASSERT_LE(got_steps, fq.hi) << "at " << i;
    if (steps > fq.hi + 1) ++clamped;
    const bool near = std::fabs(steps - std::floor(steps) - 0.5f) < 1e-4 * range / scale;
    if (near) ++near_boundary;
    if (got[i] == expected) continue;
    ASSERT_TRUE(near) << "at " << i << ": " << got[i] << " vs " << expected << " (" << steps
                      << " steps)";
    ASSERT_NEAR(got[i], expected, 1.01 * scale) << "at " << i;
    ++off_by_one_step;
  }
  EXPECT_GT(clamped, 0);
  EXPECT_LE(off_by_one_step, near_boundary);
}

TEST(WinogradF4x3Test, TilesCoverTheOutput) {
  WinogradConvShape s;
  s.batch = 3;
  s.out_h = 7;
  s.out_w = 8;
  EXPECT_EQ(WinogradF4x3Tiles(s), 3 * 2 * 2);
  s.out_w = 9;
  EXPECT_EQ(WinogradF4x3Tiles(s), 3 * 2 * 3);
}

}  // namespace
}  // namespace numaserve::kernels::cpu
