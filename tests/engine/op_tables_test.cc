// One op's facts live in several tables keyed by its name: the registry's
// row (engine/ops/op_registry.h: validation, shapes, reference, FLOPs),
// its typed rows, its row rule (shape_propagation.cc) and its lowering
// (compiled_model.cc's LoweringOf). Nothing joins them at compile time, so
// this checks they agree: every entry of every table names a registered
// op, and every registered op has what each table must give it. (The
// training table, training/training_ops.cc, is checked in
// tests/training/training_ops_test.cc.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/compiler/compiled_model_impl.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/shape_propagation.h"
#include "engine/ops/typed_util.h"

namespace numaserve::engine {
namespace {

TEST(OpTablesTest, EveryRegisteredOpHasItsFunctions) {
  ASSERT_FALSE(AllOpSchemas().empty());
  for (const OpSchema& op : AllOpSchemas()) {
    SCOPED_TRACE(std::string(op.op_type));
    EXPECT_NE(op.validate, nullptr);
    EXPECT_NE(op.infer_shapes, nullptr);
    EXPECT_NE(op.reference, nullptr);
    EXPECT_NE(op.flops, nullptr);
    EXPECT_FALSE(op.family.empty());
    // A typed reference comes with its check of the types it accepts.
    EXPECT_EQ(op.typed_reference == nullptr, op.typed_accepts == nullptr);
  }
  // Every op's row rule: RowIndependenceTest.EveryRegisteredOpHasARowRule.
}

TEST(OpTablesTest, EveryRowRuleNamesARegisteredOp) {
  const std::vector<std::string> ops = RowRuleOps();
  ASSERT_FALSE(ops.empty());
  for (const std::string& op : ops) {
    EXPECT_NE(FindOpSchema(op), nullptr) << "a row rule for '" << op << "', which is no op";
  }
}

TEST(OpTablesTest, EveryTypedRowNamesARegisteredOp) {
  EXPECT_EQ(ops::TypedRowsWithoutOp(), std::vector<std::string>{});
}

TEST(OpTablesTest, EveryLoweringNamesARegisteredOp) {
  const std::vector<std::string> ops = internal::CompiledModelImpl::LoweredOpTypes();
  ASSERT_FALSE(ops.empty());
  for (const std::string& op : ops) {
    EXPECT_NE(FindOpSchema(op), nullptr) << "a lowering for '" << op << "', which is no op";
  }
}

}  // namespace
}  // namespace numaserve::engine
