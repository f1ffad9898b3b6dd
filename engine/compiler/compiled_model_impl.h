// CompiledModelImpl: the engine's CompiledModel (model.h), the class the
// compiler's files share. Internal to engine/: nothing outside includes it.
//   compiled_model.cc  the Compile driver and its table of lowerings by op
//                      type (a new op: one Lower* function, one table row),
//                      element-wise and layout steps, the plan's
//                      description, Load, the options' defaults
//   compile_matmul.cc  MatMul/Gemm, the GEMM choice, GELU, attention and
//                      batched-matmul fusions, the QDQ (INT8) plan
//   compile_conv.cc    Conv and ConvTranspose
//   compile_rnn.cc     LSTM and GRU (rnn_step.h)
//   einsum_rewrite.cc  Einsums that are one matrix product, as MatMul nodes
//   memory_plan.h/.cc  the passes over the plan after lowering: storage,
//                      layouts, lifetimes, in-place residuals (free
//                      functions of the plan, tested on their own)
// Compile's product is an ExecutionPlan (engine/runtime/plan.h), plain
// data; the runtime's Executor runs it, and every run-time method of the
// CompiledModel interface goes to the Executor.
#pragma once

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "affinity/cpu_features.h"
#include "affinity/topology.h"
#include "base/log.h"
#include "engine/compiler/batch_groups.h"
#include "engine/compiler/compiled_steps.h"
#include "engine/compiler/eltwise_steps.h"
#include "engine/compiler/memory_plan.h"
#include "engine/import/model_info.h"
#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "engine/ops/shape_propagation.h"
#include "engine/ops/typed_exec.h"
#include "engine/runtime/executor.h"
#include "engine/runtime/plan.h"
#include "kernels/dispatch.h"
#include "kernels/gemm/gemm_autotune.h"
#include "kernels/onednn/onednn_common.h"

namespace numaserve::engine::internal {

using runtime::Storage;

class CompiledModelImpl final : public CompiledModel {
 public:
  CompiledModelImpl(Graph graph, ModelInfo info, const CompileOptions& options,
                    const dnnl::engine& engine)
      : graph_(std::move(graph)), info_(std::move(info)), options_(options), engine_(engine) {
    if (options_.batch_split_cache_bytes < 0) {
      options_.batch_split_cache_bytes = LastLevelCacheBytes();
    }
    plan_.graph = &graph_;
    plan_.name = info_.path;
  }

  // Lowers the graph to steps and plans them; the model runs after it succeeds.
  absl::Status Compile();

  // The op types with a row in LoweringOf's table (tests/engine/
  // op_tables_test.cc checks each names an op of the registry).
  static std::vector<std::string> LoweredOpTypes();

  // What runs, the runtime's Executor does (engine/runtime/executor.h).
  void SetProfiling(bool on) override { executor_->SetProfiling(on); }
  std::vector<StepProfile> Profile() const override { return executor_->Profile(); }
  void SetStepEventLimit(int64_t max_events) override { executor_->SetStepEventLimit(max_events); }
  std::vector<StepEvent> StepEvents() const override { return executor_->StepEvents(); }
  absl::StatusOr<std::vector<PlannedStep>> PlanAt(int64_t batch) const override {
    return executor_->PlanAt(batch);
  }
  absl::StatusOr<std::vector<PlannedStep>> PlanAt(const InputShapes& input_shapes) const override {
    return executor_->PlanAt(input_shapes);
  }
  absl::StatusOr<int64_t> ActivationBytes(int64_t batch) override {
    return executor_->ActivationBytes(batch);
  }
  absl::StatusOr<int64_t> ActivationBytes(const InputShapes& input_shapes) override {
    return executor_->ActivationBytes(input_shapes);
  }
  std::vector<std::vector<int64_t>> OutputShapes(int64_t batch) const override {
    return executor_->OutputShapes(batch);
  }
  absl::StatusOr<std::vector<std::vector<int64_t>>> OutputShapes(
      const InputShapes& input_shapes) const override {
    return executor_->OutputShapes(input_shapes);
  }
  BatchPlanCache CachedBatchPlans() const override {
    return {executor_->cached_plans(), executor_->arena_bytes()};
  }
  absl::Status Run(int64_t batch, const std::vector<const void*>& inputs,
                   const std::vector<void*>& outputs) override {
    return executor_->Run(batch, inputs, outputs);
  }
  absl::Status Run(const InputShapes& input_shapes, const std::vector<const void*>& inputs,
                   const std::vector<void*>& outputs) override {
    return executor_->Run(input_shapes, inputs, outputs);
  }
  absl::Status CheckBufferSizes(int64_t batch, const std::vector<size_t>& input_bytes,
                                const std::vector<size_t>& output_bytes) const override {
    return executor_->CheckBufferSizes(batch, input_bytes, output_bytes);
  }
  absl::Status CheckBufferSizes(const InputShapes& input_shapes,
                                const std::vector<size_t>& input_bytes,
                                const std::vector<size_t>& output_bytes) const override {
    return executor_->CheckBufferSizes(input_shapes, input_bytes, output_bytes);
  }

  const ModelInfo& info() const override { return info_; }
  std::string DescribePlan() const override;
  std::string ActivationLayoutName() const override {
    return kernels::BlockedLayoutName(plan_.blocked_layout);
  }
  std::string DescribeInt8Kernels() const override { return int8_kernels_note_; }

 private:
  // shapes1: every value's shape at batch 1 (for ranks).
  absl::Status CompileMatMul(int node_index, const std::vector<std::vector<int>>& consumers,
                             const std::vector<Shape>& shapes1, const std::vector<int>& producer,
                             std::vector<bool>& fused);
  // CompileMatMul's weight matmul being built (compile_matmul.cc).
  struct MatMulBuild;
  // Folds a bias Add, then a Relu, an erf GELU or a residual Add after the matmul into `b`.
  void FuseMatMulOutputs(int node_index, const std::vector<std::vector<int>>& consumers,
                         const std::vector<Shape>& shapes1, const std::vector<int>& producer,
                         std::vector<bool>& fused, MatMulBuild& b) const;
  // The GEMM kernel on the backend options_ names ("auto": the fastest, timed
  // here once per distinct shape, or remembered); `note` says which, for
  // DescribePlan.
  absl::StatusOr<std::unique_ptr<kernels::GemmKernel>> CreateGemm(
      const kernels::GemmOptions& options, const std::string& layer, std::string* note);
  // x / sqrt(2) -> Erf -> + 1 -> x * . -> * 0.5 (any operand order): the
  // nodes and the final value, when `x` feeds exactly that pattern.
  struct GeluMatch {
    std::vector<int> nodes;
    ValueId output;
  };
  std::optional<GeluMatch> MatchErfGelu(ValueId x,
                                        const std::vector<std::vector<int>>& consumers) const;
  // Conv (+BatchNormalization folded, +residual Add as a sum, +activation)
  // on oneDNN; false when the node needs the reference (runtime weights).
  absl::StatusOr<bool> CompileConv(int node_index, const std::vector<std::vector<int>>& consumers,
                                   const std::vector<Shape>& shapes1,
                                   const std::vector<int>& producer, std::vector<bool>& fused);
  // CompileConv's phases (compile_conv.cc) share ConvBuild: the conv being built.
  struct ConvBuild;
  // A QDQ pair after a conv that folds into its post-ops.
  struct FoldableQdqPair;
  // A depthwise 3x3 conv that can run as a 1x1 conv's post-op.
  struct DepthwiseMatch;
  // Reads the conv's window, weights and bias; false when it needs the reference.
  absl::StatusOr<bool> ReadConvParams(ConvBuild& cb) const;
  // Folds a BatchNormalization, a residual Add and activations after the conv.
  void FuseConvOutputs(ConvBuild& cb) const;
  // Folds the BatchNormalization reading `value` alone into `wts` and `bs`.
  bool FoldConvBatchNorm(ConvBuild& cb, ValueId& value, int64_t channels, std::vector<float>& wts,
                         std::vector<float>& bs, std::string& label,
                         std::vector<float>* int8_scales = nullptr) const;
  // Appends the activations reading `value` (a chain) to `posts`.
  void FuseConvActivations(ConvBuild& cb, ValueId& value,
                           std::vector<kernels::EltwisePostOp>& posts, std::string& label) const;
  // Sets the conv's weights and bias and chooses Winograd, BF16 or INT8.
  void ChooseConvImplementation(ConvBuild& cb) const;
  // Whether a conv with `trial`'s options runs on a non-reference kernel.
  bool ConvRunsFast(kernels::ConvOnednnOptions trial, const Shape& src, const Shape& dst) const;
  // The QDQ pair reading `value` alone that folds into a conv, or nothing.
  std::optional<FoldableQdqPair> FoldableQdqPairOf(const ConvBuild& cb, ValueId value) const;
  // Marks `pair` fused into the step named `step_name`; `value` becomes its output.
  void TakeQdqPair(ConvBuild& cb, const FoldableQdqPair& pair, ValueId& value,
                   std::string& step_name) const;
  // The depthwise 3x3 conv after a 1x1 conv that may become its post-op, or nothing.
  std::optional<DepthwiseMatch> DepthwiseAfterConv(const ConvBuild& cb) const;
  // Fuses the depthwise conv `m` into the conv where oneDNN runs it fast.
  void FuseConvDepthwise(ConvBuild& cb, const DepthwiseMatch& m) const;
  // x * Sigmoid(x) (SiLU, as exporters write it) or x * HardSigmoid(x)
  // (HardSwish): the gate node, the Mul reading x and the gate's output
  // alone, and the one oneDNN algorithm computing both (compile_eltwise.cc).
  struct GatedActivation {
    int gate = -1;
    int mul = -1;
    kernels::EltwisePostOp op;
  };
  // The gated activation whose gate is node `gate`, or nothing.
  std::optional<GatedActivation> GatedActivationAt(
      int gate, const std::vector<std::vector<int>>& consumers) const;
  // The gated activation of `value` when its readers are exactly the gate
  // and the Mul (so a conv's post-op may take both), or nothing.
  std::optional<GatedActivation> GatedActivationOf(
      ValueId value, const std::vector<std::vector<int>>& consumers) const;
  // ConvTranspose with constant weights on oneDNN's deconvolution; false
  // when the node needs the reference.
  bool CompileConvTranspose(int node_index, const std::vector<Shape>& shapes1);
  // The generic step for a node no table lowering took (a batched MatMul, a
  // unary op, a Clip activation, a binary op), or null: the reference runs it.
  std::unique_ptr<Step> FastStep(int node_index, const std::vector<Shape>& shapes1);
  // Compile's lowerings, one per op type or family, found by op type in
  // the table in LoweringOf (compiled_model.cc). Each adds the node's step
  // (or view) and returns true, or returns false to leave the node to
  // FastStep and then the reference step.
  // What Compile hands a lowering: the node and the graph-wide facts it has.
  struct LowerContext {
    int node_index;
    const std::vector<std::vector<int>>& consumers;  // by ValueId: reading nodes
    const std::vector<Shape>& shapes1;               // every value's shape at batch 1
    const std::vector<int>& producer;  // by ValueId: node index, -1 for inputs/constants
    std::vector<bool>& fused;          // by node: taken into an earlier node's step
  };
  using Lowering = absl::StatusOr<bool> (CompiledModelImpl::*)(const LowerContext& c);
  // The table: op type -> lowering (compiled_model.cc).
  static const absl::flat_hash_map<std::string_view, Lowering>& Lowerings();
  // The lowering for `op_type`, or null when the table has none.
  static Lowering LoweringOf(const std::string& op_type);
  // Adds node `node_index`'s reference step; true, so a lowering can return it.
  bool AddReferenceStep(int node_index);
  // Conv on oneDNN (CompileConv), else the reference.
  absl::StatusOr<bool> LowerConv(const LowerContext& c);
  // ConvTranspose on oneDNN (CompileConvTranspose), else the reference.
  absl::StatusOr<bool> LowerConvTranspose(const LowerContext& c);
  // Gemm and MatMul: CompileMatMul.
  absl::StatusOr<bool> LowerMatMul(const LowerContext& c);
  // An Add of two inputs on oneDNN; false for any other arity.
  absl::StatusOr<bool> LowerAdd(const LowerContext& c);
  // Relu on oneDNN.
  absl::StatusOr<bool> LowerRelu(const LowerContext& c);
  // Softmax on oneDNN.
  absl::StatusOr<bool> LowerSoftmax(const LowerContext& c);
  // Flatten, Reshape, Identity, Squeeze, Unsqueeze and a one-output Dropout: a view, no step.
  absl::StatusOr<bool> LowerView(const LowerContext& c);
  // MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool on oneDNN, else the reference.
  absl::StatusOr<bool> LowerPool(const LowerContext& c);
  // Transpose as a strided copy.
  absl::StatusOr<bool> LowerTranspose(const LowerContext& c);
  absl::StatusOr<bool> LowerConcat(const LowerContext& c);
  // ReduceSum/Mean/Max/Min over trailing axes, else the reference; false with several outputs.
  absl::StatusOr<bool> LowerReduce(const LowerContext& c);
  // LayerNormalization over the last axis with constant scale and bias, else
  // the reference; false with several outputs.
  absl::StatusOr<bool> LowerLayerNorm(const LowerContext& c);
  // Sigmoid and HardSigmoid (with the Mul of a gated activation after them:
  // one SiLU or HardSwish step) and HardSwish on oneDNN (compile_eltwise.cc).
  absl::StatusOr<bool> LowerGate(const LowerContext& c);
  // A Mul by a per-channel scale (squeeze-excitation) in either layout;
  // false for any other Mul (compile_eltwise.cc).
  absl::StatusOr<bool> LowerMul(const LowerContext& c);
  // LSTM and GRU on oneDNN's RNN primitives where their cell is oneDNN's,
  // else on their reference, the reason in the step's description
  // (compile_rnn.cc).
  absl::StatusOr<bool> LowerRnn(const LowerContext& c);
  // Compile's work once every node has its step: storage, layouts, the
  // thread and serial-step defaults, profiling, lifetimes, in-place residuals.
  void PlanAfterLowering(const std::vector<std::vector<int>>& consumers,
                         const std::vector<int>& producer);
  // Whether a conv or weight matmul doing `flops_per_input` FLOPs per
  // element of its input runs in BF16 (precision bf16, and at least
  // CompileOptions::bf16_min_flops_per_input).
  bool UseBf16(double flops_per_input) const {
    return options_.precision == Precision::kBf16 &&
           flops_per_input >= options_.bf16_min_flops_per_input;
  }
  // plan_.blocked_layout from CompileOptions::activation_layout (after
  // PlanQdq: kAuto asks whether a conv runs INT8).
  void ChooseBlockedLayout();

  // The FP32 value a QDQ pair quantizes and the pair's parameters.
  struct QdqInput {
    ValueId source = kNoValue;  // the QuantizeLinear's FP32 input
    float scale = 1;
    int32_t zero_point = 0;
    bool is_uint8 = true;  // UINT8 (else INT8) quantized values
    int quantize_node = -1;
  };
  // Finds the QDQ pairs, the Conv/MatMul/Gemm nodes that run INT8 on them
  // and the pairs that need no step (qdq_of_node_, int8_input_,
  // absorbed_qdq_).
  void PlanQdq(const std::vector<std::vector<int>>& consumers, const std::vector<Shape>& shapes1);
  // Sets qdq_of_node_: each QuantizeLinear -> DequantizeLinear pair with equal scalar parameters.
  void FindQdqPairs();
  // By node: a QuantizeLinear that only the pairs qdq_of_node_ holds read.
  std::vector<bool> QuantizesReadByPairsAlone(const std::vector<std::vector<int>>& consumers) const;
  // The INT8 operands of a Conv/MatMul/Gemm node whose weights are a
  // folded DequantizeLinear of INT8 values with scales along its output
  // channels (`axis`), or nothing.
  std::optional<kernels::Int8Params> Int8WeightsOf(const Node& node, int64_t axis,
                                                   int64_t channels) const;
  // Whether node `i` can run INT8 reading value `v` (its input 0) quantized.
  bool Int8Capable(int i, ValueId v, const std::vector<Shape>& shapes1) const;

  // Records, when a node's step has been added, which step stands for it
  // and for the nodes it fused.
  struct StepOfNodes {
    StepOfNodes(int node, size_t steps_before, const std::vector<bool>& fused,
                const std::vector<std::unique_ptr<Step>>& steps, std::vector<int>& step_of_node)
        : node_(node),
          before_(steps_before),
          fused_(fused),
          steps_(steps),
          step_of_node_(step_of_node) {}
    ~StepOfNodes() {
      if (steps_.size() == before_) return;  // a view: no step
      step_of_node_[node_] = static_cast<int>(before_);
      for (size_t j = node_ + 1; j < fused_.size(); ++j) {
        if (fused_[j] && step_of_node_[j] < 0) step_of_node_[j] = static_cast<int>(before_);
      }
    }
    int node_;
    size_t before_;
    const std::vector<bool>& fused_;
    const std::vector<std::unique_ptr<Step>>& steps_;
    std::vector<int>& step_of_node_;
  };
  // A Transpose whose only reader is a MatMul of two runtime FP32 operands
  // of the same rank: the matmul reads its input through strides instead.
  bool TransposeFeedsBatchedMatMul(int node_index, const std::vector<std::vector<int>>& consumers,
                                   const std::vector<Shape>& shapes1) const;
  // The matmul of two runtime operands, with the transposes before it, a
  // scalar Mul/Div and a Transpose after it absorbed.
  void CompileBatchedMatMul(int node_index, const std::vector<std::vector<int>>& consumers,
                            const std::vector<Shape>& shapes1, const std::vector<int>& producer,
                            std::vector<bool>& fused);
  // A scalar Mul/Div reading a matmul's product `out` alone: the node and
  // the factor it applies; {-1, 1} when there is none.
  std::pair<int, float> ScaleOfProduct(ValueId out, const std::vector<std::vector<int>>& consumers,
                                       const std::vector<Shape>& shapes1) const;
  // A Transpose reading `out` alone, keeping its rank; -1 when there is none.
  int TransposeOfProduct(ValueId out, const std::vector<std::vector<int>>& consumers,
                         const std::vector<Shape>& shapes1) const;
  // Scaled dot-product attention starting at the MatMul `node_index` (see
  // AttentionStep): the whole chain becomes one step when it matches and
  // CompileOptions::fuse_attention is on; false (nothing done) otherwise.
  bool CompileAttention(int node_index, const std::vector<std::vector<int>>& consumers,
                        const std::vector<Shape>& shapes1, const std::vector<int>& producer,
                        std::vector<bool>& fused);
  // The attention chain CompileAttention matches (compile_matmul.cc).
  struct AttentionMatch;
  // Matches qk -> [scale] -> Softmax -> MatMul(probabilities, v) -> [Transpose] into `m`.
  bool MatchAttentionChain(int node_index, const std::vector<std::vector<int>>& consumers,
                           const std::vector<Shape>& shapes1, AttentionMatch& m) const;
  // q, k and v as stored (through transposes) into `m`; false when one is not ready here.
  bool ResolveAttentionOperands(int node_index, const std::vector<std::vector<int>>& consumers,
                                const std::vector<Shape>& shapes1, const std::vector<int>& producer,
                                AttentionMatch& m) const;
  // Whether `m`'s operand shapes and layouts are ones AttentionStep runs.
  bool AttentionShapesFit(const std::vector<Shape>& shapes1, const AttentionMatch& m) const;
  // Follows a value's only consumer if it is `op_type` and the value is not
  // a graph output; -1 otherwise.
  int SoleConsumer(ValueId v, const char* op_type,
                   const std::vector<std::vector<int>>& consumers) const;
  // Shape-polymorphic models (dynamic dims besides dim 0): the plan is
  // lowered at the first probe (shapes1, ProbeInputShapes(0)) and runs at
  // every signature, so a lowering choice that depends on sizes must hold
  // at the second probe too (probe2_). SameShapes: a and b have equal
  // shapes at both probes (at the first alone otherwise).
  bool SameShapes(const std::vector<Shape>& shapes1, ValueId a, ValueId b) const;
  // Whether a conv or pool window resolved at shapes1 is the same at the
  // second probe (its pads follow the input's size under auto_pad SAME_*).
  bool WindowHolds(const Node& node, ValueId x, const std::vector<int64_t>& kernel,
                   const kernels::WindowParams& window) const;

  Graph graph_;
  ModelInfo info_;
  CompileOptions options_;
  dnnl::engine engine_;
  // What Compile hands the runtime: the steps, storage, layouts, lifetimes
  // and in-place links (engine/runtime/plan.h).
  runtime::ExecutionPlan plan_;
  std::vector<bool> is_output_;           // by ValueId
  std::vector<int> step_of_node_;         // by node index: the step computing it (-1: a view)
  std::vector<bool> absorbed_transpose_;  // by node: read through strides by a matmul
  // QDQ models: a QuantizeLinear -> DequantizeLinear pair, by the
  // DequantizeLinear node, where both take the same scalar constant scale and
  // zero point and the QuantizeLinear's input is FP32.
  std::vector<std::optional<QdqInput>> qdq_of_node_;
  // By node: a QuantizeLinear or DequantizeLinear with no step of its own
  // (every reader of its output runs INT8 on the pair's FP32 input).
  std::vector<bool> absorbed_qdq_;
  // By Conv/MatMul/Gemm node: the quantized input it runs INT8 on.
  std::vector<std::optional<QdqInput>> int8_input_;
  // Set by PlanQdq where CompileOptions::int8_kernels kept INT8-capable
  // steps on the FP32 path (DescribeInt8Kernels).
  std::string int8_kernels_note_;
  bool unavailable_logged_[std::size(kernels::kAllGemmBackends)] = {};  // by GemmBackend
  bool polymorphic_ = false;   // HasDynamicNonBatchDims(graph_)
  std::vector<Shape> probe2_;  // polymorphic_: every value's shape at ProbeInputShapes(1)
  // Otherwise, made by LowerMul when it first needs them: every value's
  // shape at batch 2 (empty where propagation failed there).
  std::optional<std::vector<Shape>> shapes2_;
  // Runs plan_ once Compile has made it; freed before plan_'s steps.
  std::unique_ptr<runtime::Executor> executor_;
};

// The oneDNN post-op for an activation node (Relu, LeakyRelu, Sigmoid,
// Tanh, Clip with constant bounds, HardSigmoid, HardSwish), if it maps to
// one (compile_conv.cc).
std::optional<kernels::EltwisePostOp> ActivationPostOp(const Graph& graph, const Node& node);

// Rewrites every Einsum that is one matrix product (two FP32 inputs; see
// einsum_rewrite.cc for which equations) as Transpose -> MatMul ->
// Transpose nodes, before Compile lowers the graph; other Einsums stay.
absl::Status RewriteEinsumsAsMatMuls(Graph& graph);

}  // namespace numaserve::engine::internal
