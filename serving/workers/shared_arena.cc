#include "serving/workers/shared_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "base/errno_text.h"
#include "base/mutex.h"

namespace numaserve::serving {

absl::StatusOr<std::unique_ptr<SharedArena>> SharedArena::Create(const std::string& name,
                                                                 size_t bytes) {
  // Close-on-exec: no process the server starts inherits it. Its one worker
  // gets it from WorkerSupervisor::Spawn, which places a copy at
  // kWorkerArenaFd in that child alone.
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrFormat("memfd_create(%s): %s", name, base::ErrnoText(errno)));
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(absl::StrFormat("arena %s: cannot size to %d bytes: %s",
                                                        name, bytes, base::ErrnoText(err)));
  }
  // Its size is fixed from here on: a worker cannot shrink the file under
  // the server's mapping (the server's next access would be SIGBUS), nor
  // grow it, nor lift the seals.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int err = errno;
    close(fd);
    return absl::InternalError(
        absl::StrFormat("arena %s: cannot seal its size: %s", name, base::ErrnoText(err)));
  }
  auto arena = Attach(fd, bytes);
  if (!arena.ok()) close(fd);
  return arena;
}

absl::StatusOr<std::unique_ptr<SharedArena>> SharedArena::Attach(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(
        absl::StrFormat("mmap of arena (%d bytes): %s", bytes, base::ErrnoText(errno)));
  }
  return std::unique_ptr<SharedArena>(new SharedArena(fd, static_cast<char*>(p), bytes));
}

SharedArena::~SharedArena() {
  munmap(data_, size_);
  close(fd_);
}

namespace {
constexpr size_t kAlign = 64;
size_t RoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

ArenaAllocator::ArenaAllocator(size_t capacity) : capacity_(capacity / kAlign * kAlign) {
  if (capacity_ > 0) free_[0] = capacity_;
}

std::optional<uint64_t> ArenaAllocator::Allocate(size_t bytes) {
  size_t need = RoundUp(bytes == 0 ? 1 : bytes);
  base::MutexLock lock(&mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    uint64_t offset = it->first;
    size_t left = it->second - need;
    free_.erase(it);
    if (left > 0) free_[offset + need] = left;
    used_[offset] = need;
    return offset;
  }
  return std::nullopt;
}

void ArenaAllocator::Free(uint64_t offset) {
  base::MutexLock lock(&mu_);
  auto u = used_.find(offset);
  if (u == used_.end()) return;
  size_t length = u->second;
  used_.erase(u);
  auto next = free_.lower_bound(offset);
  // Merge with the following free range.
  if (next != free_.end() && offset + length == next->first) {
    length += next->second;
    next = free_.erase(next);
  }
  // Merge with the preceding free range.
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += length;
      return;
    }
  }
  free_[offset] = length;
}

size_t ArenaAllocator::used() const {
  base::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [offset, length] : used_) n += length;
  return n;
}

size_t ArenaBytesForBatches(size_t bytes_for_two, int batches) {
  if (batches <= 2) return bytes_for_two;
  // Rounded up to whole pages so every worker's mapping stays page-sized.
  const size_t bytes = bytes_for_two / 2 * static_cast<size_t>(batches);
  constexpr size_t kPage = 4096;
  return (bytes + kPage - 1) / kPage * kPage;
}

}  // namespace numaserve::serving
