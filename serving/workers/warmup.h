// config.pbtxt's model_warmup as a worker runs it: each copy of a model,
// once loaded and before the load is answered, runs every warm-up at its
// input shapes, so that the model reports ready with those signatures
// planned and their kernels prepared.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "engine/model.h"
#include "worker.pb.h"

namespace numaserve::serving {

// Runs `load`'s warm-ups on `model`, in order, each `count` times at its
// input shapes (CompiledModel::Run at a signature; a model whose only
// dynamic dims are dims 0 shares the plan with its batch size) on buffers
// of its own: zeros, or random values (uniform in [0, 1) for FP32 and FP64;
// 0 or 1 in the lowest byte of each element of another type). The first
// error is the load's, naming the warm-up ("warm-up 'zeros': ..."). Appends
// "'zeros' 2 runs in 3.1 ms" per warm-up to `report` (may be null).
absl::Status RunWarmups(engine::CompiledModel& model, const worker::LoadModel& load,
                        std::string* report);

}  // namespace numaserve::serving
