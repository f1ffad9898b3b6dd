#include "engine/training/onnx_export.h"

#include <onnx/onnx_pb.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace numaserve::training {

absl::Status ExportOnnx(const std::string& source_model, const std::vector<NamedWeights>& weights,
                        const std::string& out_path) {
  std::ifstream in(source_model, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(source_model, ": cannot open"));
  std::stringstream bytes;
  bytes << in.rdbuf();
  onnx::ModelProto model;
  if (!model.ParseFromString(bytes.str())) {
    return absl::InvalidArgumentError(absl::StrCat(source_model, ": not an ONNX model"));
  }
  absl::flat_hash_map<std::string, const std::vector<float>*> by_name;
  for (const NamedWeights& w : weights) by_name[w.name] = w.data;
  int replaced = 0;
  for (onnx::TensorProto& t : *model.mutable_graph()->mutable_initializer()) {
    auto it = by_name.find(t.name());
    if (it == by_name.end()) continue;
    int64_t count = 1;
    for (int64_t d : t.dims()) count *= d;
    if (count != static_cast<int64_t>(it->second->size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_model, ": initializer '", t.name(), "' has ", count,
                       " elements, the trained tensor ", it->second->size()));
    }
    t.clear_float_data();
    t.set_data_type(onnx::TensorProto::FLOAT);
    t.set_raw_data(it->second->data(), it->second->size() * sizeof(float));
    ++replaced;
  }
  if (replaced != static_cast<int>(weights.size())) {
    return absl::InvalidArgumentError(absl::StrCat(source_model, ": found ", replaced, " of ",
                                                   weights.size(), " trained initializers"));
  }
  model.set_producer_name("numaserve train");
  const std::string tmp = out_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out || !model.SerializeToOstream(&out)) {
      return absl::InternalError(absl::StrCat(tmp, ": write failed"));
    }
  }
  if (std::rename(tmp.c_str(), out_path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp, " -> ", out_path, " failed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> NextVersionPath(const std::string& repository,
                                            const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path model_dir = fs::path(repository) / name;
  int64_t highest = 0;
  std::error_code ec;
  if (fs::is_directory(model_dir, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(model_dir, ec)) {
      int64_t v = 0;
      if (e.is_directory() && absl::SimpleAtoi(e.path().filename().string(), &v)) {
        highest = std::max(highest, v);
      }
    }
  }
  const fs::path dir = model_dir / std::to_string(highest + 1);
  fs::create_directories(dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  return (dir / "model.onnx").string();
}

}  // namespace numaserve::training
