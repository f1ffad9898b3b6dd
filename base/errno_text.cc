#include "base/errno_text.h"

#include <string.h>

#include "absl/strings/str_cat.h"

namespace numaserve::base {

std::string ErrnoText(int err) {
  char buffer[256];
  // GNU strerror_r: returns a static string or one it wrote into `buffer`.
  return strerror_r(err, buffer, sizeof(buffer));
}

std::string SignalText(int signal_number) {
  // glibc's sigdescr_np reads a constant table (no shared buffer).
  const char* text = sigdescr_np(signal_number);
  return text != nullptr ? std::string(text) : absl::StrCat("signal ", signal_number);
}

}  // namespace numaserve::base
