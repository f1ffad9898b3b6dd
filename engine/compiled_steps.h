// The steps a CompiledModel runs: each wraps one oneDNN-backed kernel
// (possibly standing for several fused graph nodes) and reads/writes values
// through a per-run pointer table indexed by ValueId.
#pragma once

#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/graph.h"
#include "engine/op_registry.h"
#include "kernels/onednn/elementwise_onednn.h"
#include "kernels/onednn/matmul_onednn.h"
#include "kernels/onednn/softmax_onednn.h"

namespace numaserve::engine {

struct StepContext {
  dnnl::stream& stream;
  const std::vector<Shape>& shapes;  // concrete, by ValueId
  const std::vector<float*>& data;   // by ValueId (views resolved)
};

class Step {
 public:
  virtual ~Step() = default;
  // Called once per new batch size, before its first Run.
  virtual absl::Status Prepare(const std::vector<Shape>& shapes) { return absl::OkStatus(); }
  virtual absl::Status Run(const StepContext& ctx) = 0;
  // The kernel and the graph nodes this step stands for
  // ("matmul: fc1+add1+relu1").
  virtual std::string Describe() const = 0;
};

// Gemm / MatMul with bias, Gemm's beta*C (copied into the output then
// summed), and Relu folded in.
class MatMulStep final : public Step {
 public:
  MatMulStep(std::unique_ptr<kernels::MatMulOnednn> kernel, ValueId src, ValueId dst,
             ValueId accumulate_from, std::string name)
      : kernel_(std::move(kernel)),
        src_(src),
        dst_(dst),
        accumulate_from_(accumulate_from),
        name_(std::move(name)) {}
  absl::Status Prepare(const std::vector<Shape>& shapes) override;
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "matmul: " + name_; }
  const kernels::MatMulOnednn& kernel() const { return *kernel_; }

 private:
  std::unique_ptr<kernels::MatMulOnednn> kernel_;
  ValueId src_, dst_, accumulate_from_;
  std::string name_;
};

class AddStep final : public Step {
 public:
  AddStep(const dnnl::engine& engine, ValueId a, ValueId b, ValueId dst, std::string name)
      : kernel_(engine), a_(a), b_(b), dst_(dst), name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "add: " + name_; }

 private:
  kernels::AddOnednn kernel_;
  ValueId a_, b_, dst_;
  std::string name_;
};

class ReluStep final : public Step {
 public:
  ReluStep(const dnnl::engine& engine, ValueId src, ValueId dst, std::string name)
      : kernel_(engine), src_(src), dst_(dst), name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "relu: " + name_; }

 private:
  kernels::ReluOnednn kernel_;
  ValueId src_, dst_;
  std::string name_;
};

class SoftmaxStep final : public Step {
 public:
  SoftmaxStep(const dnnl::engine& engine, int64_t axis, bool flatten_to_2d, ValueId src,
              ValueId dst, std::string name)
      : kernel_(engine, axis, flatten_to_2d), src_(src), dst_(dst), name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "softmax: " + name_; }

 private:
  kernels::SoftmaxOnednn kernel_;
  ValueId src_, dst_;
  std::string name_;
};

// Any registered op on its scalar reference: inputs are copied into
// tensors, outputs copied back. The fallback for ops without a fast path.
class ReferenceStep final : public Step {
 public:
  ReferenceStep(const Graph* graph, int node_index)
      : graph_(graph),
        node_index_(node_index),
        schema_(FindOpSchema(graph->nodes()[node_index].op_type)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override {
    return "reference: " + graph_->nodes()[node_index_].name;
  }

 private:
  const Graph* graph_;
  int node_index_;
  const OpSchema* schema_;
  std::vector<kernels::Tensor> inputs_;  // reused buffers
};

}  // namespace numaserve::engine
