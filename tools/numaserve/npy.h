// Reading NumPy .npy files (version 1.0-3.0, little-endian, C order) for
// `numaserve infer --input name=file.npy`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace numaserve::cli {

struct NpyArray {
  // numpy descr, normalized (see NormalizeDescr): "<f4", "<i8", "|b1", ...
  std::string dtype;
  std::vector<int64_t> shape;
  std::string data;  // raw little-endian bytes
};

// Checks a numpy descr of a supported type (booleans "b1", integers
// "i1".."i8" and "u1".."u8", floats "f2", "f4", "f8") and rewrites it the
// way NumPy writes it on little-endian machines: "|" for one-byte types,
// "<" otherwise ("=i8" -> "<i8", "<u1" -> "|u1"). Returns bytes per
// element; INVALID_ARGUMENT for other types and for big-endian ">" arrays.
absl::StatusOr<size_t> NormalizeDescr(std::string* descr);

// Reads every supported dtype (see NormalizeDescr).
// Errors name the file and what is wrong ("x.npy: Fortran order is not supported").
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

}  // namespace numaserve::cli
