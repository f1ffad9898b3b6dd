// Replacing a file whole: readers see the old file or the new one, never a
// part, and no link planted under a predictable temporary name redirects
// the write. The new contents go to a fresh file in the target's directory,
// created under a random name with O_EXCL (never an existing file, never
// through a symbolic link), and are renamed over the target.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace numaserve::base {

// A temporary file beside the file it will replace.
struct TempFile {
  int fd = -1;       // open for writing, close-on-exec; -1 once closed
  std::string path;  // "<target>.tmp.XXXXXX", the X's random
};

// Creates "<target>.tmp.XXXXXX" with mkostemp (O_CREAT | O_EXCL |
// O_CLOEXEC, mode 0600) and sets its mode to `mode`.
absl::StatusOr<TempFile> CreateTempFileBeside(const std::string& target, mode_t mode);

// Syncs and closes `tmp` (unless its fd is already -1) and renames it to
// `target`, then syncs the directory. rename replaces a symbolic link at
// `target` itself, never the file it points to. On failure `tmp` is
// removed and the status names the step and the file.
absl::Status RenameIntoPlace(TempFile& tmp, const std::string& target);

// Closes and removes `tmp`: for a writer that gives up.
void DiscardTempFile(TempFile& tmp);

// CreateTempFileBeside, `bytes` written, RenameIntoPlace.
absl::Status WriteFileAtomically(const std::string& target, std::string_view bytes,
                                 mode_t mode = 0644);

}  // namespace numaserve::base
