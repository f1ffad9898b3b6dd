// ConvOnednn between blocked activations, on the layouts the caller gave and
// channels-last (src reordered to nhwc, oneDNN's brgemm conv, dst reordered
// back), against the scalar reference: odd extents, asymmetric pads,
// channel counts that are not multiples of 16, several batches through one
// kernel (the channels-last scratch grows and is shared).
#include "kernels/onednn/conv_onednn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/ref/conv_ref.h"
#include "tests/kernels/test_util.h"

namespace numaserve::kernels {
namespace {

using testing::NormalizedError;
using testing::RandomTensor;

struct ConvCase {
  int64_t c, m, h, w, k, stride, pad_begin, pad_end;
  bool bias = true;
  bool relu = true;

  std::string Name() const {
    return absl::StrCat("C", c, "_M", m, "_", h, "x", w, "_k", k, "_s", stride, "_p", pad_begin,
                        pad_end, bias ? "_bias" : "", relu ? "_relu" : "");
  }
  int64_t Out(int64_t extent) const { return (extent + pad_begin + pad_end - k) / stride + 1; }
};

void PrintTo(const ConvCase& c, std::ostream* os) { *os << c.Name(); }

std::string LayoutName(ConvChannelsLast l) {
  return l == ConvChannelsLast::kAuto ? "auto" : l == ConvChannelsLast::kNever ? "never" : "always";
}

class ConvOnednnTest : public ::testing::TestWithParam<std::tuple<ConvCase, ConvChannelsLast>> {
 protected:
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};

  absl::StatusOr<std::unique_ptr<ConvOnednn>> Make(const ConvCase& c, ConvChannelsLast layout,
                                                   const Tensor& w, const Tensor& b) {
    ConvOnednnOptions o;
    o.in_channels = c.c;
    o.out_channels = c.m;
    o.kernel = {c.k, c.k};
    o.strides = {c.stride, c.stride};
    o.dilations = {1, 1};
    o.pads_begin = {c.pad_begin, c.pad_begin};
    o.pads_end = {c.pad_end, c.pad_end};
    o.weights = w.data.data();
    if (c.bias) o.bias = b.data;
    if (c.relu) o.eltwise.push_back({dnnl::algorithm::eltwise_relu, 0.0f, 0.0f});
    o.channels_last = layout;
    return ConvOnednn::Create(engine_, std::move(o));
  }

  // Runs the conv on a plain input through blocked src and dst.
  std::vector<float> RunBlocked(ConvOnednn& conv, ActivationReorder& reorder, const Tensor& x,
                                const Shape& out_shape) {
    std::vector<float> xb(ActivationBytes(x.shape, true) / sizeof(float));
    std::vector<float> yb(ActivationBytes(out_shape, true) / sizeof(float), -3.0f);
    std::vector<float> y(NumElements(out_shape));
    EXPECT_TRUE(reorder.Execute(stream_, x.shape, x.data.data(), false, xb.data(), true).ok());
    absl::Status s = conv.Execute(stream_, x.shape, out_shape, xb.data(), yb.data());
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(reorder.Execute(stream_, out_shape, yb.data(), true, y.data(), false).ok());
    stream_.wait();
    return y;
  }
};

TEST_P(ConvOnednnTest, MatchesTheReferenceOverBatches) {
  const auto& [c, layout] = GetParam();
  const Tensor w = RandomTensor({c.m, c.c, c.k, c.k}, 11);
  const Tensor b = RandomTensor({c.m}, 12);
  auto conv = Make(c, layout, w, b);
  ASSERT_TRUE(conv.ok()) << conv.status();
  ActivationReorder reorder(engine_);
  WindowParams p{
      {c.k, c.k}, {c.stride, c.stride}, {1, 1}, {c.pad_begin, c.pad_begin}, {c.pad_end, c.pad_end}};
  // Small batch first, then a larger one (the scratch grows), then the
  // small one again on its cached primitive.
  for (int64_t n : {1, 3, 1}) {
    const Tensor x = RandomTensor({n, c.c, c.h, c.w}, 20 + static_cast<uint32_t>(n));
    const Shape out_shape{n, c.m, c.Out(c.h), c.Out(c.w)};
    ASSERT_TRUE((*conv)->Prepare(x.shape, out_shape, true, true).ok());
    const std::string impl = (*conv)->ImplementationName(x.shape);
    if (layout == ConvChannelsLast::kNever) {
      EXPECT_EQ(impl.find("nhwc"), std::string::npos);
    }
    auto ref = ConvRef(x, w, c.bias ? &b : nullptr, p, 1, out_shape);
    ASSERT_TRUE(ref.ok()) << ref.status();
    if (c.relu) {
      for (float& v : ref->data) v = std::max(v, 0.0f);
    }
    const std::vector<float> y = RunBlocked(**conv, reorder, x, out_shape);
    EXPECT_LT(NormalizedError(ref->data.data(), y.data(), NumElements(out_shape)), 1e-10)
        << "batch " << n << " on " << impl;
  }
}

const ConvCase kCases[] = {
    {16, 16, 8, 8, 3, 2, 1, 1},
    {5, 7, 9, 11, 3, 2, 1, 1},            // odd everything, C and M not multiples of 16
    {24, 40, 13, 10, 3, 2, 1, 0, false},  // asymmetric pads, no bias
    {20, 33, 7, 7, 3, 2, 0, 2, true, false},
    {32, 48, 15, 15, 3, 1, 1, 1},  // stride 1: auto keeps the blocked kernel
    {3, 16, 17, 17, 7, 2, 3, 3},   // a stem-like 7x7 stride 2
    {64, 64, 14, 14, 3, 2, 1, 1},  // auto: batch 1 7x7 output goes channels-last
};

INSTANTIATE_TEST_SUITE_P(Shapes, ConvOnednnTest,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(ConvChannelsLast::kNever,
                                                              ConvChannelsLast::kAuto,
                                                              ConvChannelsLast::kAlways)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param).Name(), "_",
                                               LayoutName(std::get<1>(info.param)));
                         });

// Which path runs: channels-last only for strided 3x3 convs under kAuto, and
// only where oneDNN has its brgemm kernel (AVX-512).
TEST(ConvOnednnChannelsLastTest, AutoPicksStrideTwoThreeByThreeOnAvx512) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const bool avx512 = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core;
  auto impl_for = [&](int64_t k, int64_t stride, int64_t n, int64_t hw, bool blocked,
                      ConvChannelsLast layout) {
    const Tensor w = RandomTensor({32, 32, k, k}, 5);
    ConvOnednnOptions o;
    o.in_channels = o.out_channels = 32;
    o.kernel = {k, k};
    o.strides = {stride, stride};
    o.dilations = {1, 1};
    o.pads_begin = o.pads_end = {k / 2, k / 2};
    o.weights = w.data.data();
    o.channels_last = layout;
    auto conv = ConvOnednn::Create(engine, std::move(o));
    EXPECT_TRUE(conv.ok());
    const int64_t out = (hw + 2 * (k / 2) - k) / stride + 1;
    const Shape src{n, 32, hw, hw};
    EXPECT_TRUE((*conv)->Prepare(src, {n, 32, out, out}, blocked, blocked).ok());
    return (*conv)->ImplementationName(src);
  };
  const auto nhwc = [](const std::string& impl) { return impl.find("(nhwc") != std::string::npos; };
  EXPECT_EQ(nhwc(impl_for(3, 2, 4, 28, true, ConvChannelsLast::kAuto)), avx512);
  EXPECT_EQ(nhwc(impl_for(3, 2, 1, 14, true, ConvChannelsLast::kAuto)), avx512);
  EXPECT_FALSE(nhwc(impl_for(3, 2, 1, 28, true, ConvChannelsLast::kAuto)));        // batch 1, 14x14
  EXPECT_FALSE(nhwc(impl_for(3, 2, 8, 56, true, ConvChannelsLast::kAuto)));        // batch 8, 28x28
  EXPECT_EQ(nhwc(impl_for(3, 2, 21, 56, true, ConvChannelsLast::kAuto)), avx512);  // 21 x 28x28
  EXPECT_FALSE(nhwc(impl_for(3, 1, 4, 28, true, ConvChannelsLast::kAuto)));
  EXPECT_FALSE(nhwc(impl_for(3, 2, 4, 28, false, ConvChannelsLast::kAuto)));  // plain activations
  EXPECT_FALSE(nhwc(impl_for(3, 2, 4, 28, true, ConvChannelsLast::kNever)));
  EXPECT_EQ(nhwc(impl_for(1, 1, 4, 28, true, ConvChannelsLast::kAlways)), avx512);
}

// Where oneDNN has only its reference kernel for the blocked layouts (a
// grouped conv whose groups are not whole channel blocks; 3 input channels
// blocked), the conv runs elsewhere, reordered, and still computes the
// conv: with a residual sum (dst holds the addend on entry), bias and relu.
struct FallbackCase {
  int64_t c, m, group, k;
  const char* name;
};

class ConvOnednnFallbackTest : public ::testing::TestWithParam<FallbackCase> {};

TEST_P(ConvOnednnFallbackTest, RunsNoReferenceKernelAndMatchesTheReference) {
  const FallbackCase& f = GetParam();
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const Tensor w = RandomTensor({f.m, f.c / f.group, f.k, f.k}, 31);
  const Tensor b = RandomTensor({f.m}, 32);
  ConvOnednnOptions o;
  o.in_channels = f.c;
  o.out_channels = f.m;
  o.group = f.group;
  o.kernel = {f.k, f.k};
  o.strides = {1, 1};
  o.dilations = {1, 1};
  o.pads_begin = o.pads_end = {f.k / 2, f.k / 2};
  o.weights = w.data.data();
  o.bias = b.data;
  o.sum = true;
  o.eltwise.push_back({dnnl::algorithm::eltwise_relu, 0.0f, 0.0f});
  o.name = f.name;
  auto conv = ConvOnednn::Create(engine, std::move(o));
  ASSERT_TRUE(conv.ok()) << conv.status();
  ActivationReorder reorder(engine);
  WindowParams p{{f.k, f.k}, {1, 1}, {1, 1}, {f.k / 2, f.k / 2}, {f.k / 2, f.k / 2}};
  for (int64_t n : {1, 3}) {
    const Tensor x = RandomTensor({n, f.c, 9, 7}, 40 + static_cast<uint32_t>(n));
    const Tensor residual = RandomTensor({n, f.m, 9, 7}, 50 + static_cast<uint32_t>(n));
    const Shape out_shape = residual.shape;
    ASSERT_TRUE((*conv)->Prepare(x.shape, out_shape, true, true).ok());
    const std::string impl = (*conv)->ImplementationName(x.shape);
    EXPECT_FALSE(IsReferenceImplementation(impl)) << impl;
    std::vector<float> xb(ActivationBytes(x.shape, true) / sizeof(float));
    std::vector<float> yb(ActivationBytes(out_shape, true) / sizeof(float));
    std::vector<float> y(NumElements(out_shape));
    ASSERT_TRUE(reorder.Execute(stream, x.shape, x.data.data(), false, xb.data(), true).ok());
    ASSERT_TRUE(
        reorder.Execute(stream, out_shape, residual.data.data(), false, yb.data(), true).ok());
    absl::Status s = (*conv)->Execute(stream, x.shape, out_shape, xb.data(), yb.data());
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(reorder.Execute(stream, out_shape, yb.data(), true, y.data(), false).ok());
    stream.wait();
    auto ref = ConvRef(x, w, &b, p, f.group, out_shape);
    ASSERT_TRUE(ref.ok()) << ref.status();
    for (size_t i = 0; i < ref->data.size(); ++i) {
      ref->data[i] = std::max(ref->data[i] + residual.data[i], 0.0f);
    }
    EXPECT_LT(NormalizedError(ref->data.data(), y.data(), NumElements(out_shape)), 1e-10)
        << "batch " << n << " on " << impl;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvOnednnFallbackTest,
                         ::testing::Values(FallbackCase{24, 24, 2, 3, "grouped_12_per_group"},
                                           FallbackCase{20, 30, 5, 3, "grouped_4_per_group"},
                                           FallbackCase{3, 16, 1, 3, "three_channels_blocked"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace numaserve::kernels
