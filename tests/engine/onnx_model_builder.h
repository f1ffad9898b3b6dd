// Builds small ONNX models in C++ (onnx protobuf API) and saves them to a
// temporary file, so engine tests need no model files checked in.
#pragma once

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/tensor.h"

namespace numaserve::engine::testing {

inline constexpr int64_t kUnknownDim = -2;

class OnnxModelBuilder {
 public:
  explicit OnnxModelBuilder(int64_t opset = 13) {
    model_.set_ir_version(8);
    model_.set_producer_name("numaserve-tests");
    auto* op = model_.add_opset_import();
    op->set_domain("");
    op->set_version(opset);
    model_.mutable_graph()->set_name("test");
  }

  // dims: -1 becomes the symbolic batch dim "batch".
  OnnxModelBuilder& Input(const std::string& name, const std::vector<int64_t>& dims,
                          int32_t elem_type = onnx::TensorProto::FLOAT) {
    SetType(model_.mutable_graph()->add_input(), name, &dims, elem_type);
    return *this;
  }

  // As Input, with dim d named names[d] where that is not empty (an ONNX
  // dim_param, dynamic: "seq"); kUnknownDim is a dynamic dim without a
  // name, -1 the batch as above.
  OnnxModelBuilder& NamedInput(const std::string& name, const std::vector<int64_t>& dims,
                               const std::vector<std::string>& names,
                               int32_t elem_type = onnx::TensorProto::FLOAT) {
    onnx::ValueInfoProto* v = model_.mutable_graph()->add_input();
    SetType(v, name, &dims, elem_type);
    NameDims(v, names);
    return *this;
  }
  OnnxModelBuilder& NamedOutput(const std::string& name, const std::vector<int64_t>& dims,
                                const std::vector<std::string>& names,
                                int32_t elem_type = onnx::TensorProto::FLOAT) {
    onnx::ValueInfoProto* v = model_.mutable_graph()->add_output();
    SetType(v, name, &dims, elem_type);
    NameDims(v, names);
    return *this;
  }

  // The checker requires a shape on graph outputs; -1 is "batch" as above
  // and kUnknownDim a dim with neither value nor name.
  OnnxModelBuilder& Output(const std::string& name, const std::vector<int64_t>& dims,
                           int32_t elem_type = onnx::TensorProto::FLOAT) {
    SetType(model_.mutable_graph()->add_output(), name, &dims, elem_type);
    return *this;
  }

  OnnxModelBuilder& Initializer(const std::string& name, const kernels::Tensor& t) {
    onnx::TensorProto* p = model_.mutable_graph()->add_initializer();
    p->set_name(name);
    p->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : t.shape) p->add_dims(d);
    p->set_raw_data(
        std::string(reinterpret_cast<const char*>(t.data.data()), t.data.size() * sizeof(float)));
    return *this;
  }

  OnnxModelBuilder& Int64Initializer(const std::string& name, const std::vector<int64_t>& v) {
    onnx::TensorProto* p = model_.mutable_graph()->add_initializer();
    p->set_name(name);
    p->set_data_type(onnx::TensorProto::INT64);
    p->add_dims(static_cast<int64_t>(v.size()));
    for (int64_t x : v) p->add_int64_data(x);
    return *this;
  }

  // An initializer of any element type from its little-endian element bytes.
  OnnxModelBuilder& RawInitializer(const std::string& name, int32_t elem_type,
                                   const std::vector<int64_t>& dims, const void* data,
                                   size_t bytes) {
    onnx::TensorProto* p = model_.mutable_graph()->add_initializer();
    p->set_name(name);
    p->set_data_type(elem_type);
    for (int64_t d : dims) p->add_dims(d);
    p->set_raw_data(std::string(static_cast<const char*>(data), bytes));
    return *this;
  }

  // Adds a node; attributes are added to the returned proto with Attr*.
  onnx::NodeProto& Node(const std::string& op, const std::vector<std::string>& inputs,
                        const std::vector<std::string>& outputs, const std::string& name = "") {
    onnx::NodeProto* n = model_.mutable_graph()->add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? absl::StrCat(op, "_", model_.graph().node_size()) : name);
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    return *n;
  }

  static void AttrInt(onnx::NodeProto& n, const std::string& name, int64_t v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void AttrFloat(onnx::NodeProto& n, const std::string& name, float v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }

  static void AttrInts(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static void AttrString(onnx::NodeProto& n, const std::string& name, const std::string& v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
  }

  // Writes the model under the test temp dir; returns the path. The name
  // holds the process id: ctest runs each test of a binary in its own
  // process, two at once under -j2, and a name shared between processes
  // would let one truncate the file while another reads it. The files are
  // removed when the process that wrote them exits.
  std::string Save(const std::string& stem) const {
    static std::atomic<int> counter{0};
    const std::string path = absl::StrCat(::testing::TempDir(), "/numaserve_", stem, "_", getpid(),
                                          "_", counter++, ".onnx");
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      model_.SerializeToOstream(&out);
    }
    SavedFiles::Get().Add(path);
    return path;
  }

  onnx::ModelProto& proto() { return model_; }

 private:
  // Paths this process saved, removed at exit (not by a forked child).
  class SavedFiles {
   public:
    static SavedFiles& Get() {
      static SavedFiles files;
      return files;
    }
    void Add(const std::string& path) {
      std::lock_guard<std::mutex> lock(mu_);
      paths_.push_back(path);
    }
    ~SavedFiles() {
      if (getpid() != owner_) return;
      for (const std::string& path : paths_) std::remove(path.c_str());
    }

   private:
    const pid_t owner_ = getpid();
    std::mutex mu_;
    std::vector<std::string> paths_;
  };

  static void NameDims(onnx::ValueInfoProto* v, const std::vector<std::string>& names) {
    auto* shape = v->mutable_type()->mutable_tensor_type()->mutable_shape();
    for (int d = 0; d < shape->dim_size() && d < static_cast<int>(names.size()); ++d) {
      if (!names[d].empty()) shape->mutable_dim(d)->set_dim_param(names[d]);
    }
  }

  static void SetType(onnx::ValueInfoProto* v, const std::string& name,
                      const std::vector<int64_t>* dims, int32_t elem_type) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem_type);
    if (dims == nullptr) return;
    auto* shape = tt->mutable_shape();
    for (int64_t d : *dims) {
      auto* dim = shape->add_dim();
      if (d == kUnknownDim) continue;
      if (d < 0) {
        dim->set_dim_param("batch");
      } else {
        dim->set_dim_value(d);
      }
    }
  }

  onnx::ModelProto model_;
};

}  // namespace numaserve::engine::testing
