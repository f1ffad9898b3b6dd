// Training forward and backward of the convolutional ops (2-D, NCHW):
// Conv (groups, strides, pads, dilations), MaxPool and AveragePool run on
// oneDNN's training primitives (kernels/onednn/training_onednn.h). The reference
// implementation, kept for tests and for geometries oneDNN rejects, is
// im2col + oneDNN sgemm over the whole batch for Conv and OpenMP loops for
// the pools; GlobalAveragePool is a loop. Signatures are TrainingOp's
// (training_ops.h).
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "engine/ir/graph.h"
#include "kernels/tensor.h"

namespace numaserve::training::conv_pool {

using kernels::Tensor;

// Which implementation Conv, MaxPool and AveragePool use, process-wide:
// oneDNN (the default) or the reference (tests compare the two).
enum class Implementation { kOnednn, kReference };
void SetImplementation(Implementation implementation);
Implementation CurrentImplementation();
// Calls that oneDNN could not make a primitive for and the reference ran.
int64_t ReferenceFallbacks();

#define NUMASERVE_TRAINING_OP(Name)                                                        \
  absl::Status Name##Forward(const engine::Graph& graph, const engine::Node& node,         \
                             const std::vector<const Tensor*>& inputs,                     \
                             std::vector<Tensor*>& outputs);                               \
  absl::Status Name##Backward(                                                             \
      const engine::Graph& graph, const engine::Node& node,                                \
      const std::vector<const Tensor*>& inputs, const std::vector<const Tensor*>& outputs, \
      const std::vector<const Tensor*>& output_grads, std::vector<Tensor*>& input_grads);
NUMASERVE_TRAINING_OP(Conv)
NUMASERVE_TRAINING_OP(MaxPool)
NUMASERVE_TRAINING_OP(AveragePool)
NUMASERVE_TRAINING_OP(GlobalAveragePool)
#undef NUMASERVE_TRAINING_OP

}  // namespace numaserve::training::conv_pool
