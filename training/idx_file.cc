#include "training/idx_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/atomic_file.h"
#include "base/errno_text.h"

namespace numaserve::training {
namespace {

// Reads the whole (possibly gzipped) file into memory, at most `max_bytes`
// of it (a small gzip stream may expand without bound). gzread reads plain
// files transparently, so one path serves both.
absl::StatusOr<std::vector<uint8_t>> ReadAllBytes(const std::string& path, uint64_t max_bytes) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", base::ErrnoText(errno)));
  }
  std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(file, gzclose);
  gzbuffer(file, 1 << 20);
  std::vector<uint8_t> bytes;
  constexpr size_t kChunk = 1 << 20;
  while (true) {
    const size_t old_size = bytes.size();
    bytes.resize(old_size + kChunk);
    const int got = gzread(file, bytes.data() + old_size, kChunk);
    if (got < 0) {
      int errnum = 0;
      const char* message = gzerror(file, &errnum);
      return absl::DataLossError(absl::StrCat(path, ": corrupt compressed data near offset ",
                                              old_size, " (uncompressed): ", message));
    }
    bytes.resize(old_size + got);
    if (got == 0) break;
    if (bytes.size() > max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": more than ", max_bytes,
                       " bytes (uncompressed), the limit for this IDX file with its header"));
    }
  }
  // A gzip stream that ends early makes gzread return the bytes it had and
  // set Z_BUF_ERROR ("unexpected end of file").
  int errnum = 0;
  const char* message = gzerror(file, &errnum);
  if (errnum != Z_OK && errnum != Z_STREAM_END) {
    return absl::DataLossError(absl::StrCat(path,
                                            ": corrupt or truncated compressed data at offset ",
                                            bytes.size(), " (uncompressed): ", message));
  }
  return bytes;
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path, uint64_t max_bytes) {
  constexpr uint64_t kMaxHeader = 4 + 4 * 8;
  absl::StatusOr<std::vector<uint8_t>> bytes =
      ReadAllBytes(path, max_bytes > UINT64_MAX - kMaxHeader ? UINT64_MAX : max_bytes + kMaxHeader);
  if (!bytes.ok()) return bytes.status();
  std::vector<uint8_t>& b = *bytes;
  if (b.size() < 4) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated at offset ", b.size(), ": expected a 4-byte IDX magic"));
  }
  if (b[0] != 0 || b[1] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": offset 0: not an IDX file (magic must start with two zero bytes)"));
  }
  if (b[2] != 0x08) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": offset 2: IDX data type 0x", absl::Hex(b[2]),
                     " is not supported (expected 0x08, unsigned byte)"));
  }
  const int rank = b[3];
  if (rank < 1 || rank > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": offset 3: IDX rank ", rank, " (expected 1 to 8)"));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (b.size() < header) {
    return absl::DataLossError(absl::StrCat(path, ": truncated at offset ", b.size(),
                                            ": the header needs ", header, " bytes"));
  }
  IdxArray array;
  // Up to 8 dims of up to 2^32 - 1: the product is checked, never wrapped
  // (a wrapped count could match a short body and describe data that is
  // not there). The product of the dims other than 0 is held to the same
  // limit: an empty array of 0 x 3275520 x 65535 x 4278190080 would
  // otherwise pass (0 bytes) with rows no caller can size.
  uint64_t count = 1, nonzero = 1;
  bool overflow = false;
  for (int i = 0; i < rank; ++i) {
    const uint32_t dim = BigEndian32(&b[4 + 4 * i]);
    array.dims.push_back(dim);
    overflow = overflow || __builtin_mul_overflow(count, uint64_t{dim}, &count);
    if (dim != 0) overflow = overflow || __builtin_mul_overflow(nonzero, uint64_t{dim}, &nonzero);
  }
  if (overflow || count > max_bytes || nonzero > max_bytes) {
    std::string dims;
    for (int64_t d : array.dims) absl::StrAppend(&dims, dims.empty() ? "" : "x", d);
    return absl::InvalidArgumentError(absl::StrCat(path, ": offset 4: dims ", dims,
                                                   " describe more than ", max_bytes,
                                                   " bytes, the limit for an IDX file"));
  }
  if (b.size() - header < count) {
    return absl::DataLossError(absl::StrCat(path, ": truncated at offset ", b.size(), ": expected ",
                                            header + count, " bytes for dims of ", count,
                                            " elements"));
  }
  if (b.size() - header > count) {
    return absl::DataLossError(absl::StrCat(path, ": offset ", header + count, ": ",
                                            b.size() - header - count,
                                            " unexpected trailing bytes after the data"));
  }
  b.erase(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(header));  // no second copy
  array.data = std::move(b);
  return array;
}

absl::Status WriteIdxFile(const std::string& path, const IdxArray& array, bool gzip) {
  std::vector<uint8_t> bytes = {0, 0, 0x08, static_cast<uint8_t>(array.dims.size())};
  for (int64_t d : array.dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back((d >> shift) & 0xff);
  }
  bytes.insert(bytes.end(), array.data.begin(), array.data.end());
  if (!gzip)
    return base::WriteFileAtomically(path,
                                     {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  // A fresh temporary file (base/atomic_file.h), never one through a link
  // planted at a predictable name; zlib writes a copy of its descriptor
  // and closes that, the file is synced and renamed through the original.
  absl::StatusOr<base::TempFile> tmp = base::CreateTempFileBeside(path, 0644);
  if (!tmp.ok()) return tmp.status();
  const int copy = fcntl(tmp->fd, F_DUPFD_CLOEXEC, 0);
  gzFile file = copy < 0 ? nullptr : gzdopen(copy, "wb");
  if (file == nullptr) {
    if (copy >= 0) close(copy);
    base::DiscardTempFile(*tmp);
    return absl::InternalError(absl::StrCat(tmp->path, ": cannot write gzip"));
  }
  const int wrote = gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  if (gzclose(file) != Z_OK || wrote != static_cast<int>(bytes.size())) {
    base::DiscardTempFile(*tmp);
    return absl::InternalError(absl::StrCat(tmp->path, ": write failed"));
  }
  return base::RenameIntoPlace(*tmp, path);
}

}  // namespace numaserve::training
