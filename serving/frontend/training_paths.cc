#include "serving/frontend/training_paths.h"

#include <limits.h>
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

// `value` taken from `root` and checked as text: no NUL, no '..' component,
// inside the root. The result is normalised (no '.', no '//').
absl::StatusOr<std::string> Lexical(const std::string& root, const std::string& field,
                                    const std::string& value) {
  if (value.find('\0') != std::string::npos) return Refuse(field, "", "contains a NUL byte");
  for (absl::string_view part : absl::StrSplit(value, '/')) {
    if (part == "..") {
      return Refuse(
          field, value,
          absl::StrCat("has a '..' component: job paths stay inside the training root ", root));
    }
  }
  std::string normal =
      std::filesystem::path(value[0] == '/' ? value : absl::StrCat(root, "/", value))
          .lexically_normal()
          .string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  if (!Inside(root, normal)) {
    return Refuse(field, value, absl::StrCat("is outside the training root ", root));
  }
  return normal;
}

}  // namespace

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

absl::Status ConfineInput(const std::string& root, const std::string& field, std::string* value) {
  if (value->empty()) return absl::OkStatus();
  absl::StatusOr<std::string> path = Lexical(root, field, *value);
  if (!path.ok()) return path.status();
  char real[PATH_MAX];
  if (realpath(path->c_str(), real) == nullptr) {
    return Refuse(field, *value, absl::StrCat("cannot be read: ", base::ErrnoText(errno)));
  }
  if (!Inside(root, real)) {
    return Refuse(field, *value,
                  absl::StrCat("resolves to ", real, ", outside the training root ", root));
  }
  struct stat st{};
  if (stat(real, &st) != 0 || !S_ISREG(st.st_mode)) {
    return Refuse(field, *value, "is not a regular file");
  }
  *value = real;
  return absl::OkStatus();
}

absl::Status ConfineOutput(const std::string& root, const std::string& field, std::string* value) {
  if (value->empty()) return absl::OkStatus();
  absl::StatusOr<std::string> path = Lexical(root, field, *value);
  if (!path.ok()) return path.status();
  if (*path == root) return Refuse(field, *value, "names the training root, not a file");
  const std::filesystem::path p(*path);
  const std::string name = p.filename().string();
  char real[PATH_MAX];
  if (realpath(p.parent_path().c_str(), real) == nullptr) {
    return Refuse(
        field, *value,
        absl::StrCat("has no directory ", p.parent_path().string(), ": ", base::ErrnoText(errno)));
  }
  if (!Inside(root, real)) {
    return Refuse(field, *value,
                  absl::StrCat("is in ", real, ", outside the training root ", root));
  }
  const std::string full = absl::StrCat(std::string(real) == "/" ? "" : real, "/", name);
  struct stat st{};
  if (lstat(full.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) return Refuse(field, *value, "is a symbolic link: not written to");
    if (!S_ISREG(st.st_mode)) return Refuse(field, *value, "exists and is not a regular file");
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

absl::Status ConfineExport(const std::string& root, training::TrainingConfig* config) {
  if (absl::Status s = CheckExportName(config->export_model_name()); !s.ok()) return s;
  if (config->export_repository().empty()) return absl::OkStatus();
  const std::string field = "export_repository";
  const std::string& value = config->export_repository();
  absl::StatusOr<std::string> path = Lexical(root, field, value);
  if (!path.ok()) return path.status();
  char real[PATH_MAX];
  if (realpath(path->c_str(), real) == nullptr) {
    return Refuse(field, value, absl::StrCat("cannot be used: ", base::ErrnoText(errno)));
  }
  if (!Inside(root, real)) {
    return Refuse(field, value,
                  absl::StrCat("resolves to ", real, ", outside the training root ", root));
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
  const std::string model_dir = absl::StrCat(real, "/", name);
  if (lstat(model_dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    return Refuse("export_model_name", name,
                  absl::StrCat(model_dir, S_ISLNK(st.st_mode) ? " is a symbolic link"
                                                              : " is not a directory"));
  }
  config->set_export_repository(real);
  return absl::OkStatus();
}

}  // namespace numaserve::serving::training_paths
