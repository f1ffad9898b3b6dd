// The own-kernel fast paths for Transpose (batched swap of the last two
// axes on transpose_2d) and ReduceSum/Mean/Max/Min over trailing axes (on
// reduce_rows) against the reference executor, keepdims both ways, and
// the shapes that must stay on the general paths.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/model.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::ExpectCompiledMatchesReference;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::OnnxModelBuilder;

std::string PlanOf(const std::string& path) {
  auto model = CompiledModel::Load(path, {});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? (*model)->DescribePlan() : "";
}

TEST(CompiledReduceTransposeTest, LastTwoAxesTransposes) {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 13, 21}).Input("z", {-1, 3, 9, 17});
  b.Output("y1", {-1, 21, 13}).Output("y2", {-1, 3, 17, 9}).Output("y3", {-1, 13, 21});
  b.Output("y4", {-1, 9, 3, 17});
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"x"}, {"y1"}, "t3d"), "perm", {0, 2, 1});
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"z"}, {"y2"}, "t4d"), "perm", {0, 1, 3, 2});
  // Swapped back: a transpose reading a transpose.
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"y1"}, {"y3"}, "back"), "perm", {0, 2, 1});
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"z"}, {"y4"}, "middle"), "perm", {0, 2, 1, 3});
  const std::string path = b.Save("transposes");
  ExpectCompiledMatchesReference("transposes", path, {1, 2, 5}, 1e-12);
  const std::string plan = PlanOf(path);
  EXPECT_THAT(plan, HasSubstr("transpose: t3d"));
  EXPECT_THAT(plan, HasSubstr("transpose: t4d"));
  EXPECT_THAT(plan, Not(HasSubstr("reference")));
}

TEST(CompiledReduceTransposeTest, TrailingAxisReductionsUseOwnKernel) {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 5, 37});
  b.Output("sum", {-1, 5, 1}).Output("mean", {-1}).Output("max", {-1, 5});
  b.Output("min", {-1, 1, 1});
  b.Int64Initializer("last", {-1});
  // opset 13: ReduceSum takes axes as an input, the others as an attribute.
  OnnxModelBuilder::AttrInt(b.Node("ReduceSum", {"x", "last"}, {"sum"}, "rsum"), "keepdims", 1);
  auto& mean = b.Node("ReduceMean", {"x"}, {"mean"}, "rmean");
  OnnxModelBuilder::AttrInts(mean, "axes", {2, 1});
  OnnxModelBuilder::AttrInt(mean, "keepdims", 0);
  auto& max = b.Node("ReduceMax", {"x"}, {"max"}, "rmax");
  OnnxModelBuilder::AttrInts(max, "axes", {-1});
  OnnxModelBuilder::AttrInt(max, "keepdims", 0);
  OnnxModelBuilder::AttrInts(b.Node("ReduceMin", {"x"}, {"min"}, "rmin"), "axes", {-2, -1});
  const std::string path = b.Save("reductions");
  ExpectCompiledMatchesReference("reductions", path, {1, 3, 8}, 1e-10);
  const std::string plan = PlanOf(path);
  for (const char* name : {"rsum", "rmean", "rmax", "rmin"}) {
    EXPECT_THAT(plan, HasSubstr(std::string("reduce_rows: ") + name));
  }
  EXPECT_THAT(plan, Not(HasSubstr("reference")));
}

TEST(CompiledReduceTransposeTest, NonTrailingReductionsStayOnReference) {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 4, 9});
  b.Output("mid", {-1, 1, 9}).Output("first", {-1, 9});
  OnnxModelBuilder::AttrInts(b.Node("ReduceMean", {"x"}, {"mid"}, "rmid"), "axes", {1});
  auto& first = b.Node("ReduceMax", {"x"}, {"first"}, "rfirst");
  OnnxModelBuilder::AttrInts(first, "axes", {1});
  OnnxModelBuilder::AttrInt(first, "keepdims", 0);
  const std::string path = b.Save("reductions_ref");
  ExpectCompiledMatchesReference("reductions_ref", path, {1, 4}, 1e-12);
  const std::string plan = PlanOf(path);
  EXPECT_THAT(plan, Not(HasSubstr("reduce_rows")));
}

}  // namespace
}  // namespace numaserve::engine
