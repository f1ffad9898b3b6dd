// Test helper: a ResNet bottleneck block for models built with
// OnnxModelBuilder.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine::testing {

// Block k on `in` (ch channels): 1x1 to ch/2 -> Relu -> 3x3 (pad 1) ->
// Relu -> 1x1 with bias back to ch -> Add `in` -> Relu. Names start with
// "b<k>_", weights are random with seeds 10k+1 to 10k+4. Returns the
// block's output name.
inline std::string AddBottleneckBlock(OnnxModelBuilder& b, int k, const std::string& in,
                                      int64_t ch) {
  const std::string p = absl::StrCat("b", k, "_");
  b.Initializer(p + "wa", RandomTensor({ch / 2, ch, 1, 1}, 10 * k + 1));
  b.Initializer(p + "wb", RandomTensor({ch / 2, ch / 2, 3, 3}, 10 * k + 2));
  b.Initializer(p + "wc", RandomTensor({ch, ch / 2, 1, 1}, 10 * k + 3));
  b.Initializer(p + "bc", RandomTensor({ch}, 10 * k + 4));
  b.Node("Conv", {in, p + "wa"}, {p + "a"}, p + "conv_a");
  b.Node("Relu", {p + "a"}, {p + "ra"}, p + "relu_a");
  OnnxModelBuilder::AttrInts(b.Node("Conv", {p + "ra", p + "wb"}, {p + "b"}, p + "conv_b"), "pads",
                             {1, 1, 1, 1});
  b.Node("Relu", {p + "b"}, {p + "rb"}, p + "relu_b");
  b.Node("Conv", {p + "rb", p + "wc", p + "bc"}, {p + "c"}, p + "conv_c");
  b.Node("Add", {p + "c", in}, {p + "s"}, p + "add");
  b.Node("Relu", {p + "s"}, {p + "out"}, p + "relu");
  return p + "out";
}

}  // namespace numaserve::engine::testing
