// The model repository on disk: DIR/<model>/<version>/model.onnx plus an
// optional DIR/<model>/config.pbtxt (see proto/model_config.proto). The
// config's version policy picks the served versions (by default the highest).
// A model whose config or file is missing, corrupt, unsupported or
// contradictory is listed as unavailable with the reason; the others serve
// normally.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "model_config.pb.h"
#include "serving/repository/model_config.h"
#include "serving/request/infer_request.h"

namespace numaserve::serving {

// Where a model version is in its life.
enum class ModelState {
  kLoading,      // found on disk; workers are compiling it
  kReady,        // at least one worker serves it
  kUnavailable,  // cannot be served; `reason` says why
  kUnloading,    // draining in-flight requests before it goes away
};
const char* ModelStateName(ModelState state);

// One served version of a model (or, with `error` set, a model that cannot
// be served at all).
struct RepositoryModel {
  std::string name;
  int64_t version = 0;            // this served version, 0 if none could be chosen
  std::vector<int64_t> versions;  // every numeric version directory found, ascending
  std::string path;               // .../<version>/model.onnx
  // Valid when `error` is empty; an input's dims as the config narrows them
  // (a dim the model has dynamic that config.pbtxt fixes).
  engine::ModelInfo info;
  // For a shape-polymorphic model (a dynamic dim besides the batch): its
  // output shapes at a request's signature, the signature checked as the
  // worker will (MakeSignatureShapes); null for every other model, which
  // runs at a batch size alone.
  SignatureShapesFn signature_shapes;
  config::ModelConfig config;  // config.pbtxt, or the defaults without one
  std::vector<int> workers;    // the workers that load it (instance_placement)
  std::string error;           // why the model cannot be served, empty if it can
  // How many times this version was reloaded with an edited config.pbtxt;
  // each load of a version has its own key, so the new one loads on the
  // workers while the old one still serves.
  int64_t generation = 0;
  std::string key() const;  // "name:version", "name:version#generation" after a reload
};

// A key's model name and version (0 where the key has none): the model and
// version fields of log records that name a key.
struct ModelKeyParts {
  std::string name;
  int64_t version = 0;
};
ModelKeyParts SplitModelKey(const std::string& key);

// OK when `name` may name a model directory: 1 to 255 bytes, no control
// character (NUL included) or DEL, no '/' or '\\', and neither "." nor ".."
// nor anything else starting with '.'. INVALID_ARGUMENT saying why
// otherwise. Every name from the disk or from a request passes here before
// it becomes a path or a served model.
absl::Status CheckModelName(const std::string& name);

// The version a version directory's name stands for: a canonical positive
// decimal ("1", "12"; not "01", "+1", " 1", "1\n" or a name with a NUL)
// below 10^18. INVALID_ARGUMENT otherwise.
absl::StatusOr<int64_t> ParseVersionName(const std::string& name);

class ModelRepository {
 public:
  // Scans `dir` for a server of `num_workers` workers. An error only if
  // `dir` itself is not a readable directory; problems with individual
  // models are recorded on them.
  static absl::StatusOr<std::unique_ptr<ModelRepository>> Open(const std::string& dir,
                                                               int num_workers = 1);

  // Reads one model directory DIR/NAME: its config and the versions its
  // policy selects, one entry per version (or one entry with `error`).
  // `config_override`, when given, takes the place of config.pbtxt (a load
  // request's config; checked the same way).
  static std::vector<RepositoryModel> ScanModel(const std::string& dir, const std::string& name,
                                                int num_workers,
                                                const ModelConfigFile* config_override = nullptr);
  // Names of the model directories in DIR that pass CheckModelName, sorted
  // (others are skipped with a warning in the log).
  static std::vector<std::string> ListModels(const std::string& dir);
  // Changes whenever the model's config (its content, size or modification
  // time) or any version's model.onnx (name, size, modification time)
  // changes: what repository polling compares.
  static std::string Fingerprint(const std::string& dir, const std::string& name);

  const std::string& dir() const { return dir_; }
  // Every served version, by name then version.
  const std::vector<RepositoryModel>& models() const { return models_; }
  // The served `version` of `name`; version 0: the highest served one (or
  // the model's error entry). nullptr if there is no such entry.
  const RepositoryModel* Find(const std::string& name, int64_t version = 0) const;

 private:
  std::string dir_;
  std::vector<RepositoryModel> models_;  // sorted by name, then version
};

}  // namespace numaserve::serving
