#include "server/model_repository.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace numaserve::server {

namespace fs = std::filesystem;

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

std::string RepositoryModel::key() const { return absl::StrCat(name, ":", version); }

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("model repository '", dir, "' is not a directory"));
  }
  auto repo = std::unique_ptr<ModelRepository>(new ModelRepository());
  repo->dir_ = dir;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_directory(ec)) continue;
    std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    RepositoryModel model;
    model.name = name;
    for (const auto& version_dir : fs::directory_iterator(entry.path(), ec)) {
      int64_t v = 0;
      if (version_dir.is_directory(ec) &&
          absl::SimpleAtoi(version_dir.path().filename().string(), &v) && v > 0) {
        model.versions.push_back(v);
      }
    }
    std::sort(model.versions.begin(), model.versions.end());
    if (model.versions.empty()) {
      model.error = absl::StrCat(entry.path().string(),
                                 ": no version directory (expected <model>/<N>/model.onnx)");
    } else {
      model.version = model.versions.back();
      model.path = (entry.path() / std::to_string(model.version) / "model.onnx").string();
      auto info = engine::InspectModel(model.path);
      if (info.ok()) {
        model.info = *std::move(info);
      } else {
        model.error = std::string(info.status().message());
      }
    }
    repo->models_.push_back(std::move(model));
  }
  if (ec) return absl::UnavailableError(absl::StrCat("cannot read '", dir, "': ", ec.message()));
  std::sort(repo->models_.begin(), repo->models_.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return repo;
}

const RepositoryModel* ModelRepository::Find(const std::string& name) const {
  for (const auto& m : models_) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

}  // namespace numaserve::server
