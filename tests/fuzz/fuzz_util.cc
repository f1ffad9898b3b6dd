#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "tests/fuzz/fuzz_target.h"

namespace numaserve::fuzz {
namespace {

[[noreturn]] void Fatal(const std::string& what) {
  fprintf(stderr, "fuzz: %s: %s\n", what.c_str(), strerror(errno));
  abort();
}

void WriteAll(int fd, std::string_view bytes) {
  if (ftruncate(fd, 0) != 0) Fatal("ftruncate");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = pwrite(fd, bytes.data() + done, bytes.size() - done, done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) Fatal("pwrite");
    done += static_cast<size_t>(n);
  }
}

// Removes the scratch directory when the process exits normally (libFuzzer
// exits normally at the end of -max_total_time; after a crash it is left
// behind, as is the crash input).
class Scratch {
 public:
  Scratch() {
    const char* tmp = getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/numaserve-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) Fatal("mkdtemp " + pattern);
    path_ = pattern;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

void CheckFailed(const char* file, int line, const char* what) {
  fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", file, line, what);
  abort();
}

std::string MemoryFile(int slot, std::string_view bytes) {
  static std::map<int, int> fds;
  auto [it, added] = fds.emplace(slot, -1);
  if (added) {
    it->second = memfd_create("numaserve-fuzz", MFD_CLOEXEC);
    if (it->second < 0) Fatal("memfd_create");
  }
  WriteAll(it->second, bytes);
  return "/proc/self/fd/" + std::to_string(it->second);
}

const std::string& ScratchDirectory() {
  static const Scratch scratch;
  return scratch.path();
}

std::string WriteScratchFile(const std::string& name, std::string_view bytes) {
  const std::string path = ScratchDirectory() + "/" + name;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) Fatal("open " + path);
  WriteAll(fd, bytes);
  close(fd);
  return path;
}

}  // namespace numaserve::fuzz
