// What a child process keeps of its parent's open files across exec. The
// server's files are close-on-exec where it opens them, but libraries and
// other threads open files too (a gRPC connection, a config being read while
// a worker is forked): a child closes everything above what it is handed
// before it execs, so nothing else reaches a worker or a training job.
#pragma once

namespace numaserve::base {

// The bound below which CloseDescriptorsFrom's fallback closes: the
// process's file limit (RLIMIT_NOFILE, the hard one where it is finite),
// at most 1 << 20. Call it before fork.
int DescriptorLimit();

// For a child between fork and exec (async-signal-safe): closes every
// descriptor numbered `first` or more with close_range(2); where the kernel
// refuses it (before Linux 5.9, or a seccomp filter), close() on each
// number from `first` below `limit` (DescriptorLimit() read before fork).
void CloseDescriptorsFrom(int first, int limit);

}  // namespace numaserve::base
