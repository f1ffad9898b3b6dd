// The engine's graph IR: what ONNX import produces and what executors and
// compilation passes consume. Values are referred to by index; nodes are in
// topological order (as ONNX requires).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "engine/ir/types.h"
#include "kernels/tensor.h"

namespace numaserve::engine {

using kernels::Shape;
using ValueId = int;
inline constexpr ValueId kNoValue = -1;  // an omitted optional input

struct Value {
  std::string name;
  DataType type = DataType::kUnknown;
  // -1 where the dimension is dynamic (graph inputs and outputs: dim 0 is
  // the batch, any other may be dynamic too). Empty with has_shape false
  // when not known.
  Shape shape;
  bool has_shape = false;
  // By dim of `shape` (graph inputs and outputs): the ONNX dim_param naming
  // a dynamic dim ("seq"), "" for a fixed dim or a dynamic one without a
  // name. Dims of one name have one size in every run.
  std::vector<std::string> dim_names;
};

// A constant tensor (initializer). FP32 data lives in `f32`; every other
// type keeps its exact elements in `bytes`, integer and boolean data
// (e.g. Reshape's target shape) also in `i64`, and non-FP32 types an FP32
// copy in `f32` for the FP32 references.
struct Constant {
  DataType type = DataType::kUnknown;
  kernels::Tensor f32;  // shape + data when type is kFloat32
  Shape shape;
  std::vector<int64_t> i64;    // integer and BOOL types (UINT64 as its bits)
  std::vector<uint8_t> bytes;  // non-FP32 types: the elements as stored at runtime

  // Set when this FP32 constant is a DequantizeLinear of INT8 values with zero
  // zero points (folded at import): the INT8 kernels run on these.
  struct Int8Origin {
    std::vector<int8_t> values;  // same shape as the constant
    std::vector<float> scales;   // 1 value (per tensor) or shape[axis] values
    int64_t axis = -1;           // -1: per tensor; else the (non-negative) axis of the scales
  };
  // Only ever set where the constant is made (constant folding of a
  // DequantizeLinear); a constant computed from this one (a transposed or
  // reshaped copy) is a new Constant without it, so it is never stale.
  std::optional<Int8Origin> int8_origin;

  int64_t ByteSize() const;
};

using AttributeValue =
    std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>>;

struct Node {
  std::string name;
  std::string op_type;
  std::vector<ValueId> inputs;  // kNoValue for an omitted optional input
  std::vector<ValueId> outputs;
  std::map<std::string, AttributeValue> attributes;
  // TENSOR attributes (ConstantOfShape's value) with their exact elements;
  // an FP32 copy is also in `attributes` as a float list.
  std::map<std::string, Constant> tensor_attributes;

  int64_t GetInt(const std::string& key, int64_t default_value) const;
  float GetFloat(const std::string& key, float default_value) const;
  std::vector<int64_t> GetInts(const std::string& key, std::vector<int64_t> default_value) const;
  std::vector<float> GetFloats(const std::string& key, std::vector<float> default_value) const;
  std::string GetString(const std::string& key, std::string default_value) const;
  bool HasAttribute(const std::string& key) const { return attributes.contains(key); }
  // "node 'fc1' (op Gemm)" for error messages.
  std::string Describe() const;
};

class Graph;

// Values computed from shapes for one signature (Shape -> Gather -> Concat
// -> a Reshape's target, a Slice's ends, a Range's limit): known once every
// input's shape is, different from one signature to the next, so never
// graph constants. PropagateShapesAndValues (shape_propagation.h) computes
// them per signature; while a ScopedShapeValues is alive on a thread,
// Graph::FindConstant and Graph::IsConstant on that thread answer for them
// too, so that the ops' shape functions, validation and references read
// them as they read constants. Node-based: pointers to its constants stay
// valid while values are added.
using ShapeValues = absl::node_hash_map<ValueId, Constant>;

class ScopedShapeValues {
 public:
  // VALUES (may be null: none) answer for GRAPH on this thread until this
  // scope ends; an enclosing scope is restored then.
  ScopedShapeValues(const Graph* graph, const ShapeValues* values);
  ~ScopedShapeValues();
  ScopedShapeValues(const ScopedShapeValues&) = delete;
  ScopedShapeValues& operator=(const ScopedShapeValues&) = delete;

 private:
  const Graph* previous_graph_;
  const ShapeValues* previous_values_;
};

class Graph {
 public:
  // Adds a value, or returns the existing one with that name.
  ValueId GetOrAddValue(const std::string& name);
  std::optional<ValueId> FindValue(const std::string& name) const;

  Value& value(ValueId id) { return values_[id]; }
  const Value& value(ValueId id) const { return values_[id]; }
  const std::vector<Value>& values() const { return values_; }
  int num_values() const { return static_cast<int>(values_.size()); }

  std::vector<Node>& nodes() { return nodes_; }
  const std::vector<Node>& nodes() const { return nodes_; }

  // Runtime inputs (initializers excluded) and outputs, in model order.
  std::vector<ValueId>& inputs() { return inputs_; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  std::vector<ValueId>& outputs() { return outputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }

  void SetConstant(ValueId id, Constant c) { constants_[id] = std::move(c); }
  // A graph constant, or a value of the thread's ScopedShapeValues for
  // this graph; null otherwise.
  const Constant* FindConstant(ValueId id) const;
  bool IsConstant(ValueId id) const { return FindConstant(id) != nullptr; }
  // Graph constants only (initializers, Constant nodes, folded values).
  bool IsGraphConstant(ValueId id) const { return constants_.contains(id); }

  // Shape parameters: small shape values (a Reshape's target, a Slice's
  // ends, a Resize's sizes) that the ops reading them take as constants,
  // one per signature (set at import). A node reading one runs as on a
  // constant (NeedsTypedRun); a signature at which one is not computed
  // is refused.
  void AddShapeParameter(ValueId id) { shape_parameters_.push_back(id); }
  const std::vector<ValueId>& shape_parameters() const { return shape_parameters_; }
  bool IsShapeParameter(ValueId id) const;
  const absl::flat_hash_map<ValueId, Constant>& constants() const { return constants_; }

  // Node indices reading each value (computed on demand; O(nodes)).
  std::vector<std::vector<int>> Consumers() const;

  int64_t opset() const { return opset_; }
  void set_opset(int64_t opset) { opset_ = opset; }

 private:
  std::vector<Value> values_;
  absl::flat_hash_map<std::string, ValueId> by_name_;
  std::vector<Node> nodes_;
  std::vector<ValueId> inputs_;
  std::vector<ValueId> outputs_;
  absl::flat_hash_map<ValueId, Constant> constants_;
  std::vector<ValueId> shape_parameters_;
  int64_t opset_ = 0;
};

}  // namespace numaserve::engine
