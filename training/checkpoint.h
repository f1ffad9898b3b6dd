// Checkpoints: named FP32 tensors plus the step they were taken at, in one
// binary file written atomically (temporary file, fsync, rename, fsync of
// the directory), so a crash leaves either the old or the new checkpoint.
//
// Layout (little-endian): "NSCKPT01", u64 step, u64 count, then per tensor
// u32 name length, name bytes, u64 element count, float32 elements.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace numaserve::training {

struct Checkpoint {
  int64_t step = 0;  // optimizer steps taken
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
};

absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& checkpoint);
// Errors name the file and the offset of a truncated or malformed record.
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);

}  // namespace numaserve::training
