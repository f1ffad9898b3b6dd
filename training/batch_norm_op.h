// BatchNormalization for training (NCHW or NC): in training mode batch
// statistics per channel normalize the input and the running mean and
// variance (the node's inputs 3 and 4, state the net owns) move toward them
// by `momentum`; in inference mode the running statistics are used.
// Signatures are TrainingOp's (training_ops.h).
//
// Forward and backward run on oneDNN's batch normalization primitives
// (kernels/onednn/training_onednn.h) unless conv_pool::SetImplementation
// (TrainOptions::reference_ops) selects the reference, the loops kept here,
// which also run when oneDNN rejects a shape.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/ir/graph.h"
#include "kernels/tensor.h"

namespace numaserve::training::batch_norm {

// Calls that oneDNN could not make a primitive for and the reference ran.
int64_t ReferenceFallbacks();

absl::Status Forward(const engine::Graph& graph, const engine::Node& node,
                     const std::vector<const kernels::Tensor*>& inputs,
                     std::vector<kernels::Tensor*>& outputs);
absl::Status Backward(const engine::Graph& graph, const engine::Node& node,
                      const std::vector<const kernels::Tensor*>& inputs,
                      const std::vector<const kernels::Tensor*>& outputs,
                      const std::vector<const kernels::Tensor*>& output_grads,
                      std::vector<kernels::Tensor*>& input_grads);

}  // namespace numaserve::training::batch_norm
