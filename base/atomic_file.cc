#include "base/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/errno_text.h"

namespace numaserve::base {
namespace {

absl::Status ErrnoStatus(int err, const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", ErrnoText(err)));
}

// The directory `path` is in, for opening it.
std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

absl::StatusOr<TempFile> CreateTempFileBeside(const std::string& target, mode_t mode) {
  TempFile tmp;
  tmp.path = absl::StrCat(target, ".tmp.XXXXXX");
  tmp.fd = mkostemp(tmp.path.data(), O_CLOEXEC);
  if (tmp.fd < 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot create a temporary file beside ", target));
  }
  if (fchmod(tmp.fd, mode) != 0) {
    const int err = errno;
    DiscardTempFile(tmp);
    return ErrnoStatus(err, absl::StrCat("chmod ", tmp.path));
  }
  return tmp;
}

void DiscardTempFile(TempFile& tmp) {
  if (tmp.fd >= 0) close(tmp.fd);
  tmp.fd = -1;
  if (!tmp.path.empty()) unlink(tmp.path.c_str());
}

absl::Status RenameIntoPlace(TempFile& tmp, const std::string& target) {
  if (tmp.fd >= 0) {
    if (fsync(tmp.fd) != 0) {
      const int err = errno;
      DiscardTempFile(tmp);
      return ErrnoStatus(err, absl::StrCat("fsync ", tmp.path));
    }
    const int fd = tmp.fd;
    tmp.fd = -1;
    if (close(fd) != 0) {
      const int err = errno;
      DiscardTempFile(tmp);
      return ErrnoStatus(err, absl::StrCat("close ", tmp.path));
    }
  }
  if (rename(tmp.path.c_str(), target.c_str()) != 0) {
    const int err = errno;
    absl::Status status = ErrnoStatus(err, absl::StrCat("rename ", tmp.path, " -> ", target));
    DiscardTempFile(tmp);
    return status;
  }
  // The rename itself made durable; a directory that cannot be opened for
  // that (no read permission) leaves it to the file system.
  const int dir = open(DirectoryOf(target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    fsync(dir);
    close(dir);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& target, std::string_view bytes, mode_t mode) {
  absl::StatusOr<TempFile> tmp = CreateTempFileBeside(target, mode);
  if (!tmp.ok()) return tmp.status();
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(tmp->fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      DiscardTempFile(*tmp);
      return ErrnoStatus(err, absl::StrCat("write ", tmp->path));
    }
    done += static_cast<size_t>(n);
  }
  return RenameIntoPlace(*tmp, target);
}

}  // namespace numaserve::base
