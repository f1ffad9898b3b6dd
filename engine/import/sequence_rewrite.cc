#include "engine/import/sequence_rewrite.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/import/onnx_read.h"

namespace numaserve::engine {
namespace {

constexpr int kMaxDepth = 64;  // subgraphs a hostile file may nest

// --- SplitToSequence ------------------------------------------------------------------

// The INT64/INT32 values of the constant NAME (an initializer or a Constant
// node's value / value_int(s)), and whether it is a scalar; nullopt when it
// is no such constant.
struct Ints {
  std::vector<int64_t> values;
  bool scalar = false;
};

std::optional<Ints> TensorInts(const onnx::TensorProto& t) {
  if (UsesExternalData(t) || t.dims_size() > 1) return std::nullopt;
  Ints out;
  out.scalar = t.dims_size() == 0;
  const int64_t count = out.scalar ? 1 : t.dims(0);
  if (count < 0 || count > 4096) return std::nullopt;  // a list of sizes, not data
  if (t.data_type() == onnx::TensorProto::INT64) {
    if (!t.raw_data().empty()) {
      if (t.raw_data().size() != static_cast<size_t>(count) * 8) return std::nullopt;
      out.values.resize(static_cast<size_t>(count));
      std::memcpy(out.values.data(), t.raw_data().data(), t.raw_data().size());
    } else {
      if (t.int64_data_size() != count) return std::nullopt;
      out.values.assign(t.int64_data().begin(), t.int64_data().end());
    }
  } else if (t.data_type() == onnx::TensorProto::INT32) {
    if (!t.raw_data().empty()) {
      if (t.raw_data().size() != static_cast<size_t>(count) * 4) return std::nullopt;
      std::vector<int32_t> v(static_cast<size_t>(count));
      std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
      out.values.assign(v.begin(), v.end());
    } else {
      if (t.int32_data_size() != count) return std::nullopt;
      out.values.assign(t.int32_data().begin(), t.int32_data().end());
    }
  } else {
    return std::nullopt;
  }
  return out;
}

// G's constants by name (initializers, Constant nodes), and each value's
// readers (node, input slot): built once per graph, so that a file of many
// SplitToSequence nodes costs time in proportion to its size.
struct GraphIndex {
  std::map<std::string, const onnx::TensorProto*> initializers;
  std::map<std::string, const onnx::NodeProto*> constant_nodes;
  std::map<std::string, std::vector<std::pair<int, int>>> readers;

  explicit GraphIndex(const onnx::GraphProto& g) {
    for (const onnx::TensorProto& t : g.initializer()) initializers.emplace(t.name(), &t);
    for (int i = 0; i < g.node_size(); ++i) {
      const onnx::NodeProto& n = g.node(i);
      if (n.op_type() == "Constant" && n.output_size() == 1) {
        constant_nodes.emplace(n.output(0), &n);
      }
      for (int s = 0; s < n.input_size(); ++s) {
        if (!n.input(s).empty()) readers[n.input(s)].emplace_back(i, s);
      }
    }
  }

  std::optional<Ints> ConstantInts(const std::string& name) const {
    if (auto it = initializers.find(name); it != initializers.end()) return TensorInts(*it->second);
    auto it = constant_nodes.find(name);
    if (it == constant_nodes.end() || it->second->attribute_size() != 1) return std::nullopt;
    const onnx::AttributeProto& a = it->second->attribute(0);
    if (a.name() == "value" && a.has_t()) return TensorInts(a.t());
    if (a.name() == "value_int") return Ints{{a.i()}, true};
    if (a.name() == "value_ints" && a.ints_size() <= 4096) {
      return Ints{{a.ints().begin(), a.ints().end()}, false};
    }
    return std::nullopt;
  }
};

// The rank and the size of dim AXIS of NAME where the model states them.
std::optional<std::pair<int64_t, int64_t>> StatedDim(const onnx::GraphProto& g,
                                                     const std::string& name, int64_t axis) {
  auto find = [&](const auto& infos) -> const onnx::ValueInfoProto* {
    for (const onnx::ValueInfoProto& v : infos) {
      if (v.name() == name) return &v;
    }
    return nullptr;
  };
  const onnx::ValueInfoProto* v = find(g.input());
  if (v == nullptr) v = find(g.value_info());
  if (v == nullptr) v = find(g.output());
  if (v == nullptr || !v->type().has_tensor_type() || !v->type().tensor_type().has_shape()) {
    return std::nullopt;
  }
  const auto& shape = v->type().tensor_type().shape();
  const int64_t rank = shape.dim_size();
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank || !shape.dim(static_cast<int>(axis)).has_dim_value()) {
    return std::nullopt;
  }
  const int64_t d = shape.dim(static_cast<int>(axis)).dim_value();
  if (d <= 0) return std::nullopt;
  return std::make_pair(rank, d);
}

int64_t IntAttribute(const onnx::NodeProto& n, const std::string& name, int64_t fallback) {
  for (const auto& a : n.attribute()) {
    if (a.name() == name) return a.i();
  }
  return fallback;
}

void AddInts(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

// A name not yet used in G, from STEM.
std::string FreshName(const std::set<std::string>& used, const std::string& stem) {
  std::string name = stem;
  for (int i = 1; used.contains(name); ++i) name = absl::StrCat(stem, "_", i);
  return name;
}

void NamesOf(const onnx::GraphProto& g, std::set<std::string>& out) {
  for (const auto& v : g.input()) out.insert(v.name());
  for (const auto& t : g.initializer()) out.insert(t.name());
  for (const auto& n : g.node()) out.insert(n.output().begin(), n.output().end());
}

// At most this many parts: a Split of more is no export's.
constexpr int64_t kMaxParts = 4096;

// The SequenceAt readers of SEQ (node, index), each at a constant index;
// nullopt where any reader is something else.
std::optional<std::vector<std::pair<int, int64_t>>> SequenceReaders(const onnx::GraphProto& g,
                                                                    const std::string& seq,
                                                                    const GraphIndex& found) {
  std::vector<std::pair<int, int64_t>> readers;
  const auto it = found.readers.find(seq);
  if (it == found.readers.end()) return readers;
  for (const auto& [i, slot] : it->second) {
    const onnx::NodeProto& n = g.node(i);
    if (n.op_type() != "SequenceAt" || slot != 0 || n.input_size() != 2 || n.output_size() != 1) {
      return std::nullopt;
    }
    const auto at = found.ConstantInts(n.input(1));
    if (!at || !at->scalar) return std::nullopt;
    readers.emplace_back(i, at->values[0]);
  }
  return readers;
}

// The sizes of SPLIT's parts along AXIS: its `split` input's where that is
// a list, else chunks of its scalar (or 1) over the axis's stated size;
// none where they are not known here (a dynamic dim, a runtime split).
absl::StatusOr<std::vector<int64_t>> PartSizes(const onnx::GraphProto& g,
                                               const onnx::NodeProto& split, int64_t axis,
                                               const GraphIndex& found) {
  int64_t chunk = 1;
  if (split.input_size() > 1 && !split.input(1).empty()) {
    const std::optional<Ints> given = found.ConstantInts(split.input(1));
    if (!given.has_value()) return std::vector<int64_t>();
    if (!given->scalar) return given->values;  // at most 4096 (TensorInts)
    chunk = given->values[0];
  }
  const auto dim = StatedDim(g, split.input(0), axis);
  if (!dim.has_value()) return std::vector<int64_t>();
  if (chunk <= 0 || (dim->second - 1) / chunk + 1 > kMaxParts) {
    return absl::InvalidArgumentError(
        absl::StrCat("node '", split.name(), "' (op SplitToSequence): chunks of ", chunk,
                     " over a dim of ", dim->second, " are not 1 to ", kMaxParts, " parts"));
  }
  std::vector<int64_t> sizes;
  for (int64_t left = dim->second; left > 0; left -= chunk) sizes.push_back(std::min(chunk, left));
  return sizes;
}

// Each SequenceAt of READERS becomes an Identity of its part (a Squeeze of
// AXIS where SQUEEZE: keepdims=0 without a split).
void ReplaceReaders(onnx::GraphProto& g, const std::vector<std::pair<int, int64_t>>& readers,
                    const std::vector<std::string>& parts, bool squeeze, int64_t axis,
                    int64_t opset, const std::string& stem, std::set<std::string>& used,
                    onnx::GraphProto& added) {
  const int64_t count = static_cast<int64_t>(parts.size());
  for (const auto& [node, at] : readers) {
    onnx::NodeProto& n = *g.mutable_node(node);
    n.clear_input();
    n.clear_attribute();
    n.add_input(parts[static_cast<size_t>(at < 0 ? at + count : at)]);
    if (!squeeze) {
      n.set_op_type("Identity");
    } else if (opset >= 13) {
      n.set_op_type("Squeeze");
      const std::string axes = FreshName(used, stem + "_axes");
      used.insert(axes);
      onnx::TensorProto* t = added.add_initializer();
      t->set_name(axes);
      t->set_data_type(onnx::TensorProto::INT64);
      t->add_dims(1);
      t->add_int64_data(axis);
      n.add_input(axes);
    } else {
      n.set_op_type("Squeeze");
      AddInts(n, "axes", {axis});
    }
  }
}

absl::Status RewriteOne(onnx::GraphProto& g, int index, int64_t opset, std::set<std::string>& used,
                        const std::set<std::string>& read_by_subgraphs, const GraphIndex& found,
                        onnx::GraphProto& added) {
  onnx::NodeProto& split = *g.mutable_node(index);
  if (split.output_size() != 1 || split.input_size() < 1) return absl::OkStatus();
  const std::string seq = split.output(0);
  if (read_by_subgraphs.contains(seq)) return absl::OkStatus();
  for (const auto& o : g.output()) {
    if (o.name() == seq) return absl::OkStatus();
  }
  const auto found_readers = SequenceReaders(g, seq, found);
  if (!found_readers.has_value()) return absl::OkStatus();
  const std::vector<std::pair<int, int64_t>>& readers = *found_readers;
  const int64_t axis = IntAttribute(split, "axis", 0);
  auto found_sizes = PartSizes(g, split, axis, found);
  if (!found_sizes.ok()) return found_sizes.status();
  const std::vector<int64_t>& sizes = *found_sizes;
  if (sizes.empty()) return absl::OkStatus();
  const int64_t parts = static_cast<int64_t>(sizes.size());
  for (const auto& [node, at] : readers) {
    if (at < -parts || at >= parts) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", g.node(node).name(), "' (op SequenceAt): index ", at, " of the ",
                       parts, " parts node '", split.name(), "' (op SplitToSequence) makes"));
    }
  }
  const bool squeeze =
      (split.input_size() < 2 || split.input(1).empty()) && IntAttribute(split, "keepdims", 1) == 0;
  // The Split, its sizes and its parts.
  const std::string stem = split.name().empty() ? seq : split.name();
  const std::string x = split.input(0);
  split.clear_input();
  split.clear_output();
  split.clear_attribute();
  split.set_op_type("Split");
  split.add_input(x);
  if (opset >= 13) {
    const std::string name = FreshName(used, stem + "_sizes");
    used.insert(name);
    onnx::TensorProto* t = added.add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(parts);
    for (int64_t s : sizes) t->add_int64_data(s);
    split.add_input(name);
  } else {
    AddInts(split, "split", sizes);
  }
  auto* a = split.add_attribute();
  a->set_name("axis");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(axis);
  std::vector<std::string> part_names;
  for (int64_t i = 0; i < parts; ++i) {
    part_names.push_back(FreshName(used, absl::StrCat(stem, "_part", i)));
    used.insert(part_names.back());
    split.add_output(part_names.back());
  }
  ReplaceReaders(g, readers, part_names, squeeze, axis, opset, stem, used, added);
  return absl::OkStatus();
}

absl::Status RewriteIn(onnx::GraphProto& g, int64_t opset, int depth) {
  if (depth > kMaxDepth) return absl::OkStatus();  // refused where it is read
  std::set<std::string> used, read_by_subgraphs;
  NamesOf(g, used);
  for (onnx::NodeProto& n : *g.mutable_node()) {
    for (onnx::AttributeProto& a : *n.mutable_attribute()) {
      if (!a.has_g()) continue;
      if (absl::Status s = RewriteIn(*a.mutable_g(), opset, depth + 1); !s.ok()) return s;
      NamesOf(a.g(), used);  // fresh names stay fresh in nested scopes too
      if (auto outer = OuterNames(a.g()); outer.ok()) {
        read_by_subgraphs.insert(outer->begin(), outer->end());
      }
    }
  }
  std::vector<int> splits;
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& n = g.node(i);
    if (n.op_type() == "SplitToSequence" && (n.domain().empty() || n.domain() == "ai.onnx")) {
      splits.push_back(i);
    }
  }
  if (splits.empty()) return absl::OkStatus();
  // The index holds pointers into G's nodes and initializers: the rewrites
  // change nodes in place and keep the initializers they make in ADDED,
  // appended once all are done.
  const GraphIndex found(g);
  onnx::GraphProto added;  // initializers the rewrites make, appended at the end
  for (int i : splits) {
    if (absl::Status s = RewriteOne(g, i, opset, used, read_by_subgraphs, found, added); !s.ok()) {
      return s;
    }
  }
  for (const onnx::TensorProto& t : added.initializer()) *g.add_initializer() = t;
  return absl::OkStatus();
}

// --- Dead nodes -----------------------------------------------------------------------

// The names node N reads: its inputs and what its subgraphs read from
// outside them.
std::set<std::string> Reads(const onnx::NodeProto& n) {
  std::set<std::string> reads;
  for (const std::string& in : n.input()) {
    if (!in.empty()) reads.insert(in);
  }
  for (const onnx::AttributeProto& a : n.attribute()) {
    if (!a.has_g()) continue;
    auto outer = OuterNames(a.g());
    if (outer.ok()) reads.insert(outer->begin(), outer->end());
  }
  return reads;
}

// Marks the nodes of G that LIVE (names needed) depends on, adding what
// they read to LIVE; by node. A worklist from each needed name to the node
// writing it: linear in the graph, whatever order its nodes are in.
std::vector<char> MarkLive(const onnx::GraphProto& g, std::set<std::string>& live) {
  std::map<std::string, int> writer;
  for (int i = 0; i < g.node_size(); ++i) {
    for (const std::string& o : g.node(i).output()) {
      if (!o.empty()) writer.emplace(o, i);
    }
  }
  std::vector<char> marked(static_cast<size_t>(g.node_size()), 0);
  std::vector<std::string> pending(live.begin(), live.end());
  while (!pending.empty()) {
    const std::string name = std::move(pending.back());
    pending.pop_back();
    const auto it = writer.find(name);
    if (it == writer.end() || marked[static_cast<size_t>(it->second)]) continue;
    marked[static_cast<size_t>(it->second)] = 1;
    for (const std::string& read : Reads(g.node(it->second))) {
      if (live.insert(read).second) pending.push_back(read);
    }
  }
  return marked;
}

// Drops a Loop's carried values and scan outputs that LIVE (the names read
// after it) does not need, nor its condition, nor the carried values it
// keeps; true if any went.
bool PruneLoop(onnx::NodeProto& loop, const std::set<std::string>& live) {
  onnx::GraphProto* body = nullptr;
  for (auto& a : *loop.mutable_attribute()) {
    if (a.name() == "body" && a.has_g()) body = a.mutable_g();
  }
  const int carried = loop.input_size() - 2;
  if (body == nullptr || carried < 0 || body->input_size() != carried + 2 ||
      body->output_size() < carried + 1 || loop.output_size() != body->output_size() - 1) {
    return false;  // malformed: the checker says why
  }
  const int outputs = loop.output_size();
  std::vector<char> needed(static_cast<size_t>(outputs), 0);
  for (int j = 0; j < outputs; ++j) {
    needed[static_cast<size_t>(j)] = !loop.output(j).empty() && live.contains(loop.output(j));
  }
  for (bool changed = true; changed;) {
    changed = false;
    std::set<std::string> body_live = {body->output(0).name()};
    for (int j = 0; j < outputs; ++j) {
      if (needed[static_cast<size_t>(j)]) body_live.insert(body->output(j + 1).name());
    }
    MarkLive(*body, body_live);
    for (int j = 0; j < carried; ++j) {
      if (!needed[static_cast<size_t>(j)] && body_live.contains(body->input(j + 2).name())) {
        needed[static_cast<size_t>(j)] = 1;
        changed = true;
      }
    }
  }
  bool pruned = false;
  for (int j = outputs - 1; j >= 0; --j) {
    if (needed[static_cast<size_t>(j)]) continue;
    pruned = true;
    loop.mutable_output()->erase(loop.mutable_output()->begin() + j);
    body->mutable_output()->erase(body->mutable_output()->begin() + j + 1);
    if (j < carried) {
      loop.mutable_input()->erase(loop.mutable_input()->begin() + j + 2);
      body->mutable_input()->erase(body->mutable_input()->begin() + j + 2);
    }
  }
  return pruned;
}

void DropDeadIn(onnx::GraphProto& g, int depth) {
  if (depth > kMaxDepth) return;
  for (bool again = true; again;) {
    std::set<std::string> live;
    for (const auto& o : g.output()) live.insert(o.name());
    const std::vector<char> marked = MarkLive(g, live);
    onnx::GraphProto kept_nodes;
    bool dropped = false;
    for (int i = 0; i < g.node_size(); ++i) {
      if (marked[static_cast<size_t>(i)]) {
        *kept_nodes.add_node() = g.node(i);
      } else {
        dropped = true;
      }
    }
    if (dropped) g.mutable_node()->Swap(kept_nodes.mutable_node());
    again = false;
    for (onnx::NodeProto& n : *g.mutable_node()) {
      if (n.op_type() == "Loop" && PruneLoop(n, live)) again = true;
    }
  }
  for (onnx::NodeProto& n : *g.mutable_node()) {
    for (onnx::AttributeProto& a : *n.mutable_attribute()) {
      if (a.has_g()) DropDeadIn(*a.mutable_g(), depth + 1);
    }
  }
}

}  // namespace

absl::Status RewriteSplitToSequence(onnx::GraphProto& g, int64_t opset) {
  return RewriteIn(g, opset, 0);
}

void DropDeadNodes(onnx::GraphProto& g) { DropDeadIn(g, 0); }

}  // namespace numaserve::engine
