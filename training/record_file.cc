#include "training/record_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/atomic_file.h"
#include "base/errno_text.h"

namespace numaserve::training {
namespace {

constexpr char kDataMagic[8] = {'N', 'S', 'R', 'E', 'C', '0', '0', '1'};
constexpr char kIndexMagic[8] = {'N', 'S', 'I', 'D', 'X', '0', '0', '1'};

void Put64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

absl::Status Truncated(const std::string& path, size_t size, const std::string& what) {
  return absl::DataLossError(
      absl::StrCat(path, ": truncated at offset ", size, ": expected ", what));
}

// Checks FILE.idx against the data file `path` of `count` records (count
// already checked against that file's size) of `record` bytes after a
// `header`-byte header: its size (capped before it is read), magic, count
// and the offsets of the records kept; returns how many are kept (`limit`
// > 0 keeps the first).
absl::StatusOr<int64_t> CheckRecordIndex(const std::string& path, uint64_t count, size_t header,
                                         size_t record, int64_t limit) {
  const std::string index_path = path + ".idx";
  // The index is 8 bytes a record: one larger than that is refused before
  // it is read (count is at most the data file's size here, so this fits).
  {
    std::error_code ec;
    const uintmax_t index_size = std::filesystem::file_size(index_path, ec);
    if (!ec && index_size > 16 + 8 * count) {
      return absl::DataLossError(
          absl::StrCat(index_path, ": ", index_size, " bytes, more than the ", 16 + 8 * count,
                       " an index of ", count, " records takes (", path, " has ", count, ")"));
    }
  }
  absl::StatusOr<std::string> index = ReadWholeFile(index_path);
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
  const int64_t size = limit > 0 ? std::min<int64_t>(limit, count) : static_cast<int64_t>(count);
  // Records have one size, so record i is at header + i * record; the index
  // must agree (it is what other readers seek by).
  for (int64_t i = 0; i < size; ++i) {
    uint64_t offset = 0;
    memcpy(&offset, index->data() + 16 + 8 * i, 8);
    if (offset != header + i * record) {
      return absl::DataLossError(absl::StrCat(index_path, ": offset ", 16 + 8 * i, ": record ", i,
                                              " at ", offset, ", expected ", header + i * record));
    }
  }
  return size;
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
  // Through fresh temporary files (base/atomic_file.h): never through a
  // link planted at a predictable name.
  if (absl::Status s = base::WriteFileAtomically(path, bytes); !s.ok()) return s;
  return base::WriteFileAtomically(path + ".idx", index);
}

absl::StatusOr<std::unique_ptr<RecordFileReader>> RecordFileReader::Open(const std::string& path,
                                                                         int64_t limit) {
  std::unique_ptr<RecordFileReader> r(new RecordFileReader());
  r->path_ = path;
  r->fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r->fd_ < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  struct stat st;
  if (fstat(r->fd_, &st) != 0) return absl::InternalError(absl::StrCat(path, ": cannot stat"));
  const size_t file_size = static_cast<size_t>(st.st_size);
  if (file_size < 12) return Truncated(path, file_size, "a 12-byte header");
  char head[12];
  if (absl::Status s = r->ReadAt(0, 12, reinterpret_cast<uint8_t*>(head), "a 12-byte header");
      !s.ok())
    return s;
  if (memcmp(head, kDataMagic, 8) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": offset 0: not a numaserve record file (magic NSREC001)"));
  }
  uint32_t rank = 0;
  memcpy(&rank, head + 8, 4);
  if (rank > 8)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": offset 8: rank ", rank, " (expected <= 8)"));
  const size_t header = 12 + 8 * static_cast<size_t>(rank) + 8;
  if (file_size < header)
    return Truncated(path, file_size, absl::StrCat("a ", header, "-byte header"));
  std::vector<uint64_t> fields(rank + 1);
  if (absl::Status s =
          r->ReadAt(12, 8 * (rank + 1), reinterpret_cast<uint8_t*>(fields.data()), "the header");
      !s.ok())
    return s;
  for (uint32_t i = 0; i < rank; ++i) {
    // A u64 above INT64_MAX turns negative here and is refused below.
    r->dims_.push_back(static_cast<int64_t>(fields[i]));
  }
  const uint64_t count = fields[rank];
  // Sizes from the header are checked, never wrapped: an example of at most
  // kMaxTensorElements bytes, and a count the file's size can hold.
  auto elements = kernels::NumElementsChecked(r->dims_);
  if (!elements.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": offset 12: example dims: ", elements.status().message()));
  }
  const size_t record = 1 + static_cast<size_t>(*elements);
  const uint64_t body = file_size - header;
  if (count > body / record || body != count * record) {
    uint64_t needed = 0;
    const bool wraps = __builtin_mul_overflow(count, uint64_t{record}, &needed) ||
                       __builtin_add_overflow(needed, uint64_t{header}, &needed);
    return absl::DataLossError(absl::StrCat(
        path, ": ", count > body / record ? "truncated at offset " : "trailing bytes from offset ",
        count > body / record ? file_size : header + count * record, ": ", count, " records of ",
        record, " bytes need ", wraps ? std::string("more than 2^64") : absl::StrCat(needed),
        " bytes in all"));
  }
  absl::StatusOr<int64_t> size = CheckRecordIndex(path, count, header, record, limit);
  if (!size.ok()) return size.status();
  r->size_ = *size;
  r->header_bytes_ = static_cast<int64_t>(header);
  r->record_bytes_ = static_cast<int64_t>(record);
  return r;
}

RecordFileReader::~RecordFileReader() {
  if (fd_ >= 0) close(fd_);
}

absl::Status RecordFileReader::ReadAt(int64_t offset, int64_t length, uint8_t* out,
                                      const char* what) {
  int64_t done = 0;
  while (done < length) {
    const ssize_t n = pread(fd_, out + done, static_cast<size_t>(length - done), offset + done);
    reads_.fetch_add(1, std::memory_order_relaxed);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::DataLossError(absl::StrCat(path_, ": read failed at offset ", offset + done,
                                              ": ", base::ErrnoText(errno)));
    }
    if (n == 0) return Truncated(path_, static_cast<size_t>(offset + done), what);
    done += n;
    bytes_.fetch_add(n, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

absl::Status RecordFileReader::Gather(const int64_t* indices, int64_t count, kernels::Tensor* batch,
                                      std::vector<uint8_t>* labels) {
  const int64_t per = record_bytes_ - 1;
  batch->shape = {count, 1};
  batch->shape.insert(batch->shape.end(), dims_.begin(), dims_.end());
  batch->data.resize(count * per);
  labels->resize(count);
  // Batch rows in file order, so adjacent records become one read.
  std::vector<std::pair<int64_t, int64_t>> wanted(count);  // (record, row)
  for (int64_t r = 0; r < count; ++r) {
    if (indices[r] < 0 || indices[r] >= size_) {
      return absl::OutOfRangeError(
          absl::StrCat(path_, ": record ", indices[r], " of ", size_, " requested"));
    }
    wanted[r] = {indices[r], r};
  }
  std::sort(wanted.begin(), wanted.end());
  constexpr float kScale = 1.0f / 255.0f;
  for (size_t begin = 0; begin < wanted.size();) {
    size_t end = begin + 1;  // [begin, end): records first..last, adjacent or repeated
    while (end < wanted.size() && wanted[end].first - wanted[end - 1].first <= 1) ++end;
    const int64_t first = wanted[begin].first;
    const int64_t records = wanted[end - 1].first - first + 1;
    scratch_.resize(records * record_bytes_);
    const std::string what =
        absl::StrCat(records, records == 1 ? " record" : " records", " from record ", first, " (",
                     record_bytes_, " bytes each)");
    if (absl::Status s = ReadAt(header_bytes_ + first * record_bytes_, records * record_bytes_,
                                scratch_.data(), what.c_str());
        !s.ok())
      return s;
    records_.fetch_add(records, std::memory_order_relaxed);
    for (size_t k = begin; k < end; ++k) {
      const uint8_t* src = &scratch_[(wanted[k].first - first) * record_bytes_];
      const int64_t row = wanted[k].second;
      (*labels)[row] = src[0];
      float* dst = &batch->data[row * per];
      for (int64_t i = 0; i < per; ++i) dst[i] = src[1 + i] * kScale;
    }
    begin = end;
  }
  return absl::OkStatus();
}

absl::StatusOr<Dataset> RecordFileReader::ReadAll() {
  Dataset data;
  data.size = size_;
  data.example_dims = dims_;
  const int64_t per = record_bytes_ - 1;
  data.images.resize(size_ * per);
  data.labels.resize(size_);
  // In chunks of about 16 MiB of records.
  const int64_t chunk = std::max<int64_t>(1, (16 << 20) / record_bytes_);
  for (int64_t first = 0; first < size_; first += chunk) {
    const int64_t records = std::min(chunk, size_ - first);
    scratch_.resize(records * record_bytes_);
    const std::string what = absl::StrCat(records, " records from record ", first);
    if (absl::Status s = ReadAt(header_bytes_ + first * record_bytes_, records * record_bytes_,
                                scratch_.data(), what.c_str());
        !s.ok())
      return s;
    records_.fetch_add(records, std::memory_order_relaxed);
    for (int64_t i = 0; i < records; ++i) {
      const uint8_t* src = &scratch_[i * record_bytes_];
      data.labels[first + i] = src[0];
      memcpy(&data.images[(first + i) * per], src + 1, per);
    }
  }
  std::vector<uint8_t>().swap(scratch_);
  return data;
}

absl::StatusOr<Dataset> ReadRecordFile(const std::string& path, int64_t limit) {
  absl::StatusOr<std::unique_ptr<RecordFileReader>> reader = RecordFileReader::Open(path, limit);
  if (!reader.ok()) return reader.status();
  return (*reader)->ReadAll();
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
      absl::StatusOr<std::string> bytes = ReadWholeFile(file.string());
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
