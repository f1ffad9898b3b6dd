// .npy files (`numaserve infer --input name=file.npy`): ReadNpy on arbitrary
// bytes. An accepted array holds exactly the bytes its dtype and shape
// describe.
#include <cstdint>

#include "tests/fuzz/fuzz_target.h"
#include "tools/numaserve/npy.h"

namespace numaserve::fuzz {

int FuzzOne(const uint8_t* data, size_t size) {
  absl::StatusOr<cli::NpyArray> array = cli::ReadNpy(MemoryFile(0, AsText(data, size)));
  if (!array.ok()) return 0;
  std::string dtype = array->dtype;
  absl::StatusOr<size_t> item = cli::NormalizeDescr(&dtype);
  FUZZ_CHECK(item.ok());
  FUZZ_CHECK(dtype == array->dtype);  // already normalized
  size_t bytes = *item;
  for (int64_t d : array->shape) {
    FUZZ_CHECK(d >= 0);
    bytes *= static_cast<size_t>(d);
  }
  FUZZ_CHECK(array->data.size() == bytes);
  return 0;
}

}  // namespace numaserve::fuzz
