// Hostile inputs to the importer and the shape arithmetic: dims that are
// negative, huge or whose product overflows int64, initializers claiming
// more elements than they hold, and node attributes (pads, repeats, target
// shapes, scales, strides) chosen to overflow, and constant folding made
// to compute gigabytes from a few hundred bytes. Every one is an error
// naming the initializer, input or node; none is an allocation, a wrapped
// shape or a crash.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "engine/import/constant_folding.h"
#include "engine/import/onnx_import.h"
#include "engine/ir/graph.h"
#include "engine/ops/shape_propagation.h"
#include "kernels/shape_ops.h"
#include "kernels/tensor.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using testing::kUnknownDim;
using testing::OnnxModelBuilder;

constexpr int64_t kMax = kernels::kMaxTensorElements;
constexpr int64_t k2To40 = int64_t{1} << 40;
constexpr int64_t k2To32 = int64_t{1} << 32;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// --- Checked arithmetic --------------------------------------------------------------

TEST(CheckedArithmeticTest, MulAndAddReportOverflow) {
  EXPECT_EQ(*kernels::CheckedMul(3, 4), 12);
  EXPECT_EQ(*kernels::CheckedMul(-3, 4), -12);
  EXPECT_EQ(kernels::CheckedMul(kInt64Max, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(kernels::CheckedMul(k2To32, k2To32).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(kernels::CheckedMul(kInt64Min, -1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*kernels::CheckedAdd(kInt64Max - 1, 1), kInt64Max);
  EXPECT_EQ(kernels::CheckedAdd(kInt64Max, 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(kernels::CheckedAdd(kInt64Min, -1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(CheckedArithmeticTest, NumElementsCheckedRefusesWhatNumElementsWraps) {
  EXPECT_EQ(*kernels::NumElementsChecked({}), 1);
  EXPECT_EQ(*kernels::NumElementsChecked({2, 3, 4}), 24);
  EXPECT_EQ(*kernels::NumElementsChecked({0, 7}), 0);
  EXPECT_EQ(*kernels::NumElementsChecked({kMax}), kMax);
  // Their product wraps to 0 in 64 bits (a "valid" empty tensor)...
  ASSERT_EQ(static_cast<uint64_t>(k2To32) * static_cast<uint64_t>(k2To32) * 4u, 0u);
  auto wrapped = kernels::NumElementsChecked({k2To32, k2To32, 4});
  ASSERT_FALSE(wrapped.ok());
  EXPECT_EQ(wrapped.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(Message(wrapped.status()), HasSubstr("[4294967296,4294967296,4]"));
  EXPECT_THAT(Message(wrapped.status()), HasSubstr("2147483648 elements per tensor"));
  EXPECT_FALSE(kernels::NumElementsChecked({k2To40}).ok());
  EXPECT_FALSE(kernels::NumElementsChecked({kMax, 2}).ok());
  EXPECT_FALSE(kernels::NumElementsChecked({kInt64Max, kInt64Max}).ok());
  // A zero-size tensor may not carry dims whose product overflows either.
  EXPECT_FALSE(kernels::NumElementsChecked({0, k2To40}).ok());
  EXPECT_FALSE(kernels::NumElementsChecked({0, int64_t{1} << 20, int64_t{1} << 20}).ok());
  auto negative = kernels::NumElementsChecked({2, -3});
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(negative.status()), HasSubstr("negative dim (-3)"));
  // A smaller cap.
  EXPECT_FALSE(kernels::NumElementsChecked({5, 5}, 24).ok());
  EXPECT_EQ(*kernels::NumElementsChecked({4, 6}, 24), 24);
  EXPECT_EQ(*kernels::ByteSizeChecked({4, 6}, 8), 192);
  EXPECT_FALSE(kernels::ByteSizeChecked({k2To40}, 4).ok());
}

TEST(CheckedArithmeticTest, ReshapeTargetWhoseProductWrapsToTheInputsCountIsRefused) {
  // 4 * (2^62 + 1) = 2^64 + 4, which wraps to 4: the unchecked product made
  // [2^62+1, 4] a valid reshape of 4 elements.
  const int64_t wraps_to_one = (int64_t{1} << 62) + 1;
  auto s = kernels::ReshapeShape({1, 4}, {wraps_to_one, 4}, false);
  ASSERT_FALSE(s.ok()) << kernels::ShapeToString(*s);
  EXPECT_THAT(Message(s.status()), HasSubstr("exceeds the limit"));
  EXPECT_FALSE(kernels::ReshapeShape({1, 4}, {k2To40, -1}, false).ok());
  EXPECT_FALSE(kernels::ReshapeShape({1, 4}, {kInt64Max, kInt64Max}, false).ok());
  EXPECT_FALSE(kernels::ReshapeShape({1, 4}, {0, k2To40}, true).ok());
  EXPECT_FALSE(kernels::ReshapeShape({k2To32, k2To32}, {-1}, false).ok());
  EXPECT_EQ(*kernels::ReshapeShape({2, 6}, {3, -1}, false), (Shape{3, 4}));
  EXPECT_EQ(*kernels::ReshapeShape({2, 6}, {0, 3, 2}, false), (Shape{2, 3, 2}));
}

TEST(CheckedArithmeticTest, FlattenOfAnOverflowingShapeIsRefused) {
  EXPECT_EQ(*kernels::FlattenShape({2, 3, 4}, 1), (Shape{2, 12}));
  EXPECT_FALSE(kernels::FlattenShape({0, k2To40, k2To40}, 1).ok());
  EXPECT_FALSE(kernels::FlattenShape({2, -3}, 1).ok());
}

// --- Initializers ---------------------------------------------------------------

OnnxModelBuilder IdentityModel() {
  OnnxModelBuilder b;
  b.Input("x", {1, 4}).Output("y", {1, 4});
  b.Node("Identity", {"x"}, {"y"}, "id");
  return b;
}

// An initializer the graph does not read, with these dims and raw bytes.
onnx::TensorProto& AddRaw(OnnxModelBuilder& b, const std::string& name, int32_t type,
                          const std::vector<int64_t>& dims, const std::string& raw) {
  onnx::TensorProto* t = b.proto().mutable_graph()->add_initializer();
  t->set_name(name);
  t->set_data_type(type);
  for (int64_t d : dims) t->add_dims(d);
  if (!raw.empty()) t->set_raw_data(raw);
  return *t;
}

TEST(HostileInitializerTest, TwoToTheFortyElementsInSixteenBytesIsAnErrorNotAnAllocation) {
  OnnxModelBuilder b = IdentityModel();
  AddRaw(b, "unused", onnx::TensorProto::FLOAT, {k2To40}, std::string(16, '\0'));
  auto graph = ImportOnnxModel(b.Save("huge_initializer"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()), HasSubstr("initializer 'unused'"));
  EXPECT_THAT(Message(graph.status()), HasSubstr("[1099511627776]"));
}

TEST(HostileInitializerTest, TypedValuesFewerThanTheDimsClaimAreAnError) {
  OnnxModelBuilder b = IdentityModel();
  onnx::TensorProto& t = AddRaw(b, "ints", onnx::TensorProto::INT64, {k2To40}, "");
  t.add_int64_data(1);
  t.add_int64_data(2);
  auto graph = ImportOnnxModel(b.Save("huge_int64"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()), HasSubstr("initializer 'ints'"));

  // Within the cap: the declared count is checked against the values held.
  OnnxModelBuilder c = IdentityModel();
  onnx::TensorProto& u = AddRaw(c, "few", onnx::TensorProto::INT64, {1000}, "");
  u.add_int64_data(1);
  graph = ImportOnnxModel(c.Save("few_int64"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()),
              HasSubstr("declares dims [1000] (1000 elements) but holds 1 values"));

  OnnxModelBuilder d = IdentityModel();
  AddRaw(d, "short", onnx::TensorProto::FLOAT, {8}, std::string(16, '\0'));
  graph = ImportOnnxModel(d.Save("short_raw"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()), HasSubstr("initializer 'short' declares dims [8]"));
  EXPECT_THAT(Message(graph.status()), HasSubstr("holds 16 raw bytes"));
}

TEST(HostileInitializerTest, DimsWhoseProductWrapsToZeroAreAnError) {
  // 2^32 * 2^32 * 4 wraps to 0: before, an "empty" initializer.
  OnnxModelBuilder b = IdentityModel();
  AddRaw(b, "wrap", onnx::TensorProto::FLOAT, {k2To32, k2To32, 4}, "");
  auto graph = ImportOnnxModel(b.Save("wrap_initializer"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()), HasSubstr("initializer 'wrap'"));
  EXPECT_THAT(Message(graph.status()), HasSubstr("exceeds the limit"));
}

TEST(HostileInitializerTest, ExternalDataOutsideTheModelsFolderIsRefused) {
  OnnxModelBuilder b = IdentityModel();
  onnx::TensorProto& t = AddRaw(b, "ext", onnx::TensorProto::FLOAT, {4}, "");
  t.set_data_location(onnx::TensorProto::EXTERNAL);
  auto* entry = t.add_external_data();
  entry->set_key("location");
  entry->set_value("/etc/passwd");
  auto graph = ImportOnnxModel(b.Save("external"));
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(Message(graph.status()), HasSubstr("tensor 'ext' in external data '/etc/passwd'"));
  EXPECT_THAT(Message(graph.status()), HasSubstr("an absolute path"));
}

TEST(HostileInitializerTest, AnInputWhoseRowExceedsTheLimitIsRefusedByName) {
  OnnxModelBuilder b;
  b.Input("x", {-1, k2To40}).Output("y", {-1, k2To40});
  b.Node("Identity", {"x"}, {"y"});
  auto graph = ImportOnnxModel(b.Save("huge_input"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()), HasSubstr("input 'x'"));
}

// --- Shape functions of nodes ---------------------------------------------------------

// x [1, 4] -> `op`(x, <the INT64 values of `values`, as a folded Concat of
// two constants, so libonnx's own shape inference never sees them>) -> y.
OnnxModelBuilder WithFoldedInts(const std::string& op, const std::vector<int64_t>& values,
                                size_t rank_out = 2) {
  OnnxModelBuilder b;
  b.Input("x", {1, 4}).Output("y", std::vector<int64_t>(rank_out, kUnknownDim));
  const std::vector<int64_t> first(values.begin(), values.begin() + 1);
  const std::vector<int64_t> rest(values.begin() + 1, values.end());
  b.Int64Initializer("a", first).Int64Initializer("b", rest);
  auto& concat = b.Node("Concat", {"a", "b"}, {"values"}, "make_values");
  OnnxModelBuilder::AttrInt(concat, "axis", 0);
  b.Node(op, {"x", "values"}, {"y"}, "victim");
  return b;
}

void ExpectNodeError(const OnnxModelBuilder& b, const std::string& stem,
                     const std::string& node_and_op, const std::string& detail) {
  auto graph = ImportOnnxModel(b.Save(stem));
  ASSERT_FALSE(graph.ok()) << stem << " imported";
  EXPECT_THAT(Message(graph.status()), HasSubstr(node_and_op)) << stem;
  EXPECT_THAT(Message(graph.status()), HasSubstr(detail)) << stem;
}

TEST(HostileShapeTest, ReshapeToAProductThatWrapsIsAnError) {
  ExpectNodeError(WithFoldedInts("Reshape", {(int64_t{1} << 62) + 1, 4}), "reshape_wrap",
                  "node 'victim' (op Reshape)", "exceeds the limit");
  ExpectNodeError(WithFoldedInts("Reshape", {k2To32, k2To32, 4}, 3), "reshape_huge",
                  "node 'victim' (op Reshape)", "Reshape");
}

TEST(HostileShapeTest, PadWithHugeOrNegativePadsIsAnError) {
  ExpectNodeError(WithFoldedInts("Pad", {0, int64_t{1} << 62, 0, int64_t{1} << 62}), "pad_huge",
                  "node 'victim' (op Pad)", "negative or overflowing extent");
  ExpectNodeError(WithFoldedInts("Pad", {0, -10, 0, 0}), "pad_negative", "node 'victim' (op Pad)",
                  "negative or overflowing extent");
  ExpectNodeError(WithFoldedInts("Pad", {0, k2To40, 0, 0}), "pad_big", "node 'victim' (op Pad)",
                  "exceeds the limit");
}

TEST(HostileShapeTest, TileWithHugeOrNegativeRepeatsIsAnError) {
  ExpectNodeError(WithFoldedInts("Tile", {kMax, kMax}), "tile_huge", "node 'victim' (op Tile)",
                  "exceeds the limit");
  ExpectNodeError(WithFoldedInts("Tile", {k2To40, kInt64Max}), "tile_overflow",
                  "node 'victim' (op Tile)", "overflows int64");
  ExpectNodeError(WithFoldedInts("Tile", {1, -2}), "tile_negative", "node 'victim' (op Tile)",
                  "negative");
}

TEST(HostileShapeTest, ExpandToAHugeShapeIsAnError) {
  ExpectNodeError(WithFoldedInts("Expand", {k2To40, 4}), "expand_huge", "node 'victim' (op Expand)",
                  "exceeds the limit");
  ExpectNodeError(WithFoldedInts("Expand", {-5, 4}), "expand_negative", "node 'victim' (op Expand)",
                  "negative dim");
}

TEST(HostileShapeTest, ConstantOfShapeWithHugeOrNegativeDimsIsAnError) {
  for (const auto& [stem, dims] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"cos_huge", {int64_t{1} << 20, int64_t{1} << 20}}, {"cos_negative", {-5}}}) {
    OnnxModelBuilder b = IdentityModel();
    b.Int64Initializer("dims", dims);
    b.Node("ConstantOfShape", {"dims"}, {"filled"}, "victim");
    // An output: a node no output needs is dropped before it is checked.
    b.Output("filled", std::vector<int64_t>(dims.size(), kUnknownDim));
    ExpectNodeError(b, stem, "node 'victim' (op ConstantOfShape)", "the shape input");
  }
}

TEST(HostileShapeTest, ConstantFoldingDoesNotAllocateBeyondItsCap) {
  // 2^25 elements from two values: within the per-tensor limit, so the
  // model loads, but the node is left to run at run time, not folded into
  // 128 MiB of constant at load.
  OnnxModelBuilder big = IdentityModel();
  big.Int64Initializer("dims", {int64_t{1} << 13, int64_t{1} << 12});
  big.Node("ConstantOfShape", {"dims"}, {"filled"}, "big");
  big.Output("filled", {kUnknownDim, kUnknownDim});
  auto graph = ImportOnnxModel(big.Save("cos_unfolded"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  bool kept = false;
  for (const Node& node : graph->nodes()) kept |= node.name == "big";
  EXPECT_TRUE(kept);
  // A small one folds as before.
  OnnxModelBuilder small = IdentityModel();
  small.Int64Initializer("dims", {16, 16});
  small.Node("ConstantOfShape", {"dims"}, {"filled"}, "small");
  small.Output("filled", {kUnknownDim, kUnknownDim});
  graph = ImportOnnxModel(small.Save("cos_folded"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (const Node& node : graph->nodes()) EXPECT_NE(node.name, "small");
}

// --- The constant folding budget ------------------------------------------------------

// x [1] + ReduceSum(Concat(COPIES x Expand(1.0, [ELEMENTS]))) + ... (CONCATS
// such sums) -> y [1]: a file of a few hundred bytes whose constants fold
// to CONCATS * COPIES * ELEMENTS floats. Each Concat passes the cap per
// node, which counts its inputs (folded before it), and the limit per
// tensor (2^31 elements) while COPIES * ELEMENTS stays under it.
OnnxModelBuilder ExpandConcatBomb(int concats, int copies, int64_t elements = int64_t{1} << 24) {
  OnnxModelBuilder b;
  b.Input("x", {1}).Output("y", {1});
  b.Initializer("one", kernels::Tensor({1}, {1.0f}));
  b.Int64Initializer("n", {elements});
  b.Node("Expand", {"one", "n"}, {"e"}, "expand");
  std::string sum = "x";
  for (int k = 0; k < concats; ++k) {
    const std::string cat = k == 0 ? "cat" : absl::StrCat("cat", k);
    auto& node = b.Node("Concat", std::vector<std::string>(copies, "e"), {cat + "_out"}, cat);
    OnnxModelBuilder::AttrInt(node, "axis", 0);
    b.Node("ReduceSum", {cat + "_out"}, {cat + "_sum"});  // all axes, keepdims: [1]
    const std::string next = k + 1 == concats ? "y" : absl::StrCat("acc", k);
    b.Node("Add", {sum, cat + "_sum"}, {next});
    sum = next;
  }
  return b;
}

// What one import did in a child process (so that its peak memory is its
// own and a failure to bound it cannot take the test binary down).
struct ChildImport {
  bool ok = false;
  std::string code;
  std::string message;
  int64_t rss_growth_bytes = 0;  // peak resident set over the one at the start
};

ChildImport ImportInChild(const std::string& path, const ImportOptions& options = {}) {
  int fds[2];
  if (pipe(fds) != 0) {
    ADD_FAILURE() << "pipe failed, errno " << errno;
    return {};
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    // 2 GiB of address space more than the child starts with: without the
    // budget the import fails with bad_alloc here, never pushing the
    // machine into its OOM killer (sanitizers reserve terabytes of shadow).
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r"); f != nullptr) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const rlim_t limit = static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (rlim_t{2} << 30);
    const rlimit as = {limit, limit};
    setrlimit(RLIMIT_AS, &as);
#endif
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    auto graph = ImportOnnxModel(path, options);
    getrusage(RUSAGE_SELF, &after);
    const std::string report = absl::StrCat(
        graph.ok() ? 1 : 0, "\n", (after.ru_maxrss - before.ru_maxrss) * int64_t{1024}, "\n",
        absl::StatusCodeToString(graph.status().code()), "\n", graph.status().message());
    size_t done = 0;
    while (done < report.size()) {
      const ssize_t n = write(fds[1], report.data() + done, report.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string report;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof(buffer))) > 0;) report.append(buffer, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ChildImport result;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << "the importing child died (status " << status << ")";
    return result;
  }
  const std::vector<std::string> lines = absl::StrSplit(report, absl::MaxSplits('\n', 3));
  if (lines.size() != 4) {
    ADD_FAILURE() << "the importing child reported: " << report;
    return result;
  }
  result.ok = lines[0] == "1";
  result.rss_growth_bytes = std::stoll(lines[1]);
  result.code = lines[2];
  result.message = lines[3];
  return result;
}

// What the budget lets one import add to the resident set: the budget's
// floor (the bombs' Expand, 64 MiB), what the node folding it needs while it
// runs (Expand's reference keeps an int64 offset an element beside its
// output: 192 MiB in all) and the parsed file, with room to spare. Without
// the budget the bombs' Concats alone are 2.5 and 7.5 GiB. Under ASan the
// same import peaks near 450 MiB (its shadow adds an eighth, redzones pad
// every block and freed blocks stay resident in its quarantine, 256 MiB by
// default), so the bound there is 768 MiB: still well under what
// the first refused Concat alone would take.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int64_t kFoldingRssBound = 12 * kMinFoldBudgetBytes;
#else
constexpr int64_t kFoldingRssBound = 4 * kMinFoldBudgetBytes;
#endif

TEST(FoldBudgetTest, ExpandConcatReduceSumBombIsRefusedWithBoundedMemory) {
  // 40 x 2^24 floats: 2.5 GiB folded from a file of a few hundred bytes.
  // The Expand (64 MiB, the budget's floor) folds; the Concat would take
  // the folded constants to 2.5 GiB and is refused before it allocates.
  const std::string path = ExpandConcatBomb(1, 40).Save("fold_bomb");
  const ChildImport child = ImportInChild(path);
  EXPECT_FALSE(child.ok);
  EXPECT_EQ(child.code, "RESOURCE_EXHAUSTED") << child.message;
  EXPECT_THAT(child.message, HasSubstr("node 'cat' (op Concat)"));
  EXPECT_THAT(child.message, HasSubstr("constant folding budget of 64.0 MiB"));
  EXPECT_THAT(child.message, HasSubstr("2624.0 MiB (64.0 MiB folded before it, 2560.0 MiB"));
  EXPECT_LT(child.rss_growth_bytes, kFoldingRssBound) << child.message;
}

TEST(FoldBudgetTest, ScaledBombIsRefusedWithTheSameBoundedMemory) {
  // 16 Concats of 120 copies: 120 GiB, each Concat input 3 bytes of the
  // file (a Concat of 128 would pass the limit per tensor).
  const std::string path = ExpandConcatBomb(16, 120).Save("fold_bomb_scaled");
  const ChildImport child = ImportInChild(path);
  EXPECT_FALSE(child.ok);
  EXPECT_EQ(child.code, "RESOURCE_EXHAUSTED") << child.message;
  EXPECT_THAT(child.message, HasSubstr("node 'cat' (op Concat)"));
  EXPECT_THAT(child.message, HasSubstr("above the constant folding budget"));
  EXPECT_LT(child.rss_growth_bytes, kFoldingRssBound) << child.message;
}

TEST(FoldBudgetTest, WhatFoldsIsReportedAndHeldToTheBudget) {
  // 2^20 floats per Expand, 3 copies: 4 MiB, then 12 MiB for the Concat.
  const std::string path = ExpandConcatBomb(1, 3, int64_t{1} << 20).Save("fold_small");
  FoldResult folding;
  auto graph = ImportOnnxModel(path, {}, &folding);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(folding.budget_bytes, kMinFoldBudgetBytes);
  // Expand, Concat, ReduceSum: 4 MiB + 12 MiB + one float.
  EXPECT_EQ(folding.folded_bytes, (int64_t{16} << 20) + 4);
  ASSERT_EQ(graph->nodes().size(), 1u);
  EXPECT_EQ(graph->nodes()[0].op_type, "Add");
  // The same model under a budget of 8 MiB: the Concat is refused.
  auto refused = ImportOnnxModel(path, ImportOptions{.fold_budget_bytes = int64_t{8} << 20});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(refused.status()), HasSubstr("node 'cat' (op Concat)"));
  EXPECT_THAT(Message(refused.status()),
              HasSubstr("budget of 8.0 MiB (8388608 bytes: set by the import options)"));
}

TEST(FoldBudgetTest, ShapeDependentFoldsPastTheBudgetStayNodes) {
  // Mul(Gather(Shape(x), 0), zeros): the batch times 2^16 zeros, the same
  // at any batch, so it folds (1.25 MiB: INT64 values, as FP32 and as
  // int64 again) under the default budget. Under a budget of 1 MiB it is
  // left to run: a value computed from the input's shape is not refused.
  constexpr int64_t kWidth = int64_t{1} << 16;
  OnnxModelBuilder b;
  b.Input("x", {-1, kWidth}).Output("y", {-1, kWidth});
  b.Int64Initializer("first", {0});
  b.Int64Initializer("zeros", std::vector<int64_t>(kWidth, 0));
  b.Node("Shape", {"x"}, {"shape"}, "shape");
  b.Node("Gather", {"shape", "first"}, {"batch"}, "batch");
  b.Node("Mul", {"batch", "zeros"}, {"zero_ints"}, "times_zero");
  auto& cast = b.Node("Cast", {"zero_ints"}, {"zero_floats"}, "cast");
  OnnxModelBuilder::AttrInt(cast, "to", onnx::TensorProto::FLOAT);
  b.Node("Add", {"x", "zero_floats"}, {"y"}, "add");
  const std::string path = b.Save("fold_tracked");
  auto kept = [](const Graph& graph, const std::string& name) {
    for (const Node& node : graph.nodes()) {
      if (node.name == name) return true;
    }
    return false;
  };
  FoldResult folding;
  auto graph = ImportOnnxModel(path, {}, &folding);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_FALSE(kept(*graph, "times_zero"));
  EXPECT_GE(folding.folded_bytes, kWidth * 20);
  graph = ImportOnnxModel(path, ImportOptions{.fold_budget_bytes = int64_t{1} << 20}, &folding);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(kept(*graph, "times_zero"));
  EXPECT_LE(folding.folded_bytes, int64_t{1} << 20);
}

TEST(FoldBudgetTest, DequantizedInt8WeightsBeyondTheFloorStillFold) {
  // 16 MiB of INT8 weights dequantize to 64 MiB of FP32 (and keep their
  // INT8 values): above the floor, within twice what the weights hold
  // once read (13 bytes an element), so the budget leaves QDQ models be.
  const int64_t rows = 2048, cols = 8192;
  std::vector<int8_t> w(static_cast<size_t>(rows * cols), 3);
  OnnxModelBuilder b;
  b.Input("x", {-1, rows}).Output("y", {-1, cols});
  b.RawInitializer("w_q", onnx::TensorProto::INT8, {rows, cols}, w.data(), w.size());
  b.Initializer("w_scale", kernels::Tensor({}, {0.5f}));
  b.Node("DequantizeLinear", {"w_q", "w_scale"}, {"w"}, "dequantize");
  b.Node("MatMul", {"x", "w"}, {"y"}, "matmul");
  FoldResult folding;
  auto graph = ImportOnnxModel(b.Save("fold_int8"), {}, &folding);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_GT(folding.folded_bytes, kMinFoldBudgetBytes);
  EXPECT_LE(folding.folded_bytes, folding.budget_bytes);
  ASSERT_EQ(graph->nodes().size(), 1u);
  const Constant* folded = graph->FindConstant(graph->FindValue("w").value_or(kNoValue));
  ASSERT_NE(folded, nullptr);
  EXPECT_TRUE(folded->int8_origin.has_value());
}

TEST(HostileShapeTest, ResizeWithHugeNegativeOrNanScalesIsAnError) {
  for (float scale : {1e30f, -2.0f, std::nanf("")}) {
    OnnxModelBuilder b;
    b.Input("x", {1, 1, 2, 2}).Output("y", {kUnknownDim, kUnknownDim, kUnknownDim, kUnknownDim});
    b.Initializer("scales", kernels::Tensor({4}, {1.0f, 1.0f, scale, scale}));
    auto& n = b.Node("Resize", {"x", "", "scales"}, {"y"}, "victim");
    OnnxModelBuilder::AttrString(n, "mode", "nearest");
    auto graph = ImportOnnxModel(b.Save("resize"));
    ASSERT_FALSE(graph.ok()) << scale;
    EXPECT_THAT(Message(graph.status()), HasSubstr("node 'victim' (op Resize)")) << scale;
  }
}

TEST(HostileShapeTest, ConcatPastTheLimitIsAnError) {
  // Two values of 2^30 + 1 elements each (within the limit, left unfolded)
  // concatenated: 2^31 + 2.
  OnnxModelBuilder b = IdentityModel();
  b.Initializer("one", kernels::Tensor({1}, {1.0f}));
  b.Int64Initializer("n", {(int64_t{1} << 30) + 1});
  b.Node("Expand", {"one", "n"}, {"big"}, "expand");
  auto& c = b.Node("Concat", {"big", "big"}, {"joined"}, "victim");
  OnnxModelBuilder::AttrInt(c, "axis", 0);
  b.Output("joined", {kUnknownDim});
  ExpectNodeError(b, "concat_huge", "node 'victim' (op Concat)", "exceeds the limit");
}

TEST(HostileShapeTest, SplitWithNegativeSizesIsAnError) {
  OnnxModelBuilder b;
  b.Input("x", {1, 4}).Output("y", {kUnknownDim, kUnknownDim});
  b.Int64Initializer("a", {-1}).Int64Initializer("b", {5});
  auto& concat = b.Node("Concat", {"a", "b"}, {"sizes"}, "make_sizes");
  OnnxModelBuilder::AttrInt(concat, "axis", 0);
  auto& split = b.Node("Split", {"x", "sizes"}, {"y", "z"}, "victim");
  OnnxModelBuilder::AttrInt(split, "axis", 1);
  ExpectNodeError(b, "split_negative", "node 'victim' (op Split)", "split sizes");
}

TEST(HostileShapeTest, SliceWithTheMostNegativeStepDoesNotOverflow) {
  OnnxModelBuilder b;
  b.Input("x", {1, 4}).Output("y", {kUnknownDim, kUnknownDim});
  b.Int64Initializer("starts", {3}).Int64Initializer("ends", {-5});
  b.Int64Initializer("axes", {1}).Int64Initializer("steps", {kInt64Min});
  b.Node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"y"}, "slice");
  auto graph = ImportOnnxModel(b.Save("slice_min_step"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto shapes = PropagateShapes(*graph, InputShapesForBatch(*graph, 1));
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ((*shapes)[*graph->FindValue("y")], (Shape{1, 1}));  // element 3 alone
}

TEST(HostileShapeTest, ZeroStridesAreRefusedBeforeLibonnxDividesByThem) {
  // libonnx 1.12's convPoolShapeInference divides by the stride: a SIGFPE
  // (no exception) in the server process before this check.
  for (const std::string op : {"Conv", "MaxPool"}) {
    OnnxModelBuilder b;
    b.Input("x", {1, 1, 8, 8}).Output("y", {kUnknownDim, kUnknownDim, kUnknownDim, kUnknownDim});
    std::vector<std::string> inputs = {"x"};
    if (op == "Conv") {
      b.Initializer("w", kernels::Tensor({1, 1, 3, 3}, std::vector<float>(9, 1.0f)));
      inputs.push_back("w");
    }
    auto& n = b.Node(op, inputs, {"y"}, "victim");
    OnnxModelBuilder::AttrInts(n, "strides", {0, 0});
    OnnxModelBuilder::AttrInts(n, "kernel_shape", {3, 3});
    OnnxModelBuilder::AttrString(n, "auto_pad", "SAME_UPPER");
    ExpectNodeError(b, "zero_strides", "node 'victim' (op " + op + ")", "'strides' has 0");
  }
}

TEST(HostileShapeTest, HugeConvPadsAreAnError) {
  OnnxModelBuilder b;
  b.Input("x", {1, 1, 8, 8}).Output("y", {kUnknownDim, kUnknownDim, kUnknownDim, kUnknownDim});
  b.Initializer("w", kernels::Tensor({1, 1, 3, 3}, std::vector<float>(9, 1.0f)));
  auto& n = b.Node("Conv", {"x", "w"}, {"y"}, "victim");
  OnnxModelBuilder::AttrInts(n, "pads", {0, 0, int64_t{1} << 62, int64_t{1} << 62});
  ExpectNodeError(b, "conv_pads", "node 'victim' (op Conv)", "pads must be within");
}

TEST(HostileShapeTest, PropagationRefusesAHugeRuntimeBatchByName) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 1024}).Output("y", {-1, 1024});
  b.Node("Relu", {"x"}, {"y"});
  auto graph = ImportOnnxModel(b.Save("batch"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(PropagateShapes(*graph, InputShapesForBatch(*graph, 1 << 20)).ok());
  auto huge = PropagateShapes(*graph, InputShapesForBatch(*graph, int64_t{1} << 40));
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(Message(huge.status()), HasSubstr("input 'x'"));
}

}  // namespace
}  // namespace numaserve::engine
