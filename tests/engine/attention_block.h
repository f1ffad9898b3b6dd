// Test helper: transformer self-attention for models built with
// OnnxModelBuilder, as PyTorch exports it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine::testing {

// Self-attention of `x` [N, seq, heads * head] written to `out` (same
// shape): Q, K and V projections "proj_{q,k,v}" (weights w{q,k,v}, random
// with seeds 1 to 3), split into heads by Reshape and Transpose
// "heads_{q,k,v}" (k to [N, heads, head, seq]), scores "scores" scaled by
// `scale_op` ("Mul" or "Div") with the scalar `scale` ("scale"), Softmax
// "softmax" over the last axis, context "context", heads merged back by
// Transpose "merge" and Reshape.
inline void AddSelfAttention(OnnxModelBuilder& b, const std::string& x, const std::string& out,
                             int64_t seq, int64_t heads, int64_t head, const std::string& scale_op,
                             float scale) {
  const int64_t hidden = heads * head;
  b.Initializer("scale", kernels::Tensor({}, {scale}))
      .Int64Initializer("heads_shape", {0, seq, heads, head})
      .Int64Initializer("merged_shape", {0, seq, hidden});
  uint32_t seed = 1;
  for (const char* t : {"q", "k", "v"}) {
    const std::string n = t;
    b.Initializer("w" + n, RandomTensor({hidden, hidden}, seed++));
    b.Node("MatMul", {x, "w" + n}, {n + "0"}, "proj_" + n);
    b.Node("Reshape", {n + "0", "heads_shape"}, {n + "1"});
    OnnxModelBuilder::AttrInts(
        b.Node("Transpose", {n + "1"}, {n + "2"}, "heads_" + n), "perm",
        n == "k" ? std::vector<int64_t>{0, 2, 3, 1} : std::vector<int64_t>{0, 2, 1, 3});
  }
  b.Node("MatMul", {"q2", "k2"}, {"s0"}, "scores");
  b.Node(scale_op, {"s0", "scale"}, {"s1"}, "scale");
  OnnxModelBuilder::AttrInt(b.Node("Softmax", {"s1"}, {"p"}, "softmax"), "axis", -1);
  b.Node("MatMul", {"p", "v2"}, {"c0"}, "context");
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"c0"}, {"c1"}, "merge"), "perm", {0, 2, 1, 3});
  b.Node("Reshape", {"c1", "merged_shape"}, {out});
}

}  // namespace numaserve::engine::testing
