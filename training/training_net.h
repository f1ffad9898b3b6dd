// An ONNX inference graph made trainable: its FP32 initializers become
// parameters, every node runs forward in training mode and backward in
// reverse order (autodiff over the graph). A final Softmax producing the
// graph output is left out: the loss (softmax cross-entropy) takes its
// input, the logits, and the exported model keeps the Softmax.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "training/training_ops.h"

namespace numaserve::training {

struct Parameter {
  std::string name;        // the initializer's name in the ONNX file
  engine::ValueId value;   // its value in the graph
  Tensor* data = nullptr;  // weights (owned by the net)
  Tensor* grad = nullptr;  // d(loss)/d(weights) after Backward
  // False for state that forward updates instead of the optimizer
  // (BatchNormalization's running mean and variance); its gradient is 0.
  bool trainable = true;
};

class TrainingNet {
 public:
  // Errors name the node whose op has no training implementation, a graph
  // with other than one input and one output, or a non-FP32 input.
  // `input_grad`: also compute d(loss)/d(input) (gradient checks; training
  // skips it).
  static absl::StatusOr<std::unique_ptr<TrainingNet>> Create(engine::Graph graph,
                                                             bool input_grad = false);

  // Runs the graph up to the logits for `input` ([batch, ...] as the
  // graph's input with dim 0 = batch). The result stays valid until the
  // next Forward.
  // `training`: batch statistics for BatchNormalization (and running
  // statistics updated); false runs the inference graph (evaluation).
  absl::StatusOr<const Tensor*> Forward(const Tensor& input, bool training = true);

  // What makes dropout masks reproducible (training_ops.h): the job's seed,
  // the step the next Forward/Backward computes and this rank's first row
  // within the global batch.
  void SetDropoutContext(uint64_t seed, int64_t step, int64_t row_offset) {
    context_.seed = seed;
    context_.step = step;
    context_.row_offset = row_offset;
  }

  // Mixed precision for the next Forward/Backward (TrainingContext::bf16).
  void set_bf16(bool bf16) { context_.bf16 = bf16; }

  // Back-propagates d(loss)/d(logits) through the last Forward. Parameter
  // gradients are overwritten; `on_ready(i)` is called as soon as parameter
  // i's gradient is final (for all-reduce overlapped with backward).
  absl::Status Backward(const Tensor& logits_grad, const std::function<void(int)>& on_ready);

  std::vector<Parameter>& parameters() { return parameters_; }
  const engine::Graph& graph() const { return graph_; }
  // d(loss)/d(input) of the last Backward when created with input_grad.
  const Tensor& input_grad() const { return grads_[input_]; }
  int64_t num_parameter_elements() const;
  // Floating-point operations (2 per multiply-add of Gemm, MatMul and Conv)
  // of the last Forward; backward costs about twice as much.
  double last_forward_flops() const { return last_forward_flops_; }

 private:
  explicit TrainingNet(engine::Graph graph) : graph_(std::move(graph)) {}

  engine::Graph graph_;
  std::vector<const TrainingOp*> ops_;  // per node; the fused Softmax is not run
  int num_nodes_ = 0;                   // nodes run (excludes a final Softmax)
  engine::ValueId input_ = engine::kNoValue;
  engine::ValueId logits_ = engine::kNoValue;
  std::vector<Tensor> values_;  // activations and parameters, by value id
  std::vector<Tensor> grads_;   // gradients, by value id
  std::vector<bool> needs_grad_;
  std::vector<Parameter> parameters_;
  std::vector<int> parameter_of_value_;  // -1 when not a parameter
  double last_forward_flops_ = 0;
  TrainingContext context_;  // of the last Forward (Backward reuses it)
};

}  // namespace numaserve::training
