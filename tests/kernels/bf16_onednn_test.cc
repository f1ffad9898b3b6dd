// BF16 compute (a model's precision "bf16") in the oneDNN kernels: the
// decision whether this process has a native BF16 path (a pure function,
// then the process's own under its ISA cap), and MatMulOnednn / ConvOnednn
// with bf16 set against the FP32 scalar references, within BF16's
// tolerance (inputs rounded to 8 significant bits, FP32 accumulation: the
// largest error below 1% of the largest output) and not bit-equal to FP32
// (so BF16 really ran). The kernel cases are skipped where BF16 is not
// native; ctest's AVX2-tier run (NUMASERVE_MAX_ISA=avx2) checks the
// refusal instead.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "affinity/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/gemm/gemm_backend.h"
#include "kernels/onednn/conv_onednn.h"
#include "kernels/onednn/matmul_onednn.h"
#include "kernels/ref/conv_ref.h"
#include "kernels/ref/gemm_ref.h"
#include "tests/kernels/test_util.h"

namespace numaserve::kernels {
namespace {

using ::testing::HasSubstr;
using testing::NormalizedError;
using testing::RandomTensor;

// The largest |actual - expected| over the largest |expected|.
double RelativeMaxError(const std::vector<float>& expected, const std::vector<float>& actual) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(actual[i]) - expected[i]));
    scale = std::max(scale, std::abs(static_cast<double>(expected[i])));
  }
  return scale == 0 ? err : err / scale;
}

// BF16's tolerance for these sizes (K up to a few hundred, values in [-1, 1)).
constexpr double kBf16Tolerance = 1e-2;

// The process's ISA cap (test_main.cc sets it from NUMASERVE_MAX_ISA).
std::string CapName() { return GetDispatchDecision().cap; }

#define SKIP_WITHOUT_NATIVE_BF16()                                                                 \
  if (!GetBf16Support().native) {                                                                  \
    GTEST_SKIP() << "no native BF16 here: " << GetBf16Support().reason << " (" << IsaDescription() \
                 << ")";                                                                           \
  }

TEST(Bf16DecisionTest, NativeWhereTheCpuAndOnednnHaveIt) {
  const Bf16Support avx512 = DecideBf16(true, false, IsaTier::kAvx512, "", true, false);
  EXPECT_TRUE(avx512.native);
  EXPECT_EQ(avx512.path, "avx512_bf16");
  EXPECT_TRUE(avx512.reason.empty());
  const Bf16Support amx = DecideBf16(true, true, IsaTier::kAvx512, "", true, true);
  EXPECT_TRUE(amx.native);
  EXPECT_EQ(amx.path, "amx_bf16");
  // AMX on the CPU but oneDNN capped below it: its AVX512_BF16 kernels.
  EXPECT_EQ(DecideBf16(true, true, IsaTier::kAvx512, "", true, false).path, "avx512_bf16");
}

TEST(Bf16DecisionTest, RefusedWithTheReason) {
  const Bf16Support none = DecideBf16(false, false, IsaTier::kAvx512, "", false, false);
  EXPECT_FALSE(none.native);
  EXPECT_THAT(none.reason, HasSubstr("neither AVX512_BF16 nor AMX-BF16"));
  EXPECT_THAT(DecideBf16(false, false, IsaTier::kAvx2, "", false, false).reason,
              HasSubstr("neither AVX512_BF16 nor AMX-BF16"));
  // An AVX-512 BF16 CPU capped to AVX2 (an AVX2-only EPYC, emulated).
  const Bf16Support avx2 = DecideBf16(true, false, IsaTier::kAvx2, "avx2", false, false);
  EXPECT_FALSE(avx2.native);
  EXPECT_THAT(avx2.reason, HasSubstr("--max-isa=avx2"));
  // Capped to AVX-512 without BF16: oneDNN would only emulate it.
  const Bf16Support avx512 = DecideBf16(true, false, IsaTier::kAvx512, "avx512", false, false);
  EXPECT_FALSE(avx512.native);
  EXPECT_THAT(avx512.reason, HasSubstr("--max-isa=avx512"));
  EXPECT_THAT(avx512.reason, HasSubstr("emulates"));
  EXPECT_THAT(DecideBf16(true, false, IsaTier::kAvx512, "", false, false).reason,
              HasSubstr("DNNL_MAX_CPU_ISA"));
}

TEST(Bf16DecisionTest, ProcessDecisionFollowsTheCpuAndTheCap) {
  const Bf16Support& s = GetBf16Support();
  const auto& f = affinity::GetCpuFeatures();
  std::cout << "BF16 here: " << (s.native ? "native, " + s.path : "refused: " + s.reason) << " ("
            << IsaDescription() << ")\n";
  if (s.native) {
    EXPECT_TRUE(f.avx512_bf16 || f.amx_bf16);
    EXPECT_EQ(GetDispatchDecision().max_tier, IsaTier::kAvx512);
  } else {
    EXPECT_FALSE(s.reason.empty());
  }
  // ctest's AVX2-tier run of this binary: refused, and says it is the cap.
  if (CapName() == "avx2") {
    EXPECT_FALSE(s.native);
    if (f.avx512_bf16 || f.amx_bf16) {
      EXPECT_THAT(s.reason, HasSubstr("--max-isa=avx2"));
    }
  }
}

TEST(Bf16GemmTest, BlasBackendsRefuseBf16) {
  const Tensor w = RandomTensor({8, 4}, 1);
  GemmOptions o;
  o.k = 8;
  o.n = 4;
  o.weights = w.data.data();
  o.bf16 = true;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  for (GemmBackend b : {GemmBackend::kBlis, GemmBackend::kOpenblas}) {
    auto kernel = CreateGemmKernel(b, o, engine);
    ASSERT_FALSE(kernel.ok()) << GemmBackendName(b);
    EXPECT_THAT(std::string(kernel.status().message()), HasSubstr("no BF16 GEMM"));
  }
}

struct MatMulCase {
  int64_t k, n;
  bool bias, relu, accumulate, src_transposed, weights_transposed;
  std::string Name() const {
    return absl::StrCat("K", k, "_N", n, bias ? "_bias" : "", relu ? "_relu" : "",
                        accumulate ? "_sum" : "", src_transposed ? "_transA" : "",
                        weights_transposed ? "_transB" : "");
  }
};

void PrintTo(const MatMulCase& c, std::ostream* os) { *os << c.Name(); }

class Bf16MatMulTest : public ::testing::TestWithParam<MatMulCase> {};

TEST_P(Bf16MatMulTest, MatchesTheFp32ReferenceWithinBf16Tolerance) {
  SKIP_WITHOUT_NATIVE_BF16();
  const MatMulCase& c = GetParam();
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const Tensor w = c.weights_transposed ? RandomTensor({c.n, c.k}, 3) : RandomTensor({c.k, c.n}, 3);
  const Tensor bias = RandomTensor({c.n}, 4);
  GemmOptions o;
  o.k = c.k;
  o.n = c.n;
  o.weights = w.data.data();
  o.weights_transposed = c.weights_transposed;
  o.src_transposed = c.src_transposed;
  if (c.bias) o.bias = bias.data;
  o.relu = c.relu;
  o.accumulate = c.accumulate;
  o.sum_scale = 0.5f;
  o.bf16 = true;
  auto mm = MatMulOnednn::Create(engine, o);
  ASSERT_TRUE(mm.ok()) << mm.status();
  for (int64_t m : {1, 7, 64, 1}) {
    SCOPED_TRACE(absl::StrCat(c.Name(), " M=", m));
    const Tensor a = c.src_transposed ? RandomTensor({c.k, m}, 10 + static_cast<uint32_t>(m))
                                      : RandomTensor({m, c.k}, 10 + static_cast<uint32_t>(m));
    const Tensor y0 = RandomTensor({m, c.n}, 20 + static_cast<uint32_t>(m));
    GemmAttrs attrs;
    attrs.trans_a = c.src_transposed;
    attrs.trans_b = c.weights_transposed;
    auto ref = GemmRef(a, w, c.bias ? &bias : nullptr, attrs);
    ASSERT_TRUE(ref.ok()) << ref.status();
    for (int64_t i = 0; i < m * c.n; ++i) {
      if (c.accumulate) ref->data[i] += 0.5f * y0.data[i];
      if (c.relu) ref->data[i] = std::max(ref->data[i], 0.0f);
    }
    std::vector<float> y = c.accumulate ? y0.data : std::vector<float>(m * c.n, -7.0f);
    absl::Status s = (*mm)->Execute(stream, m, a.data.data(), y.data());
    ASSERT_TRUE(s.ok()) << s;
    stream.wait();
    EXPECT_LT(RelativeMaxError(ref->data, y), kBf16Tolerance);
    EXPECT_GT(NormalizedError(ref->data.data(), y.data(), m * c.n), 1e-12)
        << "bit-equal to FP32: BF16 did not run";
    const std::string impl = (*mm)->ImplementationName(m);
    EXPECT_THAT(impl, HasSubstr("bf16"));
    EXPECT_FALSE(IsReferenceImplementation(impl)) << impl;
  }
  // The weights are packed as BF16: about half the bytes of FP32's (where
  // the blocks' padding does not dominate).
  if (c.k * c.n >= 65536) {
    EXPECT_LT((*mm)->packed_weight_bytes(), c.k * c.n * 3);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Bf16MatMulTest,
                         ::testing::Values(MatMulCase{784, 256, true, true, false, false, true},
                                           MatMulCase{256, 128, true, false, true, false, false},
                                           MatMulCase{100, 10, false, false, false, true, false},
                                           MatMulCase{768, 3072, true, false, false, false, false},
                                           MatMulCase{33, 17, true, true, true, true, true}),
                         [](const auto& info) { return info.param.Name(); });

struct ConvCase {
  int64_t c, m, h, k, stride, group;
  bool sum;
  ConvChannelsLast layout;
  std::string Name() const {
    return absl::StrCat("C", c, "_M", m, "_", h, "x", h, "_k", k, "_s", stride, "_g", group,
                        sum ? "_sum" : "", layout == ConvChannelsLast::kAlways ? "_nhwc" : "");
  }
};

void PrintTo(const ConvCase& c, std::ostream* os) { *os << c.Name(); }

class Bf16ConvTest : public ::testing::TestWithParam<std::tuple<ConvCase, bool>> {};

// Plain (blocked = false) and blocked activations; the conv's input is
// converted to BF16 into the thread's scratch, its output written FP32.
TEST_P(Bf16ConvTest, MatchesTheFp32ReferenceWithinBf16Tolerance) {
  SKIP_WITHOUT_NATIVE_BF16();
  const auto& [c, blocked] = GetParam();
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const Tensor w = RandomTensor({c.m, c.c / c.group, c.k, c.k}, 5);
  const Tensor b = RandomTensor({c.m}, 6);
  ConvOnednnOptions o;
  o.in_channels = c.c;
  o.out_channels = c.m;
  o.group = c.group;
  o.kernel = {c.k, c.k};
  o.strides = {c.stride, c.stride};
  o.dilations = {1, 1};
  o.pads_begin = o.pads_end = {c.k / 2, c.k / 2};
  o.weights = w.data.data();
  o.bias = b.data;
  o.sum = c.sum;
  o.eltwise.push_back({dnnl::algorithm::eltwise_relu, 0.0f, 0.0f});
  o.channels_last = c.layout;
  o.winograd = true;  // no BF16 Winograd: direct runs
  o.bf16 = true;
  auto conv = ConvOnednn::Create(engine, std::move(o));
  ASSERT_TRUE(conv.ok()) << conv.status();
  ActivationReorder reorder(engine);
  const int64_t out = (c.h + 2 * (c.k / 2) - c.k) / c.stride + 1;
  WindowParams p{{c.k, c.k}, {c.stride, c.stride}, {1, 1}, {c.k / 2, c.k / 2}, {c.k / 2, c.k / 2}};
  for (int64_t n : {1, 4, 1}) {
    SCOPED_TRACE(absl::StrCat(c.Name(), blocked ? " blocked" : " plain", " batch ", n));
    const Tensor x = RandomTensor({n, c.c, c.h, c.h}, 30 + static_cast<uint32_t>(n));
    const Tensor residual = RandomTensor({n, c.m, out, out}, 40 + static_cast<uint32_t>(n));
    const Shape out_shape{n, c.m, out, out};
    ASSERT_TRUE((*conv)->Prepare(x.shape, out_shape, blocked, blocked).ok());
    auto ref = ConvRef(x, w, &b, p, c.group, out_shape);
    ASSERT_TRUE(ref.ok()) << ref.status();
    for (size_t i = 0; i < ref->data.size(); ++i) {
      if (c.sum) ref->data[i] += residual.data[i];
      ref->data[i] = std::max(ref->data[i], 0.0f);
    }
    std::vector<float> xb(ActivationBytes(x.shape, blocked) / sizeof(float));
    std::vector<float> yb(ActivationBytes(out_shape, blocked) / sizeof(float), -3.0f);
    std::vector<float> y(NumElements(out_shape));
    ASSERT_TRUE(reorder.Execute(stream, x.shape, x.data.data(), false, xb.data(), blocked).ok());
    if (c.sum) {
      ASSERT_TRUE(
          reorder.Execute(stream, out_shape, residual.data.data(), false, yb.data(), blocked).ok());
    }
    absl::Status s = (*conv)->Execute(stream, x.shape, out_shape, xb.data(), yb.data());
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(reorder.Execute(stream, out_shape, yb.data(), blocked, y.data(), false).ok());
    stream.wait();
    const std::string impl = (*conv)->ImplementationName(x.shape);
    EXPECT_LT(RelativeMaxError(ref->data, y), kBf16Tolerance) << impl;
    EXPECT_GT(NormalizedError(ref->data.data(), y.data(), NumElements(out_shape)), 1e-12)
        << "bit-equal to FP32: BF16 did not run on " << impl;
    EXPECT_THAT(impl, HasSubstr("bf16"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Bf16ConvTest,
    ::testing::Combine(
        ::testing::Values(ConvCase{16, 32, 14, 3, 1, 1, false, ConvChannelsLast::kNever},
                          ConvCase{32, 64, 9, 1, 1, 1, true, ConvChannelsLast::kNever},
                          ConvCase{3, 16, 17, 7, 2, 1, false, ConvChannelsLast::kNever},
                          ConvCase{64, 64, 14, 3, 2, 1, false, ConvChannelsLast::kAlways},
                          ConvCase{32, 32, 10, 3, 1, 32, false, ConvChannelsLast::kNever},
                          ConvCase{24, 24, 9, 3, 1, 2, true, ConvChannelsLast::kNever},
                          ConvCase{5, 7, 11, 3, 2, 1, false, ConvChannelsLast::kNever}),
        ::testing::Bool()),
    [](const auto& info) {
      return absl::StrCat(std::get<0>(info.param).Name(),
                          std::get<1>(info.param) ? "_blocked" : "_plain");
    });

// A 1x1 conv with the depthwise 3x3 after it fused (MobileNetV2's pair): in
// BF16 the 1x1 output stays BF16 in cache and the depthwise conv reads it.
TEST(Bf16ConvDepthwiseTest, FusedPairMatchesTheReference) {
  SKIP_WITHOUT_NATIVE_BF16();
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const int64_t c = 16, m = 48, h = 12;
  for (int64_t stride : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("depthwise stride ", stride));
    const Tensor w1 = RandomTensor({m, c, 1, 1}, 7), b1 = RandomTensor({m}, 8);
    const Tensor w2 = RandomTensor({m, 1, 3, 3}, 9), b2 = RandomTensor({m}, 10);
    ConvOnednnOptions o;
    o.in_channels = c;
    o.out_channels = m;
    o.kernel = {1, 1};
    o.strides = o.dilations = {1, 1};
    o.pads_begin = o.pads_end = {0, 0};
    o.weights = w1.data.data();
    o.bias = b1.data;
    o.eltwise.push_back({dnnl::algorithm::eltwise_relu, 0.0f, 0.0f});
    DepthwisePostOp dw;
    dw.weights = w2.data;
    dw.bias = b2.data;
    dw.stride = stride;
    o.dw = dw;
    o.bf16 = true;
    auto conv = ConvOnednn::Create(engine, std::move(o));
    ASSERT_TRUE(conv.ok()) << conv.status();
    const int64_t out = (h + 2 - 3) / stride + 1;
    const Tensor x = RandomTensor({2, c, h, h}, 11);
    const Shape out_shape{2, m, out, out};
    absl::Status prepared = (*conv)->Prepare(x.shape, out_shape, true, true);
    ASSERT_TRUE(prepared.ok()) << prepared;
    auto mid = ConvRef(x, w1, &b1, {{1, 1}, {1, 1}, {1, 1}, {0, 0}, {0, 0}}, 1, {2, m, h, h});
    ASSERT_TRUE(mid.ok());
    for (float& v : mid->data) v = std::max(v, 0.0f);
    auto ref =
        ConvRef(*mid, w2, &b2, {{3, 3}, {stride, stride}, {1, 1}, {1, 1}, {1, 1}}, m, out_shape);
    ASSERT_TRUE(ref.ok());
    ActivationReorder reorder(engine);
    std::vector<float> xb(ActivationBytes(x.shape, true) / sizeof(float));
    std::vector<float> yb(ActivationBytes(out_shape, true) / sizeof(float));
    std::vector<float> y(NumElements(out_shape));
    ASSERT_TRUE(reorder.Execute(stream, x.shape, x.data.data(), false, xb.data(), true).ok());
    absl::Status s = (*conv)->Execute(stream, x.shape, out_shape, xb.data(), yb.data());
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(reorder.Execute(stream, out_shape, yb.data(), true, y.data(), false).ok());
    stream.wait();
    const std::string impl = (*conv)->ImplementationName(x.shape);
    EXPECT_LT(RelativeMaxError(ref->data, y), kBf16Tolerance) << impl;
    EXPECT_THAT(impl, HasSubstr("bf16"));
    EXPECT_FALSE(IsReferenceImplementation(impl)) << impl;
  }
}

}  // namespace
}  // namespace numaserve::kernels
