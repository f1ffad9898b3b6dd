// BatchNormalization for training (NCHW or NC): in training mode batch
// statistics per channel normalize the input and the running mean and
// variance (the node's inputs 3 and 4, state the net owns) move toward them
// by `momentum`; in inference mode the running statistics are used.
// Signatures are TrainingOp's (training_ops.h).
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "engine/graph.h"
#include "kernels/tensor.h"

namespace numaserve::training::batch_norm {

absl::Status Forward(const engine::Graph& graph, const engine::Node& node,
                     const std::vector<const kernels::Tensor*>& inputs,
                     std::vector<kernels::Tensor*>& outputs);
absl::Status Backward(const engine::Graph& graph, const engine::Node& node,
                      const std::vector<const kernels::Tensor*>& inputs,
                      const std::vector<const kernels::Tensor*>& outputs,
                      const std::vector<const kernels::Tensor*>& output_grads,
                      std::vector<kernels::Tensor*>& input_grads);

}  // namespace numaserve::training::batch_norm
