#include "engine/training/record_file.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace numaserve::training {
namespace {

constexpr char kDataMagic[8] = {'N', 'S', 'R', 'E', 'C', '0', '0', '1'};
constexpr char kIndexMagic[8] = {'N', 'S', 'I', 'D', 'X', '0', '0', '1'};

void Put64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

absl::Status WriteAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) return absl::InternalError(absl::StrCat(tmp, ": write failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp, " -> ", path, " failed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

absl::Status Truncated(const std::string& path, size_t size, const std::string& what) {
  return absl::DataLossError(
      absl::StrCat(path, ": truncated at offset ", size, ": expected ", what));
}

}  // namespace

absl::Status WriteRecordFile(const std::string& path, const Dataset& data) {
  const int64_t per = data.example_elements();
  std::string bytes(kDataMagic, 8);
  const uint32_t rank = static_cast<uint32_t>(data.example_dims.size());
  bytes.append(reinterpret_cast<const char*>(&rank), 4);
  for (int64_t d : data.example_dims) Put64(bytes, d);
  Put64(bytes, data.size);
  std::string index(kIndexMagic, 8);
  Put64(index, data.size);
  for (int64_t i = 0; i < data.size; ++i) {
    Put64(index, bytes.size());
    bytes.push_back(static_cast<char>(data.labels[i]));
    bytes.append(reinterpret_cast<const char*>(&data.images[i * per]), per);
  }
  if (absl::Status s = WriteAtomically(path, bytes); !s.ok()) return s;
  return WriteAtomically(path + ".idx", index);
}

absl::StatusOr<Dataset> ReadRecordFile(const std::string& path, int64_t limit) {
  absl::StatusOr<std::string> bytes = ReadAll(path);
  if (!bytes.ok()) return bytes.status();
  const std::string& b = *bytes;
  if (b.size() < 12) return Truncated(path, b.size(), "a 12-byte header");
  if (memcmp(b.data(), kDataMagic, 8) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": offset 0: not a numaserve record file (magic NSREC001)"));
  }
  uint32_t rank = 0;
  memcpy(&rank, b.data() + 8, 4);
  if (rank > 8)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": offset 8: rank ", rank, " (expected <= 8)"));
  const size_t header = 12 + 8 * static_cast<size_t>(rank) + 8;
  if (b.size() < header)
    return Truncated(path, b.size(), absl::StrCat("a ", header, "-byte header"));
  Dataset data;
  for (uint32_t i = 0; i < rank; ++i) {
    uint64_t d = 0;
    memcpy(&d, b.data() + 12 + 8 * i, 8);
    data.example_dims.push_back(static_cast<int64_t>(d));
  }
  uint64_t count = 0;
  memcpy(&count, b.data() + header - 8, 8);
  const int64_t per = data.example_elements();
  const size_t record = 1 + static_cast<size_t>(per);
  if (b.size() != header + count * record) {
    return absl::DataLossError(absl::StrCat(
        path, ": ",
        b.size() < header + count * record ? "truncated at offset " : "trailing bytes from offset ",
        std::min(b.size(), header + count * record), ": ", count, " records of ", record,
        " bytes need ", header + count * record, " bytes in all"));
  }
  const std::string index_path = path + ".idx";
  absl::StatusOr<std::string> index = ReadAll(index_path);
  if (!index.ok()) return index.status();
  if (index->size() < 16 || memcmp(index->data(), kIndexMagic, 8) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": offset 0: not a numaserve record index (magic NSIDX001)"));
  }
  uint64_t index_count = 0;
  memcpy(&index_count, index->data() + 8, 8);
  if (index_count != count || index->size() != 16 + 8 * count) {
    return absl::DataLossError(absl::StrCat(index_path, ": lists ", index_count, " records in ",
                                            index->size(), " bytes; ", path, " has ", count));
  }
  data.size = limit > 0 ? std::min<int64_t>(limit, count) : static_cast<int64_t>(count);
  data.images.resize(data.size * per);
  data.labels.resize(data.size);
  for (int64_t i = 0; i < data.size; ++i) {
    uint64_t offset = 0;
    memcpy(&offset, index->data() + 16 + 8 * i, 8);
    if (offset != header + i * record) {
      return absl::DataLossError(absl::StrCat(index_path, ": offset ", 16 + 8 * i, ": record ", i,
                                              " at ", offset, ", expected ", header + i * record));
    }
    data.labels[i] = static_cast<uint8_t>(b[offset]);
    memcpy(&data.images[i * per], b.data() + offset + 1, per);
  }
  return data;
}

absl::StatusOr<Dataset> ReadRawTensorDirectory(const std::string& dir,
                                               const std::vector<int64_t>& dims) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  std::vector<std::pair<int, fs::path>> labels;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    int label = 0;
    if (!e.is_directory() || !absl::SimpleAtoi(e.path().filename().string(), &label) || label < 0 ||
        label > 255) {
      return absl::InvalidArgumentError(
          absl::StrCat(e.path().string(), ": expected a directory named by a label 0..255"));
    }
    labels.emplace_back(label, e.path());
  }
  std::sort(labels.begin(), labels.end());
  Dataset data;
  data.example_dims = dims;
  const int64_t per = data.example_elements();
  for (const auto& [label, path] : labels) {
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      absl::StatusOr<std::string> bytes = ReadAll(file.string());
      if (!bytes.ok()) return bytes.status();
      if (static_cast<int64_t>(bytes->size()) != per) {
        return absl::InvalidArgumentError(absl::StrCat(file.string(), ": ", bytes->size(),
                                                       " bytes, expected ", per,
                                                       " (uint8 example of the given shape)"));
      }
      data.images.insert(data.images.end(), bytes->begin(), bytes->end());
      data.labels.push_back(static_cast<uint8_t>(label));
      ++data.size;
    }
  }
  return data;
}

}  // namespace numaserve::training
