// CompiledModelImpl (compiled_model_impl.h): LSTM and GRU. A node whose
// cell is oneDNN's exactly runs on oneDNN's RNN primitives (rnn_step.h):
// the default activations, no clip, no input_forget, layout 0, W, R, B and
// P constants, and sequence_lens absent or a constant that the run's
// sequence fills (a run where a length falls short runs on the reference).
// A cell oneDNN runs only on its own reference RNN (probed at compile
// time) and every other node run on the op's reference, the reason in the
// step's description.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "engine/compiler/compiled_model_impl.h"
#include "engine/compiler/rnn_step.h"

namespace numaserve::engine {
namespace {

using ops::HasInput;

// Whether the node's activations are the defaults (Sigmoid, Tanh[, Tanh]
// per direction), the only ones oneDNN's cells compute.
bool DefaultActivations(const Node& node) {
  const std::string joined = node.GetString("activations", "");
  if (joined.empty()) return true;
  const std::vector<std::string> defaults =
      node.op_type == "LSTM" ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                             : std::vector<std::string>{"Sigmoid", "Tanh"};
  const std::vector<std::string> names = absl::StrSplit(joined, ',');
  if (names.size() % defaults.size() != 0) return false;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] != defaults[i % defaults.size()]) return false;
  }
  return true;
}

// Input `index`'s constant FP32 data, or null (absent, or given at run time).
const Constant* FloatConstant(const Graph& graph, const Node& node, size_t index) {
  if (!HasInput(node, index)) return nullptr;
  const Constant* c = graph.FindConstant(node.inputs[index]);
  return c != nullptr && c->f32.shape == c->shape ? c : nullptr;
}

// The node's parameters for oneDNN, or why it runs on its reference.
std::string ParamsOrReason(const Graph& graph, const Node& node, kernels::RnnParams& params) {
  const bool lstm = node.op_type == "LSTM";
  if (node.HasAttribute("clip")) return "clip";
  if (!DefaultActivations(node)) return "activations other than the defaults";
  if (lstm && node.GetInt("input_forget", 0) != 0) return "input_forget";
  if (node.GetInt("layout", 0) != 0) return "layout 1";
  const Constant* w = FloatConstant(graph, node, 1);
  const Constant* r = FloatConstant(graph, node, 2);
  const Constant* b = FloatConstant(graph, node, 3);
  const Constant* p = lstm ? FloatConstant(graph, node, 7) : nullptr;
  if (w == nullptr || r == nullptr || (HasInput(node, 3) && b == nullptr) ||
      (lstm && HasInput(node, 7) && p == nullptr)) {
    return "weights given at run time";
  }
  if (w->shape.size() != 3 || r->shape.size() != 3) return "W or R not 3-D";
  const std::string direction = node.GetString("direction", "forward");
  params.direction = direction == "bidirectional" ? kernels::RnnDirection::kBidirectional
                     : direction == "reverse"     ? kernels::RnnDirection::kReverse
                                                  : kernels::RnnDirection::kForward;
  params.cell = lstm                                         ? kernels::RnnCell::kLstm
                : node.GetInt("linear_before_reset", 0) != 0 ? kernels::RnnCell::kLbrGru
                                                             : kernels::RnnCell::kGru;
  params.input = w->shape[2];
  params.hidden = r->shape[2];
  params.w = w->f32.data;
  params.r = r->f32.data;
  if (b != nullptr) params.b = b->f32.data;
  if (p != nullptr) params.p = p->f32.data;
  params.has_initial_h = HasInput(node, 5);
  params.has_initial_c = lstm && HasInput(node, 6);
  return "";
}

}  // namespace

RnnStep::RnnStep(const Graph* graph, int node_index, std::unique_ptr<kernels::RnnOnednn> kernel,
                 std::vector<int64_t> sequence_lens, std::string reason)
    : Step(Traits(*graph, node_index, kernel != nullptr)),
      graph_(graph),
      node_index_(node_index),
      kernel_(std::move(kernel)),
      sequence_lens_(std::move(sequence_lens)),
      reason_(std::move(reason)),
      reference_(graph, node_index) {}

StepTraits RnnStep::Traits(const Graph& graph, int node_index, bool on_onednn) {
  StepTraits t = NodeTraits(graph, node_index);
  if (!on_onednn) return t;
  // The weights are the kernel's own (reordered at compile time): counted
  // as its parameters, not as values it reads.
  const Node& node = graph.nodes()[node_index];
  std::vector<ValueId> reads;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ValueId v = node.inputs[i];
    if (v == kNoValue) continue;
    const Constant* c = graph.FindConstant(v);
    if (c == nullptr) {
      reads.push_back(v);
    } else if (i != 4) {  // sequence_lens: integers, read at compile time
      t.parameter_bytes += static_cast<int64_t>(c->f32.data.size() * sizeof(float));
    }
  }
  t.reads = std::move(reads);
  t.weight_bytes = t.parameter_bytes;
  return t;
}

bool RnnStep::OnOnednn(int64_t seq, int64_t batch) const {
  if (kernel_ == nullptr || seq < 1 || batch < 1) return false;
  for (int64_t n : sequence_lens_) {
    if (n != seq) return false;
  }
  return true;
}

absl::Status RnnStep::Run(const StepContext& ctx) {
  const Node& node = graph_->nodes()[node_index_];
  const Shape& x = ctx.shapes[node.inputs[0]];
  if (x.size() != 3 || !OnOnednn(x[0], x[1])) return reference_.Run(ctx);
  kernels::RnnBuffers io;
  io.x = ctx.data[node.inputs[0]];
  io.h0 = HasInput(node, 5) ? ctx.data[node.inputs[5]] : nullptr;
  io.c0 = HasInput(node, 6) ? ctx.data[node.inputs[6]] : nullptr;
  io.y = ctx.data[node.outputs[0]];
  io.y_h = node.outputs.size() > 1 ? ctx.data[node.outputs[1]] : nullptr;
  io.y_c = node.outputs.size() > 2 ? ctx.data[node.outputs[2]] : nullptr;
  absl::Status s = kernel_->Execute(ctx.stream, x[0], x[1], io);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(node.Describe(), ": ", s.message()));
  return absl::OkStatus();
}

std::string RnnStep::Describe() const {
  const Node& node = graph_->nodes()[node_index_];
  if (kernel_ == nullptr) return absl::StrCat("rnn: ", node.name, " [reference: ", reason_, "]");
  return absl::StrCat("rnn: ", node.name, " [onednn ", kernels::RnnCellName(kernel_->cell()), " ",
                      kernels::RnnDirectionName(kernel_->direction()),
                      sequence_lens_.empty() ? "" : "; sequence_lens short of seq: reference", "]");
}

double RnnStep::Flops(const std::vector<Shape>& shapes) const {
  const Node& node = graph_->nodes()[node_index_];
  std::vector<const Shape*> in;
  for (ValueId v : node.inputs) in.push_back(v == kNoValue ? nullptr : &shapes[v]);
  const OpSchema* schema = FindOpSchema(node.op_type);
  return schema != nullptr && schema->flops != nullptr ? schema->flops(node, in) : 0.0;
}

double RnnStep::ParallelGrainFlops(const std::vector<Shape>& shapes) const {
  const Shape& x = shapes[graph_->nodes()[node_index_].inputs[0]];
  const double flops = Flops(shapes);
  return x.size() == 3 && x[0] > 1 ? flops / static_cast<double>(x[0]) : flops;
}

std::string RnnStep::Implementation(const std::vector<Shape>& shapes) const {
  const Node& node = graph_->nodes()[node_index_];
  const Shape& x = shapes[node.inputs[0]];
  if (x.size() == 3 && OnOnednn(x[0], x[1])) return kernel_->ImplementationName(x[0], x[1]);
  return reference_.Implementation(shapes);
}

namespace internal {

absl::StatusOr<bool> CompiledModelImpl::LowerRnn(const LowerContext& c) {
  const Node& node = graph_.nodes()[c.node_index];
  kernels::RnnParams params;
  std::string reason = ParamsOrReason(graph_, node, params);
  std::vector<int64_t> lengths;
  if (reason.empty() && HasInput(node, 4)) {
    auto given = ops::ConstInts(graph_, node, 4, "sequence_lens");
    const std::optional<std::vector<int64_t>> values =
        given.ok() ? *given : std::optional<std::vector<int64_t>>();
    if (values.has_value()) {
      lengths = *values;
    } else {
      reason = "sequence_lens given at run time";
    }
  }
  std::unique_ptr<kernels::RnnOnednn> kernel;
  if (reason.empty()) {
    auto created = kernels::RnnOnednn::Create(engine_, params);
    if (!created.ok()) return created.status();
    // Where oneDNN has only its reference RNN for the cell (3.7: GRU
    // without linear_before_reset, ref+matmul, measured slower than the
    // op's own reference), the node stays on the op's reference.
    const Shape& x = c.shapes1[node.inputs[0]];
    auto impl = (*created)->Probe(x.size() == 3 ? std::max<int64_t>(x[0], 1) : 1,
                                  x.size() == 3 ? std::max<int64_t>(x[1], 1) : 1);
    if (!impl.ok()) {
      reason = absl::StrCat("oneDNN refuses it: ", impl.status().message());
    } else if (kernels::IsReferenceImplementation(*impl)) {
      reason = absl::StrCat("oneDNN has only ", *impl, " for ", kernels::RnnCellName(params.cell));
    } else {
      kernel = *std::move(created);
    }
  }
  plan_.steps.push_back(std::make_unique<RnnStep>(&graph_, c.node_index, std::move(kernel),
                                                  std::move(lengths), std::move(reason)));
  return true;
}

}  // namespace internal
}  // namespace numaserve::engine
