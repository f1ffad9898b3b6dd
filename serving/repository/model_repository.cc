#include "serving/repository/model_repository.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <sstream>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "serving/repository/model_config.h"
#include "serving/repository/signature_shapes.h"

namespace numaserve::serving {

namespace fs = std::filesystem;

namespace {

// InspectModelWithSignatures with any exception it lets through (a failed
// allocation) turned into this model's error: a bad model.onnx never takes
// the server down. A shape-polymorphic model (dynamic dims besides the
// batch) comes with the function that sizes its outputs at a request's
// signature.
absl::StatusOr<InspectedModel> InspectGuarded(const std::string& path) {
  try {
    return InspectModelWithSignatures(path);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": out of memory reading the model (std::bad_alloc)"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": reading the model failed: ", e.what()));
  }
}

// A config.pbtxt input that fixes a dim the model has dynamic (dims: [-1,
// 128] where the model has [batch, seq, 128] and max_batch_size > 0) narrows
// it, as in Triton: the metadata shows 128 and requests must send it. Dim 0
// of an input stays as the model has it (the rows a run takes).
void NarrowToConfig(const config::ModelConfig& c, engine::ModelInfo* info) {
  const size_t first_dim = c.max_batch_size() > 0 ? 1 : 0;
  for (const auto& listed : c.input()) {
    for (engine::TensorInfo& t : info->inputs) {
      if (t.name != listed.name() || listed.dims_size() + first_dim != t.shape.size()) continue;
      for (size_t d = std::max<size_t>(first_dim, 1); d < t.shape.size(); ++d) {
        const int64_t fixed = listed.dims(static_cast<int>(d - first_dim));
        if (t.shape[d] < 0 && fixed >= 0) t.shape[d] = fixed;
      }
    }
  }
}

}  // namespace

const char* ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kLoading:
      return "LOADING";
    case ModelState::kReady:
      return "READY";
    case ModelState::kUnavailable:
      return "UNAVAILABLE";
    case ModelState::kUnloading:
      return "UNLOADING";
  }
  return "UNKNOWN";
}

std::string RepositoryModel::key() const {
  if (generation == 0) return absl::StrCat(name, ":", version);
  return absl::StrCat(name, ":", version, "#", generation);
}

ModelKeyParts SplitModelKey(const std::string& key) {
  const size_t colon = key.rfind(':');
  if (colon == std::string::npos) return {key, 0};
  ModelKeyParts parts{key.substr(0, colon), 0};
  const std::string version = key.substr(colon + 1, key.find('#', colon) - colon - 1);
  if (!absl::SimpleAtoi(version, &parts.version)) parts.version = 0;
  return parts;
}

absl::Status CheckModelName(const std::string& name) {
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("model name '", absl::CHexEscape(name), "' ", why));
  };
  if (name.empty()) return absl::InvalidArgumentError("the model name is empty");
  if (name.size() > 255) return invalid("is longer than 255 bytes");
  for (char c : name) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return invalid("contains a control character");
    if (c == '/' || c == '\\') return invalid("contains a path separator");
  }
  if (name[0] == '.')
    return invalid("starts with '.' (\".\", \"..\" and hidden names are refused)");
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseVersionName(const std::string& name) {
  constexpr size_t kMaxDigits = 18;  // below 10^18: fits int64 with room
  bool canonical = !name.empty() && name.size() <= kMaxDigits && name[0] != '0';
  for (char c : name) canonical = canonical && c >= '0' && c <= '9';
  if (!canonical) {
    return absl::InvalidArgumentError(
        absl::StrCat("version '", absl::CHexEscape(name),
                     "' is not a positive decimal number of at most 18 digits without leading "
                     "zeros"));
  }
  int64_t v = 0;
  for (char c : name) v = v * 10 + (c - '0');
  return v;
}

std::vector<std::string> ModelRepository::ListModels(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_directory(ec)) continue;
    std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.') continue;  // hidden: skipped silently
    if (absl::Status s = CheckModelName(name); !s.ok()) {
      base::Log(base::LogLevel::kWarning, "repository",
                absl::StrCat(dir, ": skipped: ", s.message()),
                {{"path", (fs::path(dir) / name).string()}, {"error", s.message()}});
      continue;
    }
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string ModelRepository::Fingerprint(const std::string& dir, const std::string& name) {
  std::vector<std::string> parts;
  std::error_code ec;
  const fs::path root = fs::path(dir) / name;
  auto stamp = [&](const fs::path& p) {
    std::error_code e;
    auto size = fs::file_size(p, e);
    if (e) return;
    auto time = fs::last_write_time(p, e);
    if (e) return;
    parts.push_back(absl::StrCat(p.string(), ":", size, ":",
                                 static_cast<int64_t>(time.time_since_epoch().count())));
  };
  stamp(root / kModelConfigFile);
  {
    // An edit that keeps the size within the clock's resolution still shows.
    std::ifstream config(root / kModelConfigFile, std::ios::binary);
    if (config) {
      std::ostringstream text;
      text << config.rdbuf();
      parts.push_back(absl::StrCat("config:", std::hash<std::string>{}(text.str())));
    }
  }
  // Every file of every version folder (model.onnx, and the weights it
  // keeps beside it as external data, in subfolders too), up to
  // kMaxStampedFiles: a replaced weight file reloads the model as a
  // replaced model.onnx does.
  constexpr int kMaxStampedFiles = 4096;
  int stamped = 0;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory(ec)) continue;
    std::error_code walk;
    for (auto it = fs::recursive_directory_iterator(entry.path(), walk);
         !walk && it != fs::recursive_directory_iterator() && stamped < kMaxStampedFiles;
         it.increment(walk)) {
      std::error_code e;
      if (it->is_regular_file(e)) {
        stamp(it->path());
        ++stamped;
      }
    }
  }
  std::sort(parts.begin(), parts.end());
  std::string all;
  for (const auto& p : parts) absl::StrAppend(&all, p, "\n");
  return all;
}

std::vector<RepositoryModel> ModelRepository::ScanModel(const std::string& dir,
                                                        const std::string& name, int num_workers,
                                                        const ModelConfigFile* config_override) {
  std::error_code ec;
  const fs::path root = fs::path(dir) / name;
  RepositoryModel model;
  model.name = name;
  if (absl::Status s = CheckModelName(name); !s.ok()) {
    model.error = std::string(s.message());
    return {model};
  }
  for (const auto& version_dir : fs::directory_iterator(root, ec)) {
    // Only canonical names: "1" and "01" (or " 1") would both be version 1.
    if (!version_dir.is_directory(ec)) continue;
    if (auto v = ParseVersionName(version_dir.path().filename().string()); v.ok()) {
      model.versions.push_back(*v);
    }
  }
  std::sort(model.versions.begin(), model.versions.end());
  if (!model.versions.empty()) model.version = model.versions.back();
  const fs::path config_path = root / kModelConfigFile;
  if (config_override != nullptr || fs::exists(config_path, ec)) {
    auto config = config_override != nullptr ? absl::StatusOr<ModelConfigFile>(*config_override)
                                             : ReadModelConfig(config_path.string(), num_workers);
    if (config.ok()) {
      for (const std::string& field : config->ignored_fields) {
        base::Log(
            base::LogLevel::kInfo, "repository",
            absl::StrFormat("model '%s' %s: ignoring Triton field '%s' (no effect on "
                            "numaserve)",
                            name, config_override != nullptr ? "config override" : kModelConfigFile,
                            field),
            {{"model", name}, {"path", config_path.string()}, {"field", field}});
      }
      model.config = std::move(config->config);
    } else {
      model.error = std::string(config.status().message());
    }
  }
  if (model.error.empty()) {
    absl::Status s = ValidateModelConfigFields(model.config, name, num_workers);
    if (!s.ok()) model.error = std::string(s.message());
  }
  if (model.error.empty() && model.versions.empty()) {
    model.error =
        absl::StrCat(root.string(), ": no version directory (expected <model>/<N>/model.onnx)");
  }
  std::vector<int64_t> served;
  if (model.error.empty()) {
    auto chosen = SelectVersions(model.config, model.versions);
    if (chosen.ok()) {
      served = *std::move(chosen);
    } else {
      model.error = absl::StrCat("model '", name, "' ", chosen.status().message());
    }
  }
  if (!model.error.empty()) return {model};
  model.workers = PlacementWorkers(model.config, num_workers);
  std::vector<RepositoryModel> out;
  for (int64_t v : served) {
    RepositoryModel version = model;
    version.version = v;
    version.path = (root / std::to_string(v) / "model.onnx").string();
    auto inspected = InspectGuarded(version.path);
    if (inspected.ok()) {
      version.info = std::move(inspected->info);
      version.signature_shapes = std::move(inspected->signature_shapes);
      absl::Status s = ValidateModelConfig(version.config, name, version.info, num_workers);
      if (s.ok()) {
        NarrowToConfig(version.config, &version.info);
      } else {
        version.error = std::string(s.message());
      }
    } else {
      version.error = std::string(inspected.status().message());
    }
    out.push_back(std::move(version));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Open(const std::string& dir,
                                                                       int num_workers) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("model repository '", dir, "' is not a directory"));
  }
  auto repo = std::unique_ptr<ModelRepository>(new ModelRepository());
  repo->dir_ = dir;
  for (const auto& name : ListModels(dir)) {
    for (auto& m : ScanModel(dir, name, num_workers)) repo->models_.push_back(std::move(m));
  }
  std::sort(repo->models_.begin(), repo->models_.end(), [](const auto& a, const auto& b) {
    return a.name != b.name ? a.name < b.name : a.version < b.version;
  });
  return repo;
}

const RepositoryModel* ModelRepository::Find(const std::string& name, int64_t version) const {
  const RepositoryModel* found = nullptr;
  for (const auto& m : models_) {
    if (m.name != name) continue;
    if (version == 0 || m.version == version) found = &m;  // the last is the highest
  }
  return found;
}

}  // namespace numaserve::serving
