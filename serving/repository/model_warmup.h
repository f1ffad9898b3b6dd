// Triton's model_warmup in config.pbtxt: runs of the model at given input
// shapes when it loads, before it reports ready, so that those signatures
// are planned (and their kernels prepared) before the first request pays
// for it. Read here (from Triton's schema too) and checked against the
// model; the workers run them (serving/workers/warmup.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/ir/types.h"
#include "model_config.pb.h"

namespace numaserve::serving {

// Warm-ups one model may list, and runs one warm-up may ask for.
inline constexpr int kMaxWarmups = 64;
inline constexpr uint32_t kMaxWarmupCount = 1000;
// Elements of one warm-up input (1 GiB of FP32): the worker allocates them.
inline constexpr int64_t kMaxWarmupElements = int64_t{1} << 28;

// The input shapes, in model order, of model_warmup entry `index` of `c`:
// [batch_size] + dims for a batched config (max_batch_size > 0), dims
// otherwise. INVALID_ARGUMENT naming the model, the entry and the field
// for: more than kMaxWarmups entries, a count above kMaxWarmupCount, a
// batch_size outside 1..max_batch_size (0 or 1 without batching), a model
// input missing or an unknown one, a data_type other than the input's,
// neither or both of zero_data and random_data, dims of another rank, a
// fixed dim of another size or a dynamic one below 1, an input over
// kMaxWarmupElements. Dims of one name that differ are the engine's to
// refuse when the warm-up runs (the model then fails to load, naming them).
absl::StatusOr<std::vector<std::vector<int64_t>>> WarmupInputShapes(const config::ModelConfig& c,
                                                                    int index,
                                                                    const std::string& model,
                                                                    const engine::ModelInfo& info);

// WarmupInputShapes of every entry: OK when all are.
absl::Status CheckWarmups(const config::ModelConfig& c, const std::string& model,
                          const engine::ModelInfo& info);

}  // namespace numaserve::serving
