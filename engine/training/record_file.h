// numaserve's packed record format, for datasets too large for many small
// files on a shared filesystem: one data file of fixed-shape uint8 examples
// with their labels, and an index beside it, so a reader does few large
// reads.
//
//   FILE      "NSREC001", u32 rank, u64 dims[rank], u64 count, then count
//             records of [u8 label][product(dims) bytes]
//   FILE.idx  "NSIDX001", u64 count, u64 offset of every record in FILE
//
// Little-endian. Both are written to temporary names and renamed.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/training/dataset.h"

namespace numaserve::training {

absl::Status WriteRecordFile(const std::string& path, const Dataset& data);

// Reads FILE and checks it against FILE.idx; `limit` > 0 keeps the first
// examples. Errors name the file and the offset (truncated records, a bad
// magic, an index that disagrees with the data).
absl::StatusOr<Dataset> ReadRecordFile(const std::string& path, int64_t limit);

// A directory of raw examples: DIR/<label>/<file>, each file exactly
// product(dims) bytes of uint8, label 0..255; files in name order within
// labels in numeric order.
absl::StatusOr<Dataset> ReadRawTensorDirectory(const std::string& dir,
                                               const std::vector<int64_t>& dims);

}  // namespace numaserve::training
