#include "training/onnx_export.h"

#include <fcntl.h>
#include <onnx/onnx_pb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/atomic_file.h"
#include "base/errno_text.h"

namespace numaserve::training {

namespace {

std::vector<float> Floats(const onnx::TensorProto& t) {
  if (!t.raw_data().empty()) {
    std::vector<float> v(t.raw_data().size() / sizeof(float));
    memcpy(v.data(), t.raw_data().data(), v.size() * sizeof(float));
    return v;
  }
  return std::vector<float>(t.float_data().begin(), t.float_data().end());
}

void SetFloats(onnx::TensorProto* t, const std::vector<float>& v) {
  t->clear_float_data();
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->set_raw_data(v.data(), v.size() * sizeof(float));
}

float FloatAttribute(const onnx::NodeProto& node, const std::string& name, float fallback) {
  for (const onnx::AttributeProto& a : node.attribute()) {
    if (a.name() == name) return a.f();
  }
  return fallback;
}

}  // namespace

int FoldBatchNorms(onnx::ModelProto* model) {
  onnx::GraphProto* graph = model->mutable_graph();
  auto initializer = [&](const std::string& name) -> onnx::TensorProto* {
    for (onnx::TensorProto& t : *graph->mutable_initializer()) {
      if (t.name() == name) return &t;
    }
    return nullptr;
  };
  auto uses = [&](const std::string& name) {
    int n = 0;
    for (const onnx::NodeProto& node : graph->node()) {
      for (const std::string& in : node.input()) n += in == name ? 1 : 0;
    }
    for (const onnx::ValueInfoProto& out : graph->output()) n += out.name() == name ? 1 : 0;
    return n;
  };
  int folded = 0;
  for (int i = 0; i < graph->node_size(); ++i) {
    const onnx::NodeProto& bn = graph->node(i);
    if (bn.op_type() != "BatchNormalization" || bn.input_size() < 5 || bn.output_size() != 1)
      continue;
    int conv_index = -1;
    for (int j = 0; j < i; ++j) {
      const onnx::NodeProto& n = graph->node(j);
      if (n.op_type() == "Conv" && n.output_size() == 1 && n.output(0) == bn.input(0))
        conv_index = j;
    }
    if (conv_index < 0 || uses(bn.input(0)) != 1) continue;
    onnx::NodeProto* conv = graph->mutable_node(conv_index);
    onnx::TensorProto* w = initializer(conv->input(1));
    onnx::TensorProto* stats[4];
    bool ok = w != nullptr && w->dims_size() >= 1;
    for (int k = 0; k < 4 && ok; ++k) ok = (stats[k] = initializer(bn.input(k + 1))) != nullptr;
    if (!ok) continue;
    const std::vector<float> scale = Floats(*stats[0]), beta = Floats(*stats[1]),
                             mean = Floats(*stats[2]), var = Floats(*stats[3]);
    const int64_t channels = w->dims(0);
    if (static_cast<int64_t>(scale.size()) != channels) continue;
    const float eps = FloatAttribute(bn, "epsilon", 1e-5f);
    std::vector<float> weights = Floats(*w);
    const int64_t per_channel = static_cast<int64_t>(weights.size()) / channels;
    std::vector<float> bias(channels, 0.0f);
    onnx::TensorProto* b =
        conv->input_size() > 2 && !conv->input(2).empty() ? initializer(conv->input(2)) : nullptr;
    if (b != nullptr) bias = Floats(*b);
    for (int64_t c = 0; c < channels; ++c) {
      const float a = scale[c] / std::sqrt(var[c] + eps);
      for (int64_t k = 0; k < per_channel; ++k) weights[c * per_channel + k] *= a;
      bias[c] = (bias[c] - mean[c]) * a + beta[c];
    }
    SetFloats(w, weights);
    if (b == nullptr) {
      b = graph->add_initializer();
      b->set_name(conv->name() + "_folded_bias");
      b->add_dims(channels);
      while (conv->input_size() < 3) conv->add_input("");
      conv->set_input(2, b->name());
    }
    SetFloats(b, bias);
    const std::string bn_output = bn.output(0);
    std::vector<std::string> bn_params(bn.input().begin() + 1, bn.input().end());
    conv->set_output(0, bn_output);
    graph->mutable_node()->DeleteSubrange(i, 1);
    --i;
    ++folded;
    for (const std::string& name : bn_params) {
      if (uses(name) > 0) continue;
      for (int k = 0; k < graph->initializer_size(); ++k) {
        if (graph->initializer(k).name() == name) {
          graph->mutable_initializer()->DeleteSubrange(k, 1);
          break;
        }
      }
    }
  }
  return folded;
}

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
  FoldBatchNorms(&model);
  model.set_producer_name("numaserve train");
  std::string serialized;
  if (!model.SerializeToString(&serialized)) {
    return absl::InternalError(absl::StrCat(out_path, ": cannot serialize the model"));
  }
  return base::WriteFileAtomically(out_path, serialized);
}

namespace {

constexpr size_t kMaxOwnerChars = 128;

std::string OwnerFilePath(const std::string& model_dir) {
  return absl::StrCat(model_dir, "/", kExportOwnerFile);
}

// Writes the owner file of a model directory this export has just made: a
// new file (O_EXCL | O_NOFOLLOW), never one found or planted there.
absl::Status WriteOwnerFile(const std::string& model_dir, const std::string& owner) {
  const std::string path = OwnerFilePath(model_dir);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create ", path, ": ", base::ErrnoText(errno)));
  }
  const std::string line = owner + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  int error = done < line.size() ? errno : 0;
  if (close(fd) != 0 && error == 0) error = errno;
  if (error != 0 || done < line.size()) {
    unlink(path.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", base::ErrnoText(error)));
  }
  return absl::OkStatus();
}

// The owner the owner file of `model_dir` names, or why none can be read.
// The file is opened without following a link and without blocking (a
// FIFO there), and must be a regular file of one short line.
absl::StatusOr<std::string> ReadOwnerFile(const std::string& model_dir) {
  const std::string path = OwnerFilePath(model_dir);
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(errno == ENOENT ? absl::StrCat("it has no ", kExportOwnerFile)
                                               : absl::StrCat(path, ": ", base::ErrnoText(errno)));
  }
  struct stat st{};
  std::string text(kMaxOwnerChars + 2, '\0');
  ssize_t n = -1;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    do {
      n = read(fd, text.data(), text.size());
    } while (n < 0 && errno == EINTR);
  }
  close(fd);
  if (n < 0) return absl::NotFoundError(absl::StrCat(path, " is not a readable regular file"));
  text.resize(static_cast<size_t>(n));
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

}  // namespace

absl::Status CheckExportOwnerName(const std::string& owner) {
  const bool valid =
      !owner.empty() && owner.size() <= kMaxOwnerChars &&
      std::all_of(owner.begin(), owner.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
      });
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("export owner '", absl::CHexEscape(owner.substr(0, 40)), "': expected 1 to ",
                   kMaxOwnerChars, " characters of letters, digits, '_' and '-'"));
}

absl::Status CheckExportOwner(const std::string& model_dir, const std::string& owner) {
  struct stat st{};
  if (lstat(model_dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("cannot use ", model_dir, ": ", base::ErrnoText(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir, S_ISLNK(st.st_mode) ? " is a symbolic link" : " is not a directory",
                     ": not exporting there"));
  }
  absl::StatusOr<std::string> found = ReadOwnerFile(model_dir);
  if (found.ok() && *found == owner) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(model_dir, " was not made by this caller's exports (",
                   found.ok() ? absl::StrCat("its ", kExportOwnerFile, " names another owner")
                              : found.status().message(),
                   "): not exporting there"));
}

absl::StatusOr<std::string> NextVersionPath(const std::string& repository, const std::string& name,
                                            const std::string& owner) {
  namespace fs = std::filesystem;
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("export_model_name '", name, "' must be one path component (no '/')"));
  }
  if (!owner.empty()) {
    if (absl::Status s = CheckExportOwnerName(owner); !s.ok()) return s;
  }
  std::error_code ec;
  fs::create_directories(repository, ec);
  const fs::path model_dir = fs::path(repository) / name;
  // The model directory is created here or must be a real directory: a
  // symbolic link there would put the export somewhere else.
  const bool made = mkdir(model_dir.c_str(), 0755) == 0;
  if (!made && errno != EEXIST) {
    return absl::InternalError(
        absl::StrCat("cannot create ", model_dir.string(), ": ", base::ErrnoText(errno)));
  }
  if (!owner.empty()) {
    absl::Status s = made ? WriteOwnerFile(model_dir.string(), owner)
                          : CheckExportOwner(model_dir.string(), owner);
    if (!s.ok()) {
      if (made) rmdir(model_dir.c_str());
      return s;
    }
  }
  struct stat st{};
  if (lstat(model_dir.c_str(), &st) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot stat ", model_dir.string(), ": ", base::ErrnoText(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_dir.string(), S_ISLNK(st.st_mode) ? " is a symbolic link" : " is not a directory",
        ": not exporting there"));
  }
  int64_t highest = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(model_dir, ec)) {
    int64_t v = 0;
    if (e.is_directory() && absl::SimpleAtoi(e.path().filename().string(), &v)) {
      highest = std::max(highest, v);
    }
  }
  // mkdir, not create_directories: the version directory is new, never an
  // existing directory or link of the same name.
  for (int64_t version = highest + 1;; ++version) {
    const fs::path dir = model_dir / std::to_string(version);
    if (mkdir(dir.c_str(), 0755) == 0) return (dir / "model.onnx").string();
    if (errno != EEXIST || version > highest + 100) {
      return absl::InternalError(
          absl::StrCat("cannot create ", dir.string(), ": ", base::ErrnoText(errno)));
    }
  }
}

}  // namespace numaserve::training
