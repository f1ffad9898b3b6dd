// Forward (training mode) and backward of the ONNX ops numaserve trains, in
// one table like engine/op_registry.h. Forward writes the node's outputs;
// backward ADDS each input's gradient into `input_grads` (a value may feed
// several nodes), skipping null entries (inputs that need no gradient).
// Matrix products run on oneDNN's sgemm; the rest are plain OpenMP loops.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/graph.h"
#include "kernels/tensor.h"

namespace numaserve::training {

using kernels::Tensor;

struct TrainingOp {
  absl::string_view op_type;
  absl::Status (*forward)(const engine::Graph& graph, const engine::Node& node,
                          const std::vector<const Tensor*>& inputs, std::vector<Tensor*>& outputs);
  absl::Status (*backward)(const engine::Graph& graph, const engine::Node& node,
                           const std::vector<const Tensor*>& inputs,
                           const std::vector<const Tensor*>& outputs,
                           const std::vector<const Tensor*>& output_grads,
                           std::vector<Tensor*>& input_grads);
};

// Whether forwards on this thread run in training mode (batch statistics,
// running statistics updated) or inference mode; set by TrainingNet for the
// duration of one Forward.
bool InTrainingMode();
class ScopedTrainingMode {
 public:
  explicit ScopedTrainingMode(bool training);
  ~ScopedTrainingMode();

 private:
  bool previous_;
};

// Null when the op has no training implementation.
const TrainingOp* FindTrainingOp(absl::string_view op_type);
std::string TrainableOpsList();

// Row-major C[M,N] = alpha * op(A) op(B) + beta * C on oneDNN's sgemm;
// op(A) is [M,K] (A stored [K,M] when trans_a), op(B) is [K,N].
void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           const float* b, float beta, float* c);

// Softmax cross-entropy over rows of logits [N,C] against class labels.
// Writes d(loss)/d(logits) scaled by `grad_scale` (1/global batch for a
// mean over all ranks) and returns the summed loss and the number of rows
// whose arg-max is the label.
struct LossResult {
  double loss_sum = 0;
  int64_t correct = 0;
};
LossResult SoftmaxCrossEntropy(const Tensor& logits, const uint8_t* labels, float grad_scale,
                               Tensor* logits_grad);

}  // namespace numaserve::training
