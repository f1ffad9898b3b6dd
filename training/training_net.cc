#include "training/training_net.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace numaserve::training {

using engine::Graph;
using engine::Node;
using engine::ValueId;

absl::StatusOr<std::unique_ptr<TrainingNet>> TrainingNet::Create(Graph graph, bool input_grad) {
  if (graph.inputs().size() != 1 || graph.outputs().size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("training needs a graph with one input and one output; this one has ",
                     graph.inputs().size(), " inputs and ", graph.outputs().size(), " outputs"));
  }
  std::unique_ptr<TrainingNet> net(new TrainingNet(std::move(graph)));
  Graph& g = net->graph_;
  net->input_ = g.inputs()[0];
  net->logits_ = g.outputs()[0];
  net->num_nodes_ = static_cast<int>(g.nodes().size());
  if (!g.nodes().empty() && g.nodes().back().op_type == "Softmax" &&
      g.nodes().back().outputs[0] == net->logits_) {
    net->logits_ = g.nodes().back().inputs[0];
    --net->num_nodes_;
  }
  const int num_values = g.num_values();
  net->values_.resize(num_values);
  net->grads_.resize(num_values);
  net->needs_grad_.assign(num_values, false);
  net->parameter_of_value_.assign(num_values, -1);
  for (const auto& [id, constant] : g.constants()) {
    if (constant.type == engine::DataType::kFloat32) net->values_[id] = constant.f32;
  }
  // Parameters in graph order (the order of first use), for stable checkpoints.
  for (int i = 0; i < net->num_nodes_; ++i) {
    const Node& node = g.nodes()[i];
    const TrainingOp* op = FindTrainingOp(node.op_type);
    if (op == nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          node.Describe(), " has no training implementation (trainable ops: ", TrainableOpsList(),
          ")"));
    }
    net->ops_.push_back(op);
    for (ValueId in : node.inputs) {
      if (in == engine::kNoValue) continue;
      const engine::Constant* c = g.FindConstant(in);
      if (c == nullptr || c->type != engine::DataType::kFloat32) continue;
      if (node.op_type == "Reshape" || node.op_type == "Dropout") continue;  // shape, ratio
      if (net->parameter_of_value_[in] >= 0) continue;
      const bool running_stat =
          node.op_type == "BatchNormalization" &&
          (in == node.inputs[3] || (node.inputs.size() > 4 && in == node.inputs[4]));
      net->parameter_of_value_[in] = static_cast<int>(net->parameters_.size());
      net->parameters_.push_back(
          {.name = g.value(in).name, .value = in, .trainable = !running_stat});
    }
  }
  for (Parameter& p : net->parameters_) {
    p.data = &net->values_[p.value];
    p.grad = &net->grads_[p.value];
    *p.grad = Tensor(p.data->shape);
    net->needs_grad_[p.value] = true;
  }
  // A value needs a gradient when it depends on a parameter (or on the
  // input, when its gradient is asked for).
  net->needs_grad_[net->input_] = input_grad;
  for (int i = 0; i < net->num_nodes_; ++i) {
    const Node& node = g.nodes()[i];
    bool any = false;
    for (ValueId in : node.inputs) any = any || (in != engine::kNoValue && net->needs_grad_[in]);
    for (ValueId out : node.outputs) net->needs_grad_[out] = any;
  }
  return net;
}

int64_t TrainingNet::num_parameter_elements() const {
  int64_t n = 0;
  for (const Parameter& p : parameters_) n += p.data->size();
  return n;
}

absl::StatusOr<const Tensor*> TrainingNet::Forward(const Tensor& input, bool training) {
  context_.training = training;
  ScopedTrainingContext scoped(context_);
  values_[input_] = input;
  double flops = 0;
  std::vector<const Tensor*> ins;
  std::vector<Tensor*> outs;
  for (int i = 0; i < num_nodes_; ++i) {
    const Node& node = graph_.nodes()[i];
    ins.clear();
    outs.clear();
    for (ValueId in : node.inputs) ins.push_back(in == engine::kNoValue ? nullptr : &values_[in]);
    for (ValueId out : node.outputs) outs.push_back(&values_[out]);
    absl::Status status = ops_[i]->forward(graph_, node, ins, outs);
    if (!status.ok()) return status;
    const double out_size = static_cast<double>(outs[0]->size());
    if (node.op_type == "Gemm") {
      flops += 2 * out_size * ins[0]->shape[node.GetInt("transA", 0) != 0 ? 0 : 1];
    } else if (node.op_type == "MatMul") {
      flops += 2 * out_size * ins[0]->shape.back();
    } else if (node.op_type == "Conv") {
      flops += 2 * out_size * static_cast<double>(ins[1]->size() / ins[1]->shape[0]);
    }
  }
  last_forward_flops_ = flops;
  return &values_[logits_];
}

absl::Status TrainingNet::Backward(const Tensor& logits_grad,
                                   const std::function<void(int)>& on_ready) {
  ScopedTrainingContext scoped(context_);
  // Zero the gradients of everything backward will add into.
  for (int v = 0; v < graph_.num_values(); ++v) {
    if (!needs_grad_[v] || v == logits_) continue;
    Tensor& g = grads_[v];
    g.shape = values_[v].shape;
    g.data.assign(values_[v].data.size(), 0.0f);
  }
  grads_[logits_] = logits_grad;
  // Parameters become final when their last (in reverse order) consumer ran.
  std::vector<int> pending(parameters_.size(), 0);
  for (int i = 0; i < num_nodes_; ++i) {
    for (ValueId in : graph_.nodes()[i].inputs) {
      if (in != engine::kNoValue && parameter_of_value_[in] >= 0)
        ++pending[parameter_of_value_[in]];
    }
  }
  std::vector<const Tensor*> ins, outs, gouts;
  std::vector<Tensor*> gins;
  for (int i = num_nodes_ - 1; i >= 0; --i) {
    const Node& node = graph_.nodes()[i];
    bool any_output_grad = false;
    for (ValueId out : node.outputs) any_output_grad = any_output_grad || needs_grad_[out];
    ins.clear();
    outs.clear();
    gouts.clear();
    gins.clear();
    for (ValueId in : node.inputs) {
      const bool valid = in != engine::kNoValue;
      ins.push_back(valid ? &values_[in] : nullptr);
      gins.push_back(valid && needs_grad_[in] ? &grads_[in] : nullptr);
    }
    for (ValueId out : node.outputs) {
      outs.push_back(&values_[out]);
      gouts.push_back(&grads_[out]);
    }
    if (any_output_grad) {
      absl::Status status = ops_[i]->backward(graph_, node, ins, outs, gouts, gins);
      if (!status.ok()) return status;
    }
    for (ValueId in : node.inputs) {
      if (in == engine::kNoValue) continue;
      const int p = parameter_of_value_[in];
      if (p >= 0 && --pending[p] == 0 && on_ready) on_ready(p);
    }
  }
  return absl::OkStatus();
}

}  // namespace numaserve::training
