#include "serving/frontend/training_paths.h"

#include <limits.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cerrno>
#include <filesystem>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/errno_text.h"
#include "base/log.h"
#include "serving/repository/model_repository.h"
#include "training/onnx_export.h"

namespace numaserve::serving::training_paths {
namespace {

// The longest model name the repository loads (CheckModelName).
constexpr size_t kMaxModelName = 255;

// `path` is `root` or inside it (both absolute and normalised).
bool Inside(const std::string& root, const std::string& path) {
  if (root == "/") return !path.empty() && path[0] == '/';
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

// INVALID_ARGUMENT naming the config field and (at most 40 characters of)
// its value, followed by `why`.
absl::Status Refuse(const std::string& field, const std::string& value, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("config field '", field, "': '", Shown(value), "' ", why));
}

// PERMISSION_DENIED naming the config field and (at most 40 characters of)
// its value, followed by `why`: a path inside the root that is not the
// caller's to use.
absl::Status Deny(const std::string& field, const std::string& value, const std::string& why) {
  return absl::PermissionDeniedError(
      absl::StrCat("config field '", field, "': '", Shown(value), "' ", why));
}

// Where a path (absolute, normalised) lies for a caller.
enum class Place {
  kOutside,  // outside the root
  kShared,   // in the root, outside <root>/callers
  kOwn,      // in the caller's own directory
  kOthers,   // in <root>/callers, outside the caller's own directory
};

Place Where(const CallerScope& scope, const std::string& path) {
  if (!Inside(scope.root, path)) return Place::kOutside;
  if (Inside(scope.area, path)) return Place::kOwn;
  if (Inside(scope.callers, path)) return Place::kOthers;
  return Place::kShared;
}

// The refusal of `value`, which resolves to `real`, in `place` (kOutside or
// kOthers; an output anywhere but kOwn).
absl::Status Misplaced(const CallerScope& scope, const std::string& field, const std::string& value,
                       const std::string& real, Place place) {
  if (place == Place::kOutside) {
    return Refuse(field, value,
                  absl::StrCat("resolves to ", real, ", outside the training root ", scope.root));
  }
  if (place == Place::kOthers) {
    return Deny(field, value,
                absl::StrCat("resolves to ", real, ", in ", scope.callers,
                             " but outside this caller's directory ", scope.area));
  }
  return Deny(field, value,
              absl::StrCat("resolves to ", real, ", outside this caller's directory ", scope.area,
                           ": a job writes only there (relative paths are taken from it)"));
}

// `value` taken from `base` (the root or a directory in it) and checked as
// text: no NUL, no '..' component, inside `root`. The result is normalised
// (no '.', no '//').
absl::StatusOr<std::string> Lexical(const std::string& root, const std::string& base,
                                    const std::string& field, const std::string& value) {
  if (value.find('\0') != std::string::npos) return Refuse(field, "", "contains a NUL byte");
  for (absl::string_view part : absl::StrSplit(value, '/')) {
    if (part == "..") {
      return Refuse(
          field, value,
          absl::StrCat("has a '..' component: job paths stay inside the training root ", root));
    }
  }
  std::string normal =
      std::filesystem::path(value[0] == '/' ? value : absl::StrCat(base, "/", value))
          .lexically_normal()
          .string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  if (!Inside(root, normal)) {
    return Refuse(field, value, absl::StrCat("is outside the training root ", root));
  }
  return normal;
}

// Makes `dir` (0700) where missing; it must then be a real directory.
absl::Status MakePrivateDir(const std::string& dir, bool* made) {
  *made = mkdir(dir.c_str(), 0700) == 0;
  if (!*made && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot make ", dir, ": ", base::ErrnoText(errno)));
  }
  struct stat st{};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InternalError(absl::StrCat(dir, " is not a directory"));
  }
  return absl::OkStatus();
}

std::string CallersPath(const std::string& root) {
  return absl::StrCat(root == "/" ? "" : root, "/", kCallersDir);
}

}  // namespace

absl::StatusOr<std::string> CallerId(const std::string& caller) {
  if (caller.empty()) return std::string("anonymous");
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(caller.data(), caller.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("cannot compute the SHA-256 of the caller's identity");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

absl::Status MakeCallersDir(const std::string& root) {
  bool made = false;
  return MakePrivateDir(CallersPath(root), &made);
}

absl::StatusOr<CallerScope> OpenCallerScope(const std::string& root, const std::string& caller,
                                            bool* made) {
  CallerScope scope;
  scope.root = root;
  scope.callers = CallersPath(root);
  absl::StatusOr<std::string> owner = CallerId(caller);
  if (!owner.ok()) return owner.status();
  scope.owner = *std::move(owner);
  scope.area = absl::StrCat(scope.callers, "/", scope.owner);
  bool made_now = false;
  if (absl::Status s = MakePrivateDir(scope.callers, &made_now); !s.ok()) return s;
  if (absl::Status s = MakePrivateDir(scope.area, &made_now); !s.ok()) return s;
  if (made != nullptr) *made = made_now;
  return scope;
}

absl::StatusOr<std::string> RandomHex(size_t bytes) {
  std::vector<unsigned char> random(bytes);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = getrandom(random.data() + done, bytes - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError(absl::StrCat("getrandom: ", base::ErrnoText(errno)));
    done += n;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : random) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string Shown(const std::string& value) {
  return value.size() <= 40 ? value : value.substr(0, 40) + "...";
}

absl::Status ConfineInput(const CallerScope& scope, const std::string& field, std::string* value) {
  if (value->empty()) return absl::OkStatus();
  absl::StatusOr<std::string> path = Lexical(scope.root, scope.root, field, *value);
  if (!path.ok()) return path.status();
  char real[PATH_MAX];
  if (realpath(path->c_str(), real) == nullptr) {
    return Refuse(field, *value, absl::StrCat("cannot be read: ", base::ErrnoText(errno)));
  }
  if (const Place place = Where(scope, real); place == Place::kOutside || place == Place::kOthers) {
    return Misplaced(scope, field, *value, real, place);
  }
  struct stat st{};
  if (stat(real, &st) != 0 || !S_ISREG(st.st_mode)) {
    return Refuse(field, *value, "is not a regular file");
  }
  *value = real;
  return absl::OkStatus();
}

absl::Status ConfineOutput(const CallerScope& scope, const std::string& field, std::string* value) {
  if (value->empty()) return absl::OkStatus();
  absl::StatusOr<std::string> path = Lexical(scope.root, scope.area, field, *value);
  if (!path.ok()) return path.status();
  if (const Place place = Where(scope, *path); place != Place::kOwn) {
    return Misplaced(scope, field, *value, *path, place);
  }
  if (*path == scope.area) return Refuse(field, *value, "names the caller's directory, not a file");
  const std::filesystem::path p(*path);
  const std::string name = p.filename().string();
  char real[PATH_MAX];
  if (realpath(p.parent_path().c_str(), real) == nullptr) {
    return Refuse(
        field, *value,
        absl::StrCat("has no directory ", p.parent_path().string(), ": ", base::ErrnoText(errno)));
  }
  if (const Place place = Where(scope, real); place != Place::kOwn) {
    return Misplaced(scope, field, *value, real, place);
  }
  const std::string full = absl::StrCat(real, "/", name);
  struct stat st{};
  if (lstat(full.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) return Refuse(field, *value, "is a symbolic link: not written to");
    if (!S_ISREG(st.st_mode)) return Refuse(field, *value, "exists and is not a regular file");
  } else if (errno != ENOENT) {
    return Refuse(field, *value, absl::StrCat("cannot be used: ", base::ErrnoText(errno)));
  }
  *value = full;
  return absl::OkStatus();
}

namespace {

// export_model_name, when set: the name the repository serves the export
// under, and a metrics label. It must be a model name the repository would
// load (CheckModelName), in UTF-8; shown escaped.
absl::Status CheckExportName(const std::string& name) {
  if (name.empty()) return absl::OkStatus();
  if (name.size() > kMaxModelName) {
    return absl::InvalidArgumentError(absl::StrCat("config field 'export_model_name': '",
                                                   absl::CHexEscape(Shown(name)),
                                                   "' is longer than ", kMaxModelName, " bytes"));
  }
  if (absl::Status s = CheckModelName(name); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'export_model_name': ", s.message()));
  }
  if (!base::IsUtf8(name)) {
    return absl::InvalidArgumentError(absl::StrCat("config field 'export_model_name': '",
                                                   absl::CHexEscape(name), "' is not UTF-8"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ConfineExport(const CallerScope& scope, training::TrainingConfig* config) {
  if (absl::Status s = CheckExportName(config->export_model_name()); !s.ok()) return s;
  if (config->export_repository().empty()) return absl::OkStatus();
  const std::string field = "export_repository";
  const std::string& value = config->export_repository();
  absl::StatusOr<std::string> path = Lexical(scope.root, scope.root, field, value);
  if (!path.ok()) return path.status();
  char real[PATH_MAX];
  if (realpath(path->c_str(), real) == nullptr) {
    return Refuse(field, value, absl::StrCat("cannot be used: ", base::ErrnoText(errno)));
  }
  if (const Place place = Where(scope, real); place == Place::kOutside || place == Place::kOthers) {
    return Misplaced(scope, field, value, real, place);
  }
  struct stat st{};
  if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Refuse(field, value, "is not a directory");
  }
  const std::string& name = config->export_model_name();
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return Refuse("export_model_name", name, "must be one path component (no '/', not '..')");
  }
  // A model directory the caller's exports did not make takes none of its
  // versions: neither another caller's nor one the operator put there.
  const std::string model_dir = absl::StrCat(std::string(real) == "/" ? "" : real, "/", name);
  if (absl::Status s = training::CheckExportOwner(model_dir, scope.owner); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("config field 'export_model_name': ", s.message()));
  }
  config->set_export_repository(real);
  return absl::OkStatus();
}

absl::Status ConfineConfig(const CallerScope& scope, training::TrainingConfig* config) {
  training::DatasetConfig* data = config->mutable_dataset();
  const std::pair<const char*, std::string*> inputs[] = {
      {"model", config->mutable_model()},
      {"dataset.train_images", data->mutable_train_images()},
      {"dataset.train_labels", data->mutable_train_labels()},
      {"dataset.test_images", data->mutable_test_images()},
      {"dataset.test_labels", data->mutable_test_labels()},
      {"dataset.train_records", data->mutable_train_records()},
      {"dataset.test_records", data->mutable_test_records()},
  };
  for (const auto& [field, value] : inputs) {
    if (absl::Status s = ConfineInput(scope, field, value); !s.ok()) return s;
  }
  const std::pair<const char*, std::string*> outputs[] = {
      {"checkpoint", config->mutable_checkpoint()},
      {"final_weights", config->mutable_final_weights()},
      {"timeline", config->mutable_timeline()},
  };
  for (const auto& [field, value] : outputs) {
    if (absl::Status s = ConfineOutput(scope, field, value); !s.ok()) return s;
  }
  return ConfineExport(scope, config);
}

}  // namespace numaserve::serving::training_paths
