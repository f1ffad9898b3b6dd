// The text of an errno value or a signal number, safe to call from any
// thread: strerror and strsignal may return a buffer they share between
// threads (POSIX does not require them to be thread-safe; clang-tidy's
// concurrency-mt-unsafe flags them).
#pragma once

#include <string>

namespace numaserve::base {

// "No such file or directory" for ENOENT; "Unknown error N" for others.
std::string ErrnoText(int err);

// "Killed" for SIGKILL; "signal N" where the C library has no text.
std::string SignalText(int signal_number);

}  // namespace numaserve::base
