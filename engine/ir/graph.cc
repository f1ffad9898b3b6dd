#include "engine/ir/graph.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace numaserve::engine {

int64_t Constant::ByteSize() const {
  return kernels::NumElements(shape) * static_cast<int64_t>(DataTypeSize(type));
}

int64_t Node::GetInt(const std::string& key, int64_t default_value) const {
  auto it = attributes.find(key);
  if (it == attributes.end()) return default_value;
  if (const auto* v = std::get_if<int64_t>(&it->second)) return *v;
  return default_value;
}

float Node::GetFloat(const std::string& key, float default_value) const {
  auto it = attributes.find(key);
  if (it == attributes.end()) return default_value;
  if (const auto* v = std::get_if<float>(&it->second)) return *v;
  return default_value;
}

std::vector<int64_t> Node::GetInts(const std::string& key,
                                   std::vector<int64_t> default_value) const {
  auto it = attributes.find(key);
  if (it == attributes.end()) return default_value;
  if (const auto* v = std::get_if<std::vector<int64_t>>(&it->second)) return *v;
  if (const auto* v = std::get_if<int64_t>(&it->second)) return {*v};
  return default_value;
}

std::vector<float> Node::GetFloats(const std::string& key, std::vector<float> default_value) const {
  auto it = attributes.find(key);
  if (it == attributes.end()) return default_value;
  if (const auto* v = std::get_if<std::vector<float>>(&it->second)) return *v;
  if (const auto* v = std::get_if<float>(&it->second)) return {*v};
  return default_value;
}

std::string Node::GetString(const std::string& key, std::string default_value) const {
  auto it = attributes.find(key);
  if (it == attributes.end()) return default_value;
  if (const auto* v = std::get_if<std::string>(&it->second)) return *v;
  return default_value;
}

std::string Node::Describe() const { return absl::StrCat("node '", name, "' (op ", op_type, ")"); }

ValueId Graph::GetOrAddValue(const std::string& name) {
  auto [it, inserted] = by_name_.try_emplace(name, static_cast<ValueId>(values_.size()));
  if (inserted) {
    Value value;
    value.name = name;
    values_.push_back(std::move(value));
  }
  return it->second;
}

std::optional<ValueId> Graph::FindValue(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

namespace {

// The thread's ScopedShapeValues: the graph they answer for, and them.
thread_local const Graph* scoped_graph = nullptr;
thread_local const ShapeValues* scoped_values = nullptr;

}  // namespace

ScopedShapeValues::ScopedShapeValues(const Graph* graph, const ShapeValues* values)
    : previous_graph_(scoped_graph), previous_values_(scoped_values) {
  scoped_graph = graph;
  scoped_values = values;
}

ScopedShapeValues::~ScopedShapeValues() {
  scoped_graph = previous_graph_;
  scoped_values = previous_values_;
}

const Constant* Graph::FindConstant(ValueId id) const {
  auto it = constants_.find(id);
  if (it != constants_.end()) return &it->second;
  if (scoped_values != nullptr && scoped_graph == this) {
    auto v = scoped_values->find(id);
    if (v != scoped_values->end()) return &v->second;
  }
  return nullptr;
}

bool Graph::IsShapeParameter(ValueId id) const {
  return std::find(shape_parameters_.begin(), shape_parameters_.end(), id) !=
         shape_parameters_.end();
}

std::vector<std::vector<int>> Graph::Consumers() const {
  std::vector<std::vector<int>> consumers(values_.size());
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
    for (ValueId in : nodes_[i].inputs) {
      if (in != kNoValue) consumers[in].push_back(i);
    }
  }
  return consumers;
}

}  // namespace numaserve::engine
