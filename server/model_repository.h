// The model repository on disk: DIR/<model>/<version>/model.onnx. The
// highest numeric version of each model is served. A model whose file is
// missing, corrupt or unsupported is listed as unavailable with the reason;
// the others serve normally.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"

namespace numaserve::server {

// Where a model version is in its life.
enum class ModelState {
  kLoading,      // found on disk; workers are compiling it
  kReady,        // at least one worker serves it
  kUnavailable,  // cannot be served; `reason` says why
  kUnloading,    // draining in-flight requests before it goes away
};
const char* ModelStateName(ModelState state);

struct RepositoryModel {
  std::string name;
  int64_t version = 0;            // the served version (highest found), 0 if none
  std::vector<int64_t> versions;  // every numeric version directory found, ascending
  std::string path;               // .../<version>/model.onnx
  engine::ModelInfo info;         // valid when `error` is empty
  std::string error;              // why the model cannot be served, empty if it can
  std::string key() const;        // "name:version"
};

class ModelRepository {
 public:
  // Scans `dir`. An error only if `dir` itself is not a readable directory;
  // problems with individual models are recorded on them.
  static absl::StatusOr<std::unique_ptr<ModelRepository>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::vector<RepositoryModel>& models() const { return models_; }
  const RepositoryModel* Find(const std::string& name) const;

 private:
  std::string dir_;
  std::vector<RepositoryModel> models_;  // sorted by name
};

}  // namespace numaserve::server
