// Batch groups: a large batch on many threads computed as several smaller
// batches at once, each by its own copy of the model on its own share of the
// threads (CompileOptions::batch_groups).
//
// Tried for large batches on many threads, and off by default: one OpenMP
// team of 16 threads on one batch left the 16-core Xeon's cpus ~75% busy
// at batch 32 (threads waiting inside each oneDNN primitive for the
// slowest), and smaller teams, each with primitives sized for it, might
// wait less. Measured there at batch 32 on 16 threads, inferences/s, one
// team against 4 groups of 4 threads: a first run, one after the other,
// ResNet-50 144 -> 160, BERT-base 47.2 -> 46.5, MobileNetV2 1029 -> 1203;
// a second run, the two alternated twice, 150.8 / 151.6 -> 146.0 / 153.6,
// 43.4 / 44.0 -> 45.0 / 44.9, 1138 / 1285 -> 1129 / 1174: within the
// host's noise. Kept as an option (bench --batch-groups) to measure on
// other machines.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model.h"

namespace numaserve::engine {

// The groups a batch splits into for a model compiled with `options` on
// `threads` threads: options.batch_groups, at most `threads` (1: none).
int BatchGroupsFor(const CompileOptions& options, int threads);

// The fewest rows a group runs: at least 4, and enough that a group's share
// of a model doing `flops_per_row` is at least 1 GFLOP (a small model gains
// nothing from the hand-off). 0 where the model counts no FLOPs (never
// grouped).
int64_t MinRowsPerGroup(double flops_per_row);

// Wraps `full` (the model compiled on all `threads` threads, which runs
// every batch too small to split) with `groups` copies loaded from `path`,
// each on its own thread with an OpenMP team of its share of the threads,
// pinned to its share of the calling thread's cpus where there are enough
// of them. A batch of at least `groups` x MinRowsPerGroup rows runs as
// `groups` contiguous row ranges at once, one per copy; a smaller one on
// `full`. Returns `full`
// unchanged (and says why on stderr) where grouping cannot apply: a model
// whose rows are not independent (ModelInfo::batched), an input or output
// whose dims after the rows are not fixed, or copies whose weights would
// take more than half the available memory.
absl::StatusOr<std::unique_ptr<CompiledModel>> WrapInBatchGroups(
    std::unique_ptr<CompiledModel> full, const std::string& path, const CompileOptions& options,
    int threads, int groups);

}  // namespace numaserve::engine
