// Training checkpoints: ReadCheckpoint on arbitrary bytes. An accepted
// checkpoint is written back and read again unchanged.
#include <cstdint>
#include <cstring>

#include "tests/fuzz/fuzz_target.h"
#include "training/checkpoint.h"

namespace numaserve::fuzz {

int FuzzOne(const uint8_t* data, size_t size) {
  absl::StatusOr<training::Checkpoint> checkpoint =
      training::ReadCheckpoint(MemoryFile(0, AsText(data, size)));
  if (!checkpoint.ok()) return 0;
  // Accepted: the file was exactly the checkpoint, so writing it back gives
  // the same bytes.
  const std::string path = ScratchDirectory() + "/checkpoint";
  FUZZ_CHECK(training::WriteCheckpoint(path, *checkpoint).ok());
  absl::StatusOr<training::Checkpoint> again = training::ReadCheckpoint(path);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->step == checkpoint->step);
  FUZZ_CHECK(again->tensors.size() == checkpoint->tensors.size());
  for (size_t i = 0; i < again->tensors.size(); ++i) {
    const auto& [name, values] = checkpoint->tensors[i];
    FUZZ_CHECK(again->tensors[i].first == name);
    FUZZ_CHECK(again->tensors[i].second.size() == values.size());
    FUZZ_CHECK(values.empty() || memcmp(again->tensors[i].second.data(), values.data(),
                                        values.size() * sizeof(float)) == 0);
  }
  return 0;
}

}  // namespace numaserve::fuzz
