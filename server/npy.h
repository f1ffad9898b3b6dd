// Reading NumPy .npy files (version 1.0-3.0, little-endian, C order) for
// `numaserve infer --input name=file.npy`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace numaserve::server {

struct NpyArray {
  std::string dtype;  // numpy descr: "<f4", "<i8", ...
  std::vector<int64_t> shape;
  std::string data;  // raw little-endian bytes
};

// Errors name the file and what is wrong ("x.npy: Fortran order is not supported").
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

}  // namespace numaserve::server
