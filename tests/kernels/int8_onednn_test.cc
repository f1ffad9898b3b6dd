// INT8 compute (Int8Params) in the oneDNN kernels: QuantizeToU8 against ONNX
// QuantizeLinear's rounding, and ConvOnednn / MatMulOnednn with int8 set
// against an FP64 reference on the dequantized input and weights, within
// float rounding (the int8 kernels accumulate exactly in int32). Runs under
// every ISA tier: without VNNI (ctest's NUMASERVE_MAX_ISA=avx2 run) the
// weights are split so that oneDNN's int16 pair sums cannot saturate, which
// the full-range cases (u8 255 x s8 127) check. Each kernel must be a jit
// one, not oneDNN's reference.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/dispatch.h"
#include "kernels/gemm/gemm_backend.h"
#include "kernels/onednn/conv_onednn.h"
#include "kernels/onednn/int8_params.h"
#include "kernels/onednn/matmul_onednn.h"
#include "tests/kernels/test_util.h"

namespace numaserve::kernels {
namespace {

using ::testing::HasSubstr;
using testing::RandomValues;

// ONNX QuantizeLinear, written out: x / scale, round half to even, + zero
// point, saturate.
uint8_t QuantizeOne(float x, float scale, int32_t zero_point) {
  const float v = std::nearbyint(x / scale);
  return static_cast<uint8_t>(std::clamp(static_cast<float>(zero_point) + v, 0.0f, 255.0f));
}

// x quantized and dequantized, in double: the values the int8 kernel sees.
std::vector<double> Dequantized(const std::vector<float>& x, float scale, int32_t zero_point) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = (static_cast<double>(QuantizeOne(x[i], scale, zero_point)) - zero_point) * scale;
  }
  return out;
}

// Int8 weights over the whole range, the extremes included.
std::vector<int8_t> RandomInt8(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-128, 127);
  std::vector<int8_t> w(n);
  for (int8_t& v : w) v = static_cast<int8_t>(dist(rng));
  if (n > 1) {
    w[0] = 127;
    w[1] = -128;
  }
  return w;
}

std::vector<float> WeightScales(int64_t channels, bool per_channel) {
  if (!per_channel) return {0.011f};
  std::vector<float> s(channels);
  for (int64_t c = 0; c < channels; ++c) s[c] = 0.004f + 0.001f * static_cast<float>(c % 7);
  return s;
}

// |actual - expected| within float rounding of the int32 result, its
// scaling and the FP32 bias / residual: relative 1e-5 plus 1e-6 of the
// largest output.
void ExpectClose(const std::vector<double>& expected, const std::vector<float>& actual,
                 const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  double largest = 0;
  for (double e : expected) largest = std::max(largest, std::abs(e));
  int bad = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double tolerance = 1e-5 * std::abs(expected[i]) + 1e-6 * (largest + 1e-3);
    if (!(std::abs(actual[i] - expected[i]) <= tolerance) && ++bad <= 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << actual[i] << ", expected "
                    << expected[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << expected.size() << " elements off";
}

TEST(QuantizeToU8Test, RoundsHalfToEvenBeforeTheZeroPointAndSaturates) {
  const float scale = 1.0f / 64;  // ties exact
  const std::vector<float> halves = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 3.49f, 3.51f, 0.0f};
  for (int32_t zp : {0, 3, 128, 255}) {
    std::vector<float> x;
    for (float h : halves) x.push_back(h * scale);
    for (float big : {1e9f, -1e9f, 300.0f, -300.0f, std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      x.push_back(big);
    }
    // The vector body and the scalar tail both: 16 + 21 values.
    const std::vector<float> more = RandomValues(23, 7);
    for (float v : more) x.push_back(v * 200 * scale);
    std::vector<uint8_t> q(x.size(), 77);
    QuantizeToU8(x.data(), static_cast<int64_t>(x.size()), scale, zp, q.data());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(q[i], QuantizeOne(x[i], scale, zp)) << "x=" << x[i] << " zp=" << zp;
    }
    // ONNX: round(0.5) = 0, then the zero point (oneDNN's reorder gives 4 for zp 3).
    EXPECT_EQ(q[0], std::clamp(zp, 0, 255));
    EXPECT_EQ(q[1], std::clamp(zp + 2, 0, 255));
    EXPECT_EQ(q[2], std::clamp(zp + 2, 0, 255));
  }
  std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN()};
  uint8_t q = 9;
  QuantizeToU8(nan.data(), 1, 0.1f, 10, &q);
  EXPECT_EQ(q, 0);
}

TEST(Int8ProductsTest, SaysWhetherOnednnHasVnniHere) {
  std::cout << "int8 products exact in one pass: "
            << (OnednnInt8ProductsExact() ? "yes (VNNI)" : "no (weights split)") << " ("
            << IsaDescription() << ")\n";
  std::vector<int8_t> hi, lo;
  const std::vector<int8_t> w = {127, -128, -127, 64, -64, 65, -65, 0, 1, -1};
  if (OnednnInt8ProductsExact()) {
    EXPECT_FALSE(SplitInt8Weights(w, &hi, &lo));
    return;
  }
  ASSERT_TRUE(SplitInt8Weights(w, &hi, &lo));
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(hi[i] + lo[i], w[i]);
    EXPECT_LE(std::abs(hi[i]), 64);
    EXPECT_LE(std::abs(lo[i]), 64);
  }
  EXPECT_FALSE(SplitInt8Weights({64, -64, 3}, &hi, &lo)) << "no pair can saturate";
}

// ---- Conv ----

struct ConvCase {
  int64_t n, c, h, w, m, group, k, stride, pad;
  bool blocked, bias, sum, relu;
  int32_t zp;
  bool per_channel;
  std::string Name() const {
    return absl::StrCat("N", n, "_C", c, "_", h, "x", w, "_M", m, "_g", group, "_k", k, "_s",
                        stride, "_p", pad, blocked ? "_blocked" : "_plain", bias ? "_bias" : "",
                        sum ? "_sum" : "", relu ? "_relu" : "", "_zp", zp,
                        per_channel ? "_perchannel" : "_pertensor");
  }
};

void PrintTo(const ConvCase& c, std::ostream* os) { *os << c.Name(); }

// Conv2D on dequantized values in FP64, then bias, residual and relu.
std::vector<double> ConvReference(const ConvCase& c, const std::vector<double>& x,
                                  const std::vector<double>& w, const std::vector<float>& bias,
                                  const std::vector<float>& residual, int64_t oh, int64_t ow) {
  const int64_t icg = c.c / c.group, ocg = c.m / c.group;
  std::vector<double> y(c.n * c.m * oh * ow);
  for (int64_t n = 0; n < c.n; ++n) {
    for (int64_t m = 0; m < c.m; ++m) {
      const int64_t g = m / ocg;
      for (int64_t oy = 0; oy < oh; ++oy) {
        for (int64_t ox = 0; ox < ow; ++ox) {
          double acc = c.bias ? bias[m] : 0.0;
          for (int64_t ic = 0; ic < icg; ++ic) {
            for (int64_t ky = 0; ky < c.k; ++ky) {
              for (int64_t kx = 0; kx < c.k; ++kx) {
                const int64_t iy = oy * c.stride - c.pad + ky, ix = ox * c.stride - c.pad + kx;
                if (iy < 0 || iy >= c.h || ix < 0 || ix >= c.w) continue;  // zero in real values
                acc += x[((n * c.c + g * icg + ic) * c.h + iy) * c.w + ix] *
                       w[((m * icg + ic) * c.k + ky) * c.k + kx];
              }
            }
          }
          const int64_t i = ((n * c.m + m) * oh + oy) * ow + ox;
          if (c.sum) acc += residual[i];
          if (c.relu) acc = std::max(acc, 0.0);
          y[i] = acc;
        }
      }
    }
  }
  return y;
}

void RunConvCase(const ConvCase& c, const std::vector<float>& x, const std::vector<int8_t>& qw) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const int64_t oh = (c.h + 2 * c.pad - c.k) / c.stride + 1,
                ow = (c.w + 2 * c.pad - c.k) / c.stride + 1;
  const Shape x_shape = {c.n, c.c, c.h, c.w}, y_shape = {c.n, c.m, oh, ow};
  ConvOnednnOptions o;
  o.in_channels = c.c;
  o.out_channels = c.m;
  o.group = c.group;
  o.kernel = {c.k, c.k};
  o.strides = {c.stride, c.stride};
  o.dilations = {1, 1};
  o.pads_begin = {c.pad, c.pad};
  o.pads_end = {c.pad, c.pad};
  const std::vector<float> bias = RandomValues(c.m, 5);
  if (c.bias) o.bias = bias;
  o.sum = c.sum;
  if (c.relu) o.eltwise.push_back(EltwisePostOp{});
  Int8Params q;
  q.src_scale = 2.0f / 255;
  q.src_zero_point = c.zp;
  q.weight_scales = WeightScales(c.m, c.per_channel);
  q.weights = qw;
  o.int8 = q;
  o.name = c.Name();
  auto conv = ConvOnednn::Create(engine, o);
  ASSERT_TRUE(conv.ok()) << conv.status();

  std::vector<double> wd(qw.size());
  const int64_t per_m = static_cast<int64_t>(qw.size()) / c.m;
  for (size_t i = 0; i < qw.size(); ++i) {
    const int64_t m = static_cast<int64_t>(i) / per_m;
    wd[i] = static_cast<double>(qw[i]) * q.weight_scales[c.per_channel ? m : 0];
  }
  const std::vector<float> residual = RandomValues(NumElements(y_shape), 6);
  const std::vector<double> expected =
      ConvReference(c, Dequantized(x, q.src_scale, q.src_zero_point), wd, bias, residual, oh, ow);

  ActivationReorder reorder(engine);
  std::vector<float> xb(ActivationBytes(x_shape, c.blocked) / sizeof(float));
  std::vector<float> yb(ActivationBytes(y_shape, c.blocked) / sizeof(float), -7.0f);
  std::vector<float> y(NumElements(y_shape));
  {
    const absl::Status prepared = (*conv)->Prepare(x_shape, y_shape, c.blocked, c.blocked);
    ASSERT_TRUE(prepared.ok()) << prepared;
  }
  // Twice: the second run reuses the primitive, the scratch and the weights.
  for (int run = 0; run < 2; ++run) {
    ASSERT_TRUE(reorder.Execute(stream, x_shape, x.data(), false, xb.data(), c.blocked).ok());
    if (c.sum) {
      ASSERT_TRUE(
          reorder.Execute(stream, y_shape, residual.data(), false, yb.data(), c.blocked).ok());
    }
    absl::Status s = (*conv)->Execute(stream, x_shape, y_shape, xb.data(), yb.data());
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(reorder.Execute(stream, y_shape, yb.data(), c.blocked, y.data(), false).ok());
    stream.wait();
    ExpectClose(expected, y, absl::StrCat(c.Name(), " run ", run));
  }
  const std::string impl = (*conv)->ImplementationName(x_shape);
  std::cout << c.Name() << ": " << impl << "\n";
  EXPECT_THAT(impl, HasSubstr("int8"));
  // oneDNN 2.6 has no AVX2 int8 kernel for a grouped conv whose groups are
  // not whole 8-channel blocks (and not depthwise): its reference runs
  // there, said on stderr.
  const bool avx2_gap = ActivationChannelBlock() == 8 && c.group > 1 && c.group != c.c &&
                        ((c.c / c.group) % 8 != 0 || (c.m / c.group) % 8 != 0);
  EXPECT_EQ(IsReferenceImplementation(impl), avx2_gap) << impl;
}

class Int8ConvTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Int8ConvTest, MatchesFp64OnDequantizedValues) {
  const ConvCase& c = GetParam();
  // Beyond the representable range on both sides (saturation) at zp 128;
  // negatives clamp to 0 at zp 0.
  std::vector<float> x = RandomValues(c.n * c.c * c.h * c.w, 11);
  for (float& v : x) v *= 1.3f;
  RunConvCase(c, x, RandomInt8(c.m * (c.c / c.group) * c.k * c.k, 12));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Int8ConvTest,
    ::testing::Values(
        // n, c, h, w, m, group, k, stride, pad, blocked, bias, sum, relu, zp, per_channel
        ConvCase{1, 16, 9, 9, 32, 1, 3, 1, 1, false, true, false, false, 0, false},
        ConvCase{1, 16, 9, 9, 32, 1, 3, 1, 1, false, true, false, false, 128, true},
        ConvCase{2, 16, 9, 9, 32, 1, 3, 1, 1, true, true, true, true, 128, true},
        ConvCase{2, 32, 8, 8, 16, 1, 1, 1, 0, true, false, true, false, 37, false},
        ConvCase{3, 8, 11, 7, 24, 1, 3, 2, 1, false, true, false, true, 200, true},
        ConvCase{2, 32, 10, 10, 64, 1, 3, 2, 1, true, true, false, true, 3, true},
        ConvCase{1, 3, 16, 16, 16, 1, 7, 2, 3, false, true, false, true, 128, true},
        ConvCase{2, 32, 9, 9, 32, 4, 3, 1, 1, true, true, true, false, 128, true},
        ConvCase{2, 12, 9, 9, 18, 3, 3, 1, 1, false, true, false, true, 90, false},
        ConvCase{2, 32, 9, 9, 32, 32, 3, 1, 1, true, true, false, true, 128, true},
        ConvCase{1, 24, 10, 10, 24, 24, 3, 2, 1, false, true, true, true, 0, true},
        ConvCase{1, 16, 5, 5, 16, 1, 5, 1, 2, true, false, false, false, 255, false}),
    [](const auto& info) { return info.param.Name(); });

// oneDNN 2.6's int8 depthwise kernel adds some rows twice when a padded
// conv with a sum post-op (a residual, or the second pass of split
// weights) is split over 8 or more threads; ConvOnednn pads those convs
// itself. The shapes and thread counts where it showed (more threads than
// cores still split the work the same way), with and without a residual.
TEST(Int8ConvTest, DepthwiseWithASumIsRightOnManyThreads) {
  const int saved = omp_get_max_threads();
  for (int threads : {8, 16, 24}) {
    omp_set_num_threads(threads);
    for (const auto& [c, hw, stride, sum, zp] :
         std::vector<std::tuple<int64_t, int64_t, int64_t, bool, int32_t>>{
             {32, 9, 1, false, 128},
             {24, 11, 1, true, 128},
             {48, 10, 1, true, 0},
             {16, 13, 1, false, 3},
             {64, 13, 2, true, 128}}) {
      SCOPED_TRACE(absl::StrCat(threads, " threads"));
      const ConvCase k{1, c, hw, hw, c, c, 3, stride, 1, true, true, sum, true, zp, true};
      std::vector<float> x = RandomValues(k.n * k.c * k.h * k.w, 13);
      RunConvCase(k, x, RandomInt8(k.m * k.k * k.k, 14));
    }
  }
  omp_set_num_threads(saved);
}

// u8 255 x s8 127 over 64 channels: oneDNN's int16 pair sums would saturate
// without VNNI unless the weights are split.
TEST(Int8ConvTest, FullRangeProductsAreExact) {
  const ConvCase c{1, 64, 4, 4, 16, 1, 1, 1, 0, false, true, false, false, 0, false};
  std::vector<float> x(c.c * c.h * c.w, 10.0f);  // saturates to 255
  std::vector<int8_t> w(c.m * c.c, 127);
  for (size_t i = 1; i < w.size(); i += 5) w[i] = -128;
  RunConvCase(c, x, w);
}

TEST(Int8ConvTest, RefusesWhatItDoesNotDo) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  ConvOnednnOptions o;
  o.in_channels = 4;
  o.out_channels = 4;
  o.kernel = {1, 1};
  o.strides = {1, 1};
  o.dilations = {1, 1};
  o.pads_begin = {0, 0};
  o.pads_end = {0, 0};
  Int8Params q;
  q.weight_scales = {0.1f};
  q.weights = std::vector<int8_t>(16, 1);
  o.int8 = q;
  EXPECT_TRUE(ConvOnednn::Create(engine, o).ok());
  ConvOnednnOptions bf16 = o;
  bf16.bf16 = true;
  EXPECT_EQ(ConvOnednn::Create(engine, bf16).status().code(), absl::StatusCode::kInvalidArgument);
  ConvOnednnOptions transposed = o;
  transposed.transposed = true;
  EXPECT_EQ(ConvOnednn::Create(engine, transposed).status().code(),
            absl::StatusCode::kInvalidArgument);
  ConvOnednnOptions dw = o;
  dw.dw = DepthwisePostOp{std::vector<float>(36, 0.1f), std::vector<float>(4, 0.0f), 1, {}};
  EXPECT_EQ(ConvOnednn::Create(engine, dw).status().code(), absl::StatusCode::kInvalidArgument);
  ConvOnednnOptions bad_scales = o;
  bad_scales.int8->weight_scales = {0.1f, 0.2f};
  EXPECT_THAT(std::string(ConvOnednn::Create(engine, bad_scales).status().message()),
              HasSubstr("weight_scales"));
  ConvOnednnOptions bad_zp = o;
  bad_zp.int8->src_zero_point = 256;
  EXPECT_FALSE(ConvOnednn::Create(engine, bad_zp).ok());
  ConvOnednnOptions bad_count = o;
  bad_count.int8->weights.pop_back();
  EXPECT_FALSE(ConvOnednn::Create(engine, bad_count).ok());
}

// ---- GEMM ----

struct GemmCase {
  int64_t k, n;
  bool bias, relu, accumulate, src_transposed, weights_transposed;
  float alpha;
  int32_t zp;
  bool per_channel;
  std::string Name() const {
    return absl::StrCat("K", k, "_N", n, bias ? "_bias" : "", relu ? "_relu" : "",
                        accumulate ? "_sum" : "", src_transposed ? "_transA" : "",
                        weights_transposed ? "_transB" : "", alpha != 1.0f ? "_alpha" : "", "_zp",
                        zp, per_channel ? "_perchannel" : "_pertensor");
  }
};

void PrintTo(const GemmCase& c, std::ostream* os) { *os << c.Name(); }

void RunGemmCase(const GemmCase& c, const std::vector<int8_t>& qw, float x_gain,
                 const std::vector<int64_t>& ms) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const std::vector<float> bias = RandomValues(c.n, 4);
  GemmOptions o;
  o.k = c.k;
  o.n = c.n;
  o.weights_transposed = c.weights_transposed;
  o.weights_scale = c.alpha;
  o.src_transposed = c.src_transposed;
  if (c.bias) o.bias = bias;
  o.relu = c.relu;
  o.accumulate = c.accumulate;
  o.sum_scale = 0.5f;
  Int8Params q;
  q.src_scale = 1.0f / 100;
  q.src_zero_point = c.zp;
  q.weight_scales = WeightScales(c.n, c.per_channel);
  q.weights = qw;
  o.int8 = q;
  auto kernel = CreateGemmKernel(GemmBackend::kOnednn, o, engine);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_TRUE((*kernel)->options().int8->weights.empty()) << "kept after packing";
  // W as [K, N] in double.
  std::vector<double> w(c.k * c.n);
  for (int64_t kk = 0; kk < c.k; ++kk) {
    for (int64_t nn = 0; nn < c.n; ++nn) {
      const int8_t v = c.weights_transposed ? qw[nn * c.k + kk] : qw[kk * c.n + nn];
      w[kk * c.n + nn] = static_cast<double>(v) * q.weight_scales[c.per_channel ? nn : 0] * c.alpha;
    }
  }
  for (int64_t m : ms) {
    const std::string name = absl::StrCat(c.Name(), " M=", m);
    std::vector<float> a = RandomValues(m * c.k, 10 + static_cast<uint32_t>(m));
    for (float& v : a) v *= x_gain;
    const std::vector<double> ad = Dequantized(a, q.src_scale, q.src_zero_point);
    const std::vector<float> y0 = RandomValues(m * c.n, 20 + static_cast<uint32_t>(m));
    std::vector<double> expected(m * c.n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double acc = c.bias ? bias[j] : 0.0;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          acc += ad[c.src_transposed ? kk * m + i : i * c.k + kk] * w[kk * c.n + j];
        }
        if (c.accumulate) acc += 0.5 * y0[i * c.n + j];
        if (c.relu) acc = std::max(acc, 0.0);
        expected[i * c.n + j] = acc;
      }
    }
    std::vector<float> y = c.accumulate ? y0 : std::vector<float>(m * c.n, -7.0f);
    absl::Status s = (*kernel)->Run(m, a.data(), y.data());
    ASSERT_TRUE(s.ok()) << s;
    ExpectClose(expected, y, name);
    const std::string impl = (*kernel)->ImplementationName(m);
    std::cout << name << ": " << impl << "\n";
    EXPECT_THAT(impl, HasSubstr("int8"));
    EXPECT_FALSE(IsReferenceImplementation(impl)) << impl;
  }
}

class Int8GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(Int8GemmTest, MatchesFp64OnDequantizedValues) {
  const GemmCase& c = GetParam();
  RunGemmCase(c, RandomInt8(c.k * c.n, 3), 1.5f, {1, 7, 64, 1});
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int8GemmTest,
                         ::testing::Values(
                             // k, n, bias, relu, accumulate, transA, transB, alpha, zp, per_channel
                             GemmCase{256, 128, true, false, false, false, false, 1.0f, 0, false},
                             GemmCase{256, 128, true, true, false, false, false, 1.0f, 128, true},
                             GemmCase{784, 256, true, true, false, false, true, 1.0f, 128, true},
                             GemmCase{100, 10, false, false, true, true, false, 1.0f, 3, false},
                             GemmCase{33, 17, true, true, true, true, true, 0.5f, 200, true},
                             GemmCase{768, 512, true, false, true, false, false, 2.0f, 127, true}),
                         [](const auto& info) { return info.param.Name(); });

TEST(Int8GemmTest, FullRangeProductsAreExact) {
  const GemmCase c{256, 64, true, false, false, false, false, 1.0f, 0, false};
  std::vector<int8_t> w(c.k * c.n, 127);
  for (size_t i = 3; i < w.size(); i += 7) w[i] = -128;
  RunGemmCase(c, w, 100.0f, {4});  // A saturates to 255 (and 0)
}

TEST(Int8GemmTest, RefusedWhereItCannotRun) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  GemmOptions o;
  o.k = 8;
  o.n = 4;
  Int8Params q;
  q.weight_scales = {0.1f};
  q.weights = std::vector<int8_t>(32, 1);
  o.int8 = q;
  for (GemmBackend b : {GemmBackend::kBlis, GemmBackend::kOpenblas}) {
    auto kernel = CreateGemmKernel(b, o, engine);
    ASSERT_FALSE(kernel.ok()) << GemmBackendName(b);
    EXPECT_THAT(std::string(kernel.status().message()), HasSubstr("no INT8 GEMM"));
  }
  GemmOptions bf16 = o;
  bf16.bf16 = true;
  EXPECT_EQ(MatMulOnednn::Create(engine, bf16).status().code(), absl::StatusCode::kInvalidArgument);
  GemmOptions per_row = o;
  per_row.int8->weight_scales = std::vector<float>(8, 0.1f);  // K values, not N
  EXPECT_FALSE(MatMulOnednn::Create(engine, per_row).ok());
  GemmOptions zero_alpha = o;
  zero_alpha.weights_scale = 0.0f;
  EXPECT_FALSE(MatMulOnednn::Create(engine, zero_alpha).ok());
  EXPECT_TRUE(MatMulOnednn::Create(engine, o).ok());
}

}  // namespace
}  // namespace numaserve::kernels
