// A batch whose rows together need more activation bytes than the model's
// limit (CompileOptions::max_activation_bytes), run in consecutive chunks
// of rows that each fit: the dynamic batcher stacks requests that each fit
// into batches that may not, and every request of such a batch would fail.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/model.h"

namespace numaserve::serving {

// The most rows one run of a model may take under its activation limit,
// found once per model copy (ActivationBytes plans each size it is asked
// about: a size that fits is planned and prepared as for a run) and kept by
// the caller for as long as that copy is loaded: a copy loaded again starts
// with a new one. Not thread-safe: one per copy, used where its Run is.
struct RowsThatFit {
  bool known = false;
  int64_t rows = 0;  // when known; 0: not even one row fits
  // For a shape-polymorphic model: the non-batch dims of the signature
  // `rows` was found at (each input's rank, then its dims besides dim 0); a
  // batch at other ones looks again. Empty for a model run at a batch size.
  std::vector<int64_t> signature;
};

// The largest row count below `over` (a count whose plan needs more than
// the limit) whose plan fits: 0 when one row does not. A binary search on
// ActivationBytes, which refuses a size over the limit before it allocates
// or prepares anything (plain arithmetic), and plans a size that fits as a
// Run there would (the engine keeps it like any size run: at most
// CompileOptions::batch_plans of them, dropped when idle). About log2(over)
// calls; activation bytes grow with the rows.
int64_t LargestRowsThatFit(engine::CompiledModel& model, int64_t over);

// Runs `batch` rows of `model` (CompiledModel::Run) on whole tensors whose
// sizes CheckBufferSizes accepted at `batch`: input_bytes[i] and
// output_bytes[j] are those sizes. When the model's rows are independent
// (ModelInfo::batched: dim 0 of every input and output is the batch) and
// the batch is refused with RESOURCE_EXHAUSTED, it runs in consecutive
// chunks of `fit->rows` rows (the last one smaller), each on the row slices
// of the buffers (row-major, dim 0 first), so that all chunks of that size
// share one plan. A batch larger than a known fit->rows goes to chunks at
// once. Only a model of which even one row does not fit, or one that is
// not batched, answers the batch's own RESOURCE_EXHAUSTED. `fit` may be
// null (the search runs again for every batch that needs it).
//
// With a `signature` (a shape-polymorphic model: every input's shape, dim 0
// the batch's rows), the batch runs at it, and each chunk at it with dim 0
// at the chunk's rows: CheckBufferSizes, Run and ActivationBytes take the
// signature forms. Empty: the model runs at `batch` alone, as always.
absl::Status RunRowsInChunks(engine::CompiledModel& model, int64_t batch,
                             const std::vector<const void*>& inputs,
                             const std::vector<void*>& outputs,
                             const std::vector<size_t>& input_bytes,
                             const std::vector<size_t>& output_bytes, RowsThatFit* fit,
                             const engine::CompiledModel::InputShapes& signature = {});

}  // namespace numaserve::serving
