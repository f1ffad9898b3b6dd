// Shared memory between the server and one worker: a memfd mapped by both.
// The server gathers a batch's inputs into it, the worker computes in place
// and writes outputs back into it; the control socket carries only offsets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"

namespace numaserve::serving {

class SharedArena {
 public:
  // Creates an anonymous shared file of `bytes` and maps it. Pages are
  // allocated on first touch, so a large arena costs only what is used.
  // The file is close-on-exec (a child gets it only when handed it on
  // purpose, as each worker gets its own) and sealed at its size
  // (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL).
  static absl::StatusOr<std::unique_ptr<SharedArena>> Create(const std::string& name, size_t bytes);
  // Maps an arena created by another process (the fd was handed over).
  static absl::StatusOr<std::unique_ptr<SharedArena>> Attach(int fd, size_t bytes);
  ~SharedArena();

  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  int fd() const { return fd_; }
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  SharedArena(int fd, char* data, size_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_;
  char* data_;
  size_t size_;
};

// The arena size for `batches` commands in flight when `bytes_for_two` holds
// two (one computing, the next one's inputs being copied): it grows in
// proportion, and never shrinks below `bytes_for_two`.
size_t ArenaBytesForBatches(size_t bytes_for_two, int batches);

// First-fit allocation of 64-byte aligned ranges of an arena. Thread-safe.
class ArenaAllocator {
 public:
  explicit ArenaAllocator(size_t capacity);
  // The offset of a free range of at least `bytes`, or nullopt when full.
  std::optional<uint64_t> Allocate(size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void Free(uint64_t offset) ABSL_LOCKS_EXCLUDED(mu_);
  size_t capacity() const { return capacity_; }
  size_t used() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t capacity_;
  mutable base::Mutex mu_;
  std::map<uint64_t, size_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> length, coalesced
  std::map<uint64_t, size_t> used_ ABSL_GUARDED_BY(mu_);  // offset -> length
};

}  // namespace numaserve::serving
