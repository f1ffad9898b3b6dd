// Packed record files: a record file and its index from arbitrary bytes,
// opened by RecordFileReader (the training path: header and index checked,
// records read on demand), read whole and gathered from. Input layout:
//
//   u8 limit, u32 n (little-endian), n bytes of FILE, the rest FILE.idx
//
// (n beyond the input takes what is there; limit 0 reads every record).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"
#include "training/dataset.h"
#include "training/record_file.h"

namespace numaserve::fuzz {

int FuzzOne(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const int64_t limit = data[0];
  uint32_t n = 0;
  memcpy(&n, data + 1, 4);
  const std::string_view rest = AsText(data + 5, size - 5);
  const std::string_view file = rest.substr(0, std::min<size_t>(n, rest.size()));
  const std::string_view index = rest.substr(file.size());
  const std::string path = WriteScratchFile("records", file);
  WriteScratchFile("records.idx", index);

  absl::StatusOr<std::unique_ptr<training::RecordFileReader>> reader =
      training::RecordFileReader::Open(path, limit);
  if (!reader.ok()) return 0;
  training::RecordFileReader& r = **reader;
  FUZZ_CHECK(r.size() >= 0);
  FUZZ_CHECK(limit == 0 || r.size() <= limit);
  int64_t per = 1;
  for (int64_t d : r.example_dims()) {
    FUZZ_CHECK(d >= 0);
    per *= d;
  }
  FUZZ_CHECK(r.record_bytes() == 1 + per);
  // Every record is in the file: size() records of record_bytes() each.
  FUZZ_CHECK(static_cast<size_t>(r.size() * r.record_bytes()) <= file.size());

  if (r.size() > 0) {
    const std::vector<int64_t> indices = {r.size() - 1, 0, r.size() / 2, r.size() - 1};
    kernels::Tensor batch;
    std::vector<uint8_t> labels;
    FUZZ_CHECK(
        r.Gather(indices.data(), static_cast<int64_t>(indices.size()), &batch, &labels).ok());
    FUZZ_CHECK(labels.size() == indices.size());
    FUZZ_CHECK(batch.data.size() == indices.size() * static_cast<size_t>(per));
    // Gather sizes the batch before it looks at the indices: only where
    // the records are small enough for that (size() > 0) does asking for
    // one outside them make sense.
    for (int64_t bad : {int64_t{-1}, r.size()}) {
      FUZZ_CHECK(r.Gather(&bad, 1, &batch, &labels).code() == absl::StatusCode::kOutOfRange);
    }
  }
  absl::StatusOr<training::Dataset> all = r.ReadAll();
  FUZZ_CHECK(all.ok());
  FUZZ_CHECK(all->size == r.size());
  FUZZ_CHECK(all->images.size() == static_cast<size_t>(all->size * per));
  FUZZ_CHECK(all->labels.size() == static_cast<size_t>(all->size));

  // ReadRecordFile is the same reader, read whole.
  absl::StatusOr<training::Dataset> again = training::ReadRecordFile(path, limit);
  FUZZ_CHECK(again.ok() && again->images == all->images && again->labels == all->labels);
  return 0;
}

}  // namespace numaserve::fuzz
