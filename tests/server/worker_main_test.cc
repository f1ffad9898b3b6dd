// The worker's side of a batch (RunBatchOn): it runs the engine only on
// slices of the shared arena that hold exactly what the model reads and
// writes, so a slot sized wrongly by the server fails that batch, naming the
// tensor, and never lets the engine write into the bytes after it (another
// request's).
#include "server/worker_main.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/engine/onnx_model_builder.h"

namespace numaserve::server {
namespace {

using engine::testing::kUnknownDim;
using engine::testing::OnnxModelBuilder;
using ::testing::HasSubstr;

constexpr char kCanary = '\x5a';

class WorkerSliceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto arena = SharedArena::Create("worker_slice_test", kArenaBytes);
    ASSERT_TRUE(arena.ok()) << arena.status();
    arena_ = *std::move(arena);
    std::memset(arena_->data(), kCanary, kArenaBytes);
  }

  // x [n,64] -> Reshape [1,-1] -> y [1,64n]: not [batch, ...].
  std::unique_ptr<engine::CompiledModel> OneRowModel() {
    OnnxModelBuilder b;
    b.Input("x", {-1, 64}).Output("y", {1, kUnknownDim});
    b.Int64Initializer("one_row", {1, -1});
    b.Node("Reshape", {"x", "one_row"}, {"y"}, "flatten_all");
    auto model = engine::CompiledModel::Load(b.Save("worker_one_row"), {});
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? *std::move(model) : nullptr;
  }

  // Input at offset 0 (rows x 64 floats), the output at `out_offset`.
  worker::RunBatch Batch(int64_t rows, uint64_t input_bytes, uint64_t out_offset,
                         uint64_t output_bytes) {
    worker::RunBatch run;
    run.set_key("one_row:1");
    run.set_batch(rows);
    auto* in = run.add_inputs();
    in->set_offset(0);
    in->set_bytes(input_bytes);
    auto* out = run.add_outputs();
    out->set_offset(out_offset);
    out->set_bytes(output_bytes);
    float* x = reinterpret_cast<float*>(arena_->data());
    for (uint64_t i = 0; i < input_bytes / sizeof(float); ++i) x[i] = static_cast<float>(i);
    return run;
  }

  // Bytes of the arena from `offset` on that still hold the canary.
  bool Untouched(uint64_t offset, uint64_t bytes) const {
    for (uint64_t i = offset; i < offset + bytes; ++i) {
      if (arena_->data()[i] != kCanary) return false;
    }
    return true;
  }

  static constexpr size_t kArenaBytes = 1 << 16;
  std::unique_ptr<SharedArena> arena_;
};

TEST_F(WorkerSliceTest, OutputSlotTooSmallFailsTheBatchWithoutWritingPastIt) {
  auto model = OneRowModel();
  ASSERT_NE(model, nullptr);
  // 5 rows as a [batch, static...] model would have been sized: y [1,1]
  // gets 4 bytes, the engine writes [1,320] (1280 bytes). The next request's
  // slot starts right after.
  const uint64_t out = 4096;
  worker::Reply reply;
  RunBatchOn(*model, *arena_, Batch(5, 5 * 64 * 4, out, 4), &reply);
  EXPECT_FALSE(reply.ok());
  EXPECT_THAT(reply.error(), HasSubstr("output 'y' at 5 rows is [1,320] of FP32 (1280 bytes)"));
  EXPECT_THAT(reply.error(), HasSubstr("holds 4 bytes"));
  EXPECT_TRUE(Untouched(out, 1280)) << "the engine wrote into the output slot or past it";
}

TEST_F(WorkerSliceTest, InputSlotOfTheWrongSizeFailsTheBatch) {
  auto model = OneRowModel();
  ASSERT_NE(model, nullptr);
  worker::Reply reply;
  // 5 rows but one row's bytes: the engine would read 4 rows of whatever follows.
  RunBatchOn(*model, *arena_, Batch(5, 64 * 4, 4096, 1280), &reply);
  EXPECT_FALSE(reply.ok());
  EXPECT_THAT(reply.error(), HasSubstr("input 'x' at 5 rows is [5,64]"));
  EXPECT_TRUE(Untouched(4096, 1280));
}

TEST_F(WorkerSliceTest, SlotsOfTheRightSizeRun) {
  auto model = OneRowModel();
  ASSERT_NE(model, nullptr);
  worker::Reply reply;
  RunBatchOn(*model, *arena_, Batch(5, 5 * 64 * 4, 4096, 1280), &reply);
  ASSERT_TRUE(reply.ok()) << reply.error();
  const float* y = reinterpret_cast<const float*>(arena_->data() + 4096);
  for (int i = 0; i < 320; ++i) ASSERT_EQ(y[i], static_cast<float>(i)) << i;
  EXPECT_TRUE(Untouched(4096 + 1280, 256)) << "written past the output slot";
}

TEST_F(WorkerSliceTest, SliceOutsideTheArenaFailsTheBatch) {
  auto model = OneRowModel();
  ASSERT_NE(model, nullptr);
  worker::Reply reply;
  RunBatchOn(*model, *arena_, Batch(5, 5 * 64 * 4, kArenaBytes - 100, 1280), &reply);
  EXPECT_FALSE(reply.ok());
  EXPECT_THAT(reply.error(), HasSubstr("outside the arena"));
}

}  // namespace
}  // namespace numaserve::server
