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

// Runs rows [0, batch) as chunks of `chunk` rows on the row slices of the
// buffers, whose rows are in_row/out_row bytes each.
absl::Status RunChunks(engine::CompiledModel& model, int64_t batch, int64_t chunk,
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

}  // namespace

int64_t LargestRowsThatFit(engine::CompiledModel& model, int64_t over) {
  int64_t fits = 0;  // 0: no count known to fit
  while (over - fits > 1) {
    const int64_t mid = fits + (over - fits) / 2;
    if (model.ActivationBytes(mid).ok()) {
      fits = mid;
    } else {
      over = mid;
    }
  }
  return fits;
}

absl::Status RunRowsInChunks(engine::CompiledModel& model, int64_t batch,
                             const std::vector<const void*>& inputs,
                             const std::vector<void*>& outputs,
                             const std::vector<size_t>& input_bytes,
                             const std::vector<size_t>& output_bytes, RowsThatFit* fit) {
  RowsThatFit local;
  RowsThatFit& found = fit != nullptr ? *fit : local;
  std::vector<size_t> in_row, out_row;
  const bool rows_apart =
      model.info().batched && batch > 1 && inputs.size() == input_bytes.size() &&
      outputs.size() == output_bytes.size() && RowBytes(batch, input_bytes, &in_row) &&
      RowBytes(batch, output_bytes, &out_row);
  if (rows_apart && found.known && found.rows > 0 && batch > found.rows) {
    return RunChunks(model, batch, found.rows, inputs, outputs, in_row, out_row);
  }
  absl::Status s = model.Run(batch, inputs, outputs);
  // Refused before anything of its size was allocated or written. Once the
  // count is known, a batch within it that is refused (its arena could not
  // be mapped) is not split: that is no limit of the model's.
  if (s.code() != absl::StatusCode::kResourceExhausted || !rows_apart || found.known) return s;
  found.rows = LargestRowsThatFit(model, batch);
  found.known = true;
  if (found.rows == 0) return s;
  return RunChunks(model, batch, found.rows, inputs, outputs, in_row, out_row);
}

}  // namespace numaserve::serving
