// numaserve's packed record format, for datasets too large for many small
// files on a shared filesystem: one data file of fixed-shape uint8 examples
// with their labels, and an index beside it, so a reader does few large
// reads.
//
//   FILE      "NSREC001", u32 rank, u64 dims[rank], u64 count, then count
//             records of [u8 label][product(dims) bytes]
//   FILE.idx  "NSIDX001", u64 count, u64 offset of every record in FILE
//
// Little-endian. Both are written to fresh temporary files under random
// names (base/atomic_file.h) and renamed.
//
// Training reads a record file through RecordFileReader: each rank preads
// only the records of its slices of the coming global batches (see
// BatchPrefetcher), never the whole file.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "training/dataset.h"

namespace numaserve::training {

absl::Status WriteRecordFile(const std::string& path, const Dataset& data);

// Reads FILE and checks it against FILE.idx; `limit` > 0 keeps the first
// examples. Errors name the file and the offset (truncated records, a bad
// magic, an index that disagrees with the data).
absl::StatusOr<Dataset> ReadRecordFile(const std::string& path, int64_t limit);

// A record file read on demand. Open checks FILE's header and size and the
// whole of FILE.idx (8 bytes a record) without reading any record; Gather
// preads only the records it is asked for, one read per run of adjacent
// records. What it read is counted (stats()).
class RecordFileReader final : public ExampleSource {
 public:
  // `limit` > 0 keeps the first examples, as ReadRecordFile.
  static absl::StatusOr<std::unique_ptr<RecordFileReader>> Open(const std::string& path,
                                                                int64_t limit);
  ~RecordFileReader() override;

  int64_t size() const override { return size_; }
  const std::vector<int64_t>& example_dims() const override { return dims_; }
  absl::Status Gather(const int64_t* indices, int64_t count, kernels::Tensor* batch,
                      std::vector<uint8_t>* labels) override;
  // Records [0, size()) in memory.
  absl::StatusOr<Dataset> ReadAll();

  struct Stats {
    int64_t records = 0;  // records read (a record read twice counts twice)
    int64_t bytes = 0;    // bytes read from FILE, headers included
    int64_t reads = 0;    // pread calls
  };
  Stats stats() const { return {records_.load(), bytes_.load(), reads_.load()}; }
  int64_t record_bytes() const { return record_bytes_; }

 private:
  RecordFileReader() = default;
  // Reads `length` bytes at `offset` into `out`; a short read is an error
  // naming the file and the offset where the data ends.
  absl::Status ReadAt(int64_t offset, int64_t length, uint8_t* out, const char* what);

  std::string path_;
  int fd_ = -1;
  std::vector<int64_t> dims_;
  int64_t size_ = 0;
  int64_t header_bytes_ = 0;
  int64_t record_bytes_ = 0;  // 1 label byte + the example
  std::vector<uint8_t> scratch_;
  std::atomic<int64_t> records_{0}, bytes_{0}, reads_{0};
};

// A directory of raw examples: DIR/<label>/<file>, each file exactly
// product(dims) bytes of uint8, label 0..255; files in name order within
// labels in numeric order.
absl::StatusOr<Dataset> ReadRawTensorDirectory(const std::string& dir,
                                               const std::vector<int64_t>& dims);

}  // namespace numaserve::training
