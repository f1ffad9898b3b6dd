// Forward (training mode) and backward of the ONNX ops numaserve trains, in
// one table like engine/ops/op_registry.h. Forward writes the node's outputs;
// backward ADDS each input's gradient into `input_grads` (a value may feed
// several nodes), skipping null entries (inputs that need no gradient).
// Matrix products run on oneDNN's sgemm; the rest are plain OpenMP loops.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/ir/graph.h"
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

// What ops may depend on beyond their inputs, for the duration of one
// Forward or Backward on this thread (set by TrainingNet): training mode
// (batch statistics, dropout) or inference mode, and what makes dropout
// masks reproducible: the same on every rank count, after a resume, and in
// backward as in forward.
struct TrainingContext {
  bool training = true;
  uint64_t seed = 0;       // the job's seed
  int64_t step = 0;        // the optimizer step being computed
  int64_t row_offset = 0;  // this rank's first row within the global batch
  // Mixed precision (TrainingConfig.precision "bf16"): convolutions read
  // their operands in BF16 and accumulate in FP32; everything else (matrix
  // products included), and every stored tensor, stays FP32.
  bool bf16 = false;
};
const TrainingContext& CurrentTrainingContext();
inline bool InTrainingMode() { return CurrentTrainingContext().training; }
class ScopedTrainingContext {
 public:
  explicit ScopedTrainingContext(const TrainingContext& context);
  ~ScopedTrainingContext();

 private:
  TrainingContext previous_;
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
