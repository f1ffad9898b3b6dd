#include "training/checkpoint.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/atomic_file.h"

namespace numaserve::training {
namespace {
constexpr char kMagic[8] = {'N', 'S', 'C', 'K', 'P', 'T', '0', '1'};

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}
}  // namespace

absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& checkpoint) {
  std::string bytes(kMagic, sizeof(kMagic));
  Put<uint64_t>(bytes, checkpoint.step);
  Put<uint64_t>(bytes, checkpoint.tensors.size());
  for (const auto& [name, values] : checkpoint.tensors) {
    Put<uint32_t>(bytes, name.size());
    bytes += name;
    Put<uint64_t>(bytes, values.size());
    bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  return base::WriteFileAtomically(path, bytes);
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": cannot open checkpoint"));
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  size_t off = 0;
  auto need = [&](size_t n, const char* what) -> absl::Status {
    if (bytes.size() - off < n) {
      return absl::DataLossError(absl::StrCat(path, ": truncated at offset ", bytes.size(),
                                              " while reading ", what, " at offset ", off));
    }
    return absl::OkStatus();
  };
  auto get64 = [&](uint64_t* v) {
    memcpy(v, bytes.data() + off, 8);
    off += 8;
  };
  if (absl::Status s = need(24, "the header"); !s.ok()) return s;
  if (memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": offset 0: not a numaserve checkpoint (magic NSCKPT01)"));
  }
  off = 8;
  Checkpoint checkpoint;
  uint64_t step = 0, count = 0;
  get64(&step);
  get64(&count);
  checkpoint.step = static_cast<int64_t>(step);
  for (uint64_t t = 0; t < count; ++t) {
    if (absl::Status s = need(4, "a tensor name length"); !s.ok()) return s;
    uint32_t name_len = 0;
    memcpy(&name_len, bytes.data() + off, 4);
    off += 4;
    // In size_t: name_len + 8 in uint32 wraps for lengths near 2^32.
    if (absl::Status s = need(static_cast<size_t>(name_len) + 8, "a tensor name"); !s.ok()) {
      return s;
    }
    std::string name = bytes.substr(off, name_len);
    off += name_len;
    uint64_t n = 0;
    get64(&n);
    // Compared as a count (n * 4 could wrap): nothing is allocated for
    // elements the file does not hold.
    if (n > (bytes.size() - off) / sizeof(float)) {
      return absl::DataLossError(absl::StrCat(path, ": truncated at offset ", bytes.size(),
                                              ": tensor '", name, "' needs ", n,
                                              " float32 elements at offset ", off, ", only ",
                                              (bytes.size() - off) / sizeof(float), " remain"));
    }
    std::vector<float> values(n);
    if (n > 0)
      memcpy(values.data(), bytes.data() + off, n * sizeof(float));  // 0: data() may be null
    off += n * sizeof(float);
    checkpoint.tensors.emplace_back(std::move(name), std::move(values));
  }
  if (off != bytes.size()) {
    return absl::DataLossError(
        absl::StrCat(path, ": offset ", off, ": ", bytes.size() - off, " trailing bytes"));
  }
  return checkpoint;
}

}  // namespace numaserve::training
