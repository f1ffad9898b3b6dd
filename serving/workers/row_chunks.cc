// A batch over the model's activation limit, run in chunks of rows that
// fit (row_chunks.h).
#include "serving/workers/row_chunks.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model.h"

namespace numaserve::serving {
namespace {

// The bytes of one row of each buffer in `row`; false when a buffer is not
// a whole number of rows.
bool RowBytes(int64_t batch, const std::vector<size_t>& bytes, std::vector<size_t>* row) {
  for (size_t b : bytes) {
    if (b % static_cast<size_t>(batch) != 0) return false;
    row->push_back(b / static_cast<size_t>(batch));
  }
  return true;
}

std::vector<size_t> TimesRows(const std::vector<size_t>& row, int64_t rows) {
  std::vector<size_t> bytes;
  bytes.reserve(row.size());
  for (size_t b : row) bytes.push_back(b * static_cast<size_t>(rows));
  return bytes;
}

// The model at one signature (its non-batch dims) or, without one, at a
// batch size alone: the calls a run in chunks makes, at `rows` rows. Only a
// batched model runs in chunks, and every input of a batched model has the
// batch as its dim 0.
class AtRows {
 public:
  AtRows(engine::CompiledModel& model, const engine::CompiledModel::InputShapes& signature)
      : model_(model), shapes_(signature) {}

  absl::Status CheckBufferSizes(int64_t rows, const std::vector<size_t>& in,
                                const std::vector<size_t>& out) {
    if (shapes_.empty()) return model_.CheckBufferSizes(rows, in, out);
    return model_.CheckBufferSizes(Shapes(rows), in, out);
  }
  absl::Status Run(int64_t rows, const std::vector<const void*>& in,
                   const std::vector<void*>& out) {
    if (shapes_.empty()) return model_.Run(rows, in, out);
    return model_.Run(Shapes(rows), in, out);
  }
  bool Fits(int64_t rows) {
    if (shapes_.empty()) return model_.ActivationBytes(rows).ok();
    return model_.ActivationBytes(Shapes(rows)).ok();
  }

 private:
  // The signature with dim 0 of every input (the batch) at `rows`.
  const engine::CompiledModel::InputShapes& Shapes(int64_t rows) {
    for (auto& shape : shapes_) {
      if (!shape.empty()) shape[0] = rows;
    }
    return shapes_;
  }

  engine::CompiledModel& model_;
  engine::CompiledModel::InputShapes shapes_;
};

// Runs rows [0, batch) as chunks of `chunk` rows on the row slices of the
// buffers, whose rows are in_row/out_row bytes each.
absl::Status RunChunks(AtRows& model, int64_t batch, int64_t chunk,
                       const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                       const std::vector<size_t>& in_row, const std::vector<size_t>& out_row) {
  // Both sizes the engine will see are checked before anything runs: the
  // engine reads and writes whole tensors.
  for (int64_t rows : {chunk, batch % chunk}) {
    if (rows == 0) continue;
    if (absl::Status s =
            model.CheckBufferSizes(rows, TimesRows(in_row, rows), TimesRows(out_row, rows));
        !s.ok()) {
      return absl::InternalError(absl::StrCat("a batch of ", batch, " rows run in chunks of ",
                                              chunk, ": at ", rows, " rows: ", s.message()));
    }
  }
  std::vector<const void*> in(inputs.size());
  std::vector<void*> out(outputs.size());
  for (int64_t row = 0; row < batch; row += chunk) {
    const int64_t rows = std::min(chunk, batch - row);
    const size_t first = static_cast<size_t>(row);
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<const char*>(inputs[i]) + first * in_row[i];
    }
    for (size_t j = 0; j < out.size(); ++j) {
      out[j] = static_cast<char*>(outputs[j]) + first * out_row[j];
    }
    if (absl::Status s = model.Run(rows, in, out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// About log2(over) calls of Fits.
int64_t LargestRowsThatFit(AtRows& model, int64_t over) {
  int64_t fits = 0;  // 0: no count known to fit
  while (over - fits > 1) {
    const int64_t mid = fits + (over - fits) / 2;
    if (model.Fits(mid)) {
      fits = mid;
    } else {
      over = mid;
    }
  }
  return fits;
}

// The dims besides dim 0 of every input of `shapes`, in order: what a
// row count that fits is found for.
std::vector<int64_t> NonBatchDims(const engine::CompiledModel::InputShapes& shapes) {
  std::vector<int64_t> dims;
  for (const auto& shape : shapes) {
    dims.push_back(static_cast<int64_t>(shape.size()));
    if (!shape.empty()) dims.insert(dims.end(), shape.begin() + 1, shape.end());
  }
  return dims;
}

}  // namespace

int64_t LargestRowsThatFit(engine::CompiledModel& model, int64_t over) {
  AtRows at(model, {});
  return LargestRowsThatFit(at, over);
}

absl::Status RunRowsInChunks(engine::CompiledModel& model, int64_t batch,
                             const std::vector<const void*>& inputs,
                             const std::vector<void*>& outputs,
                             const std::vector<size_t>& input_bytes,
                             const std::vector<size_t>& output_bytes, RowsThatFit* fit,
                             const engine::CompiledModel::InputShapes& signature) {
  RowsThatFit local;
  RowsThatFit& found = fit != nullptr ? *fit : local;
  if (!signature.empty()) {
    // A row count found at other non-batch dims says nothing of these.
    std::vector<int64_t> dims = NonBatchDims(signature);
    if (found.known && found.signature != dims) found = RowsThatFit();
    found.signature = std::move(dims);
  }
  AtRows at(model, signature);
  std::vector<size_t> in_row, out_row;
  const bool rows_apart =
      model.info().batched && batch > 1 && inputs.size() == input_bytes.size() &&
      outputs.size() == output_bytes.size() && RowBytes(batch, input_bytes, &in_row) &&
      RowBytes(batch, output_bytes, &out_row);
  if (rows_apart && found.known && found.rows > 0 && batch > found.rows) {
    return RunChunks(at, batch, found.rows, inputs, outputs, in_row, out_row);
  }
  // The whole batch at its own signature: dim 0 of an input that is not
  // the batch (pos [seq, hidden] beside x [batch, seq, hidden]) stays.
  absl::Status s =
      signature.empty() ? model.Run(batch, inputs, outputs) : model.Run(signature, inputs, outputs);
  // Refused before anything of its size was allocated or written. Once the
  // count is known, a batch within it that is refused (its arena could not
  // be mapped) is not split: that is no limit of the model's.
  if (s.code() != absl::StatusCode::kResourceExhausted || !rows_apart || found.known) return s;
  found.rows = LargestRowsThatFit(at, batch);
  found.known = true;
  if (found.rows == 0) return s;
  return RunChunks(at, batch, found.rows, inputs, outputs, in_row, out_row);
}

}  // namespace numaserve::serving
