// Builds small engine::Graph objects directly in C++ for training tests
// (no ONNX file, so ops the inference engine lacks can be tested too).
#pragma once

#include <random>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "kernels/tensor.h"

namespace numaserve::training::testing {

class GraphBuilder {
 public:
  GraphBuilder() { graph_.set_opset(13); }

  GraphBuilder& Input(const std::string& name) {
    graph_.inputs().push_back(graph_.GetOrAddValue(name));
    return *this;
  }
  GraphBuilder& Output(const std::string& name) {
    graph_.outputs().push_back(graph_.GetOrAddValue(name));
    return *this;
  }
  // An FP32 initializer with values uniform in [-1, 1].
  GraphBuilder& Weight(const std::string& name, const kernels::Shape& shape) {
    kernels::Tensor t(shape);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& v : t.data) v = u(rng_);
    engine::Constant c;
    c.type = engine::DataType::kFloat32;
    c.shape = shape;
    c.f32 = std::move(t);
    graph_.SetConstant(graph_.GetOrAddValue(name), std::move(c));
    return *this;
  }
  // An FP32 initializer with the given values.
  GraphBuilder& Weight(const std::string& name, const kernels::Shape& shape,
                       std::vector<float> values) {
    engine::Constant c;
    c.type = engine::DataType::kFloat32;
    c.shape = shape;
    c.f32 = kernels::Tensor(shape, std::move(values));
    graph_.SetConstant(graph_.GetOrAddValue(name), std::move(c));
    return *this;
  }
  GraphBuilder& Int64(const std::string& name, const std::vector<int64_t>& values) {
    engine::Constant c;
    c.type = engine::DataType::kInt64;
    c.shape = {static_cast<int64_t>(values.size())};
    c.i64 = values;
    graph_.SetConstant(graph_.GetOrAddValue(name), std::move(c));
    return *this;
  }
  GraphBuilder& Node(const std::string& op, const std::vector<std::string>& inputs,
                     const std::vector<std::string>& outputs,
                     std::map<std::string, engine::AttributeValue> attributes = {}) {
    engine::Node node;
    node.name = outputs[0];
    node.op_type = op;
    for (const std::string& in : inputs) node.inputs.push_back(graph_.GetOrAddValue(in));
    for (const std::string& out : outputs) node.outputs.push_back(graph_.GetOrAddValue(out));
    node.attributes = std::move(attributes);
    graph_.nodes().push_back(std::move(node));
    return *this;
  }
  engine::Graph Build() { return graph_; }

 private:
  engine::Graph graph_;
  std::mt19937 rng_{7};
};

}  // namespace numaserve::training::testing
