#include "base/child_fds.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

namespace numaserve::base {

int DescriptorLimit() {
  constexpr rlim_t kMost = rlim_t{1} << 20;  // Linux's default fs.nr_open
  struct rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return static_cast<int>(kMost);
  rlim_t bound = limit.rlim_cur;
  if (limit.rlim_max != RLIM_INFINITY) bound = std::max(bound, limit.rlim_max);
  if (bound == RLIM_INFINITY || bound > kMost) bound = kMost;
  return static_cast<int>(bound);
}

void CloseDescriptorsFrom(int first, int limit) {
  if (first < 0) first = 0;
  if (close_range(static_cast<unsigned>(first), ~0U, 0) == 0) return;
  for (int fd = first; fd < limit; ++fd) close(fd);
}

}  // namespace numaserve::base
