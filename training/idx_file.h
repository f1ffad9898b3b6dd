// IDX files (the MNIST family's format): a big-endian header of magic
// (0x0000, type, rank), the dimensions, then the data. Gzipped files
// (".gz", as Debian's dataset-fashion-mnist installs them) are read through
// zlib. Only the unsigned-byte type (0x08) is supported, the type of every
// MNIST-family file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace numaserve::training {

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28} or {60000}
  std::vector<uint8_t> data;  // row-major, product(dims) bytes
};

// The most bytes ReadIdxFile reads (uncompressed) and allocates by
// default: 4 GiB, ~90 times Fashion-MNIST's training images.
inline constexpr uint64_t kDefaultMaxIdxBytes = uint64_t{4} << 30;

// Reads `path` (gzip detected from its magic bytes, not its name). Errors
// name the file and the byte offset (in the uncompressed stream) where it
// went wrong: a bad magic, an unsupported type, a truncated body, a corrupt
// gzip stream, or trailing bytes; also dims whose product overflows or
// exceeds `max_bytes`, and a stream longer than `max_bytes` (which is all
// that is ever allocated).
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path,
                                     uint64_t max_bytes = kDefaultMaxIdxBytes);

// Writes an unsigned-byte IDX file, gzipped when `gzip` (for tests and
// converters). Written to a fresh temporary file under a random name
// (base/atomic_file.h) and renamed.
absl::Status WriteIdxFile(const std::string& path, const IdxArray& array, bool gzip);

}  // namespace numaserve::training
