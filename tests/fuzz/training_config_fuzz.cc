// Training job configs, as a client sends them to StartTraining: the config
// parser (ParseTrainingConfig) on arbitrary text, then the training
// service's path checks (serving/frontend/training_paths.h) on the paths
// protobuf's text format reads from it, whether or not the config is
// complete. The input's first line is also checked alone as an input, an
// output and an export repository (its second line the model name).
//
// The checks run in a training root made once under the scratch directory:
// files, a directory, symbolic links that leave the root, a model
// repository with an operator's model, one of this caller's and one of
// another caller's, and two callers' directories (this caller,
// "token:fuzz", and "token:other"), each with a checkpoint. Whatever a
// check accepts must lie where the service promises: an input a regular
// file in the root and not in another caller's directory, an output in
// this caller's own directory and not a symbolic link, the export's model
// directory absent or made by this caller's exports. A refusal is
// INVALID_ARGUMENT or PERMISSION_DENIED, nothing else.
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "serving/frontend/training_paths.h"
#include "tests/fuzz/fuzz_target.h"
#include "training/onnx_export.h"
#include "training/trainer.h"

namespace numaserve::fuzz {
namespace {

namespace paths = serving::training_paths;
namespace fs = std::filesystem;

// Protobuf's text-format errors, dropped: the parser would print them.
class NoErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int, int, const std::string&) override {}
};

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  FUZZ_CHECK(out.good());
}

void Link(const std::string& target, const std::string& link) {
  FUZZ_CHECK(symlink(target.c_str(), link.c_str()) == 0);
}

// The root, made once; this caller's scope in it.
paths::CallerScope MakeRoot() {
  const std::string& base = ScratchDirectory();
  fs::create_directories(base + "/outside");
  WriteFile(base + "/outside/secret", "secret");
  const std::string dir = base + "/root";
  fs::create_directories(dir + "/data/sub");
  fs::create_directories(dir + "/repo/served/1");
  fs::create_directories(dir + "/repo/mine");
  fs::create_directories(dir + "/repo/theirs");
  WriteFile(dir + "/model.onnx", "not a model");
  WriteFile(dir + "/data/train.idx", "not idx");
  WriteFile(dir + "/repo/served/1/model.onnx", "served");
  Link("../outside", dir + "/link_out");
  Link("../outside/secret", dir + "/link_secret");
  Link("../../outside", dir + "/repo/link_model");
  char real[PATH_MAX];
  FUZZ_CHECK(realpath(dir.c_str(), real) != nullptr);
  FUZZ_CHECK(paths::MakeCallersDir(real).ok());
  absl::StatusOr<paths::CallerScope> mine = paths::OpenCallerScope(real, "token:fuzz");
  absl::StatusOr<paths::CallerScope> other = paths::OpenCallerScope(real, "token:other");
  FUZZ_CHECK(mine.ok() && other.ok());
  WriteFile(dir + "/repo/mine/" + training::kExportOwnerFile, mine->owner + "\n");
  WriteFile(dir + "/repo/theirs/" + training::kExportOwnerFile, other->owner + "\n");
  fs::create_directories(mine->area + "/runs");
  WriteFile(mine->area + "/ckpt", "mine");
  Link(base + "/outside/secret", mine->area + "/link");
  fs::create_directories(other->area + "/repo");
  WriteFile(other->area + "/ckpt", "theirs");
  return *mine;
}

const paths::CallerScope& TheScope() {
  static const paths::CallerScope scope = MakeRoot();
  return scope;
}

bool Inside(const std::string& dir, const std::string& path) {
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

bool IsRealPath(const std::string& path) {
  char real[PATH_MAX];
  return realpath(path.c_str(), real) != nullptr && path == real;
}

// A path the scope's caller may read: in the root, not in another
// caller's directory.
bool Readable(const paths::CallerScope& s, const std::string& path) {
  return Inside(s.root, path) && (!Inside(s.callers, path) || Inside(s.area, path));
}

void CheckRefusal(const absl::Status& status) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument ||
             status.code() == absl::StatusCode::kPermissionDenied);
}

void CheckInput(const paths::CallerScope& s, const std::string& path) {
  if (path.empty()) return;
  FUZZ_CHECK(IsRealPath(path) && Readable(s, path));
  struct stat st{};
  FUZZ_CHECK(stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode));
}

void CheckOutput(const paths::CallerScope& s, const std::string& path) {
  if (path.empty()) return;
  FUZZ_CHECK(Inside(s.area, path) && path != s.area);
  const fs::path p(path);
  FUZZ_CHECK(IsRealPath(p.parent_path().string()));
  struct stat st{};
  if (lstat(path.c_str(), &st) == 0) FUZZ_CHECK(S_ISREG(st.st_mode));
}

void CheckExport(const paths::CallerScope& s, const training::TrainingConfig& config) {
  if (config.export_repository().empty()) return;
  const std::string& repo = config.export_repository();
  FUZZ_CHECK(IsRealPath(repo) && Readable(s, repo));
  const std::string model_dir = repo + "/" + config.export_model_name();
  struct stat st{};
  if (lstat(model_dir.c_str(), &st) != 0) return;  // made by the export, owned by the caller
  FUZZ_CHECK(S_ISDIR(st.st_mode));
  std::ifstream in(model_dir + "/" + training::kExportOwnerFile);
  std::string owner;
  FUZZ_CHECK(std::getline(in, owner) && owner == s.owner);
}

// Every path of a config ConfineConfig accepted.
void CheckConfined(const paths::CallerScope& s, const training::TrainingConfig& c) {
  const training::DatasetConfig& d = c.dataset();
  for (const std::string* input :
       {&c.model(), &d.train_images(), &d.train_labels(), &d.test_images(), &d.test_labels(),
        &d.train_records(), &d.test_records()}) {
    CheckInput(s, *input);
  }
  for (const std::string* output : {&c.checkpoint(), &c.final_weights(), &c.timeline()}) {
    CheckOutput(s, *output);
  }
  CheckExport(s, c);
}

// The config as the job's file holds it (printed) reads back with the same
// paths, and a complete one passes ParseTrainingConfig again.
void CheckPrintedBack(const training::TrainingConfig& c, bool complete) {
  std::string text;
  FUZZ_CHECK(google::protobuf::TextFormat::PrintToString(c, &text));
  absl::StatusOr<training::TrainingConfig> again = training::ParseTrainingConfig(text, "job.cfg");
  if (complete) FUZZ_CHECK(again.ok());
  if (!again.ok()) return;
  FUZZ_CHECK(again->model() == c.model() && again->checkpoint() == c.checkpoint() &&
             again->final_weights() == c.final_weights() && again->timeline() == c.timeline() &&
             again->export_repository() == c.export_repository() &&
             again->export_model_name() == c.export_model_name() &&
             again->dataset().train_images() == c.dataset().train_images() &&
             again->dataset().train_records() == c.dataset().train_records());
}

// The first line alone, as each kind of path; the second as a model name.
void CheckRawPath(const paths::CallerScope& s, const std::string& text) {
  const size_t end = text.find('\n');
  std::string path = text.substr(0, end);
  if (path.empty()) return;
  const std::string name = end == std::string::npos ? "" : text.substr(end + 1);
  std::string input = path;
  if (absl::Status st = paths::ConfineInput(s, "model", &input); st.ok()) {
    CheckInput(s, input);
  } else {
    CheckRefusal(st);
  }
  std::string output = path;
  if (absl::Status st = paths::ConfineOutput(s, "checkpoint", &output); st.ok()) {
    CheckOutput(s, output);
  } else {
    CheckRefusal(st);
  }
  training::TrainingConfig config;
  config.set_export_repository(path);
  config.set_export_model_name(name.substr(0, name.find('\n')));
  if (absl::Status st = paths::ConfineExport(s, &config); st.ok()) {
    CheckExport(s, config);
  } else {
    CheckRefusal(st);
  }
}

}  // namespace

int FuzzOne(const uint8_t* data, size_t size) {
  const paths::CallerScope& scope = TheScope();
  const std::string text(AsText(data, size));
  absl::StatusOr<training::TrainingConfig> parsed =
      training::ParseTrainingConfig(text, "config_text");
  if (!parsed.ok()) FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);

  training::TrainingConfig config;
  if (parsed.ok()) {
    config = *parsed;
  } else {
    google::protobuf::TextFormat::Parser parser;
    NoErrors errors;
    parser.RecordErrorsTo(&errors);
    if (!parser.ParseFromString(text, &config)) config.Clear();
  }
  if (absl::Status s = paths::ConfineConfig(scope, &config); s.ok()) {
    CheckConfined(scope, config);
    CheckPrintedBack(config, parsed.ok());
  } else {
    CheckRefusal(s);
  }
  CheckRawPath(scope, text);
  return 0;
}

}  // namespace numaserve::fuzz
