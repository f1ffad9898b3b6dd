// LayerNormalization for training: each row (the dims from `axis` on) is
// normalized with its own mean and variance, then scaled and shifted.
// Signatures are TrainingOp's (training_ops.h). Only the Y output.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "engine/graph.h"
#include "kernels/tensor.h"

namespace numaserve::training::layer_norm {

absl::Status Forward(const engine::Graph& graph, const engine::Node& node,
                     const std::vector<const kernels::Tensor*>& inputs,
                     std::vector<kernels::Tensor*>& outputs);
absl::Status Backward(const engine::Graph& graph, const engine::Node& node,
                      const std::vector<const kernels::Tensor*>& inputs,
                      const std::vector<const kernels::Tensor*>& outputs,
                      const std::vector<const kernels::Tensor*>& output_grads,
                      std::vector<kernels::Tensor*>& input_grads);

}  // namespace numaserve::training::layer_norm
