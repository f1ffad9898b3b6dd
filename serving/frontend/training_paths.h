// The training service's checks of what a client sends (see
// training_service.h): the paths of a job's config, confined to the
// training root and to the caller's own directory in it, and the random
// part of job ids.
//
// Callers' directories. Each caller has a directory of its own under the
// root, <root>/callers/<id>: CallerId, "anonymous" without authentication
// (every caller is then the same), else the SHA-256 of its identity
// ("token:NAME", "cert:SUBJECT") in hex, never the identity itself. The
// service makes it (0700) at the caller's first job. It is where the
// caller's outputs go: a job writes its checkpoint, final weights and
// timeline there and nowhere else, so `resume` reads the caller's own
// checkpoint only. Nothing else under <root>/callers is the caller's to
// read or write.
//
// Every path in a StartTraining config comes from a client and is treated
// as hostile. Each is checked as text first: no NUL byte, no '..'
// component; a relative path is taken from the caller's directory (an
// output) or from the root (an input, the export repository), and the
// normalised result must be inside the root. Then on disk, symbolic links
// resolved (realpath):
//
//   * an input (model, dataset files): a regular file inside the root and
//     not in another caller's directory;
//   * an output (checkpoint, final_weights, timeline): its directory's real
//     path inside the caller's directory, and the file, when it exists, a
//     regular file and not a symbolic link;
//   * the export: the repository a directory inside the root and not in
//     another caller's directory; the model name a model name the
//     repository would load, whose directory, when it exists, is a real
//     directory that the caller's exports made (its owner file names the
//     caller: training/onnx_export.h, CheckExportOwner).
//
// A path that passes is replaced by its resolved real path, which the job
// runs with; an empty path (the field unset) is left as it is. One that
// fails names the config field: INVALID_ARGUMENT when it is malformed,
// leaves the root or is not what the field needs, PERMISSION_DENIED when it
// is inside the root but not the caller's to use. These checks are made
// once, when the job starts: the job itself writes its outputs through
// fresh O_EXCL | O_NOFOLLOW files renamed into place, and its export checks
// the model directory's owner again when it makes the version.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "training.pb.h"

namespace numaserve::serving::training_paths {

// The directory of the root that holds every caller's directory.
inline constexpr char kCallersDir[] = "callers";

// Where one caller's job may read and write.
struct CallerScope {
  std::string root;     // the training root: absolute, normalised, its real path
  std::string callers;  // <root>/callers
  std::string area;     // <callers>/<owner>: the caller's outputs go here only
  std::string owner;    // CallerId of the caller; its exports' owner
};

// The name of a caller's directory: "anonymous" for "" (no
// authentication), else 64 hex digits of the SHA-256 of `caller`.
absl::StatusOr<std::string> CallerId(const std::string& caller);

// Makes <root>/callers (0700) where missing; it must be a real directory.
// `root` as in CallerScope. INTERNAL naming the directory otherwise.
absl::Status MakeCallersDir(const std::string& root);

// The scope of `caller` under `root` (as in CallerScope), its directory
// made (0700) where missing; *made, when not null, says whether it was
// made now. INTERNAL naming the directory when it cannot be made or is not
// a real directory.
absl::StatusOr<CallerScope> OpenCallerScope(const std::string& root, const std::string& caller,
                                            bool* made = nullptr);

// 2 * bytes random hex digits from the kernel's CSPRNG.
absl::StatusOr<std::string> RandomHex(size_t bytes);

// At most 40 characters of a value, for messages.
std::string Shown(const std::string& value);

// An input file: taken from the root when relative; its real path must be
// a regular file inside the root, not in another caller's directory;
// `value` becomes that real path.
absl::Status ConfineInput(const CallerScope& scope, const std::string& field, std::string* value);

// An output file: taken from the caller's directory when relative; its
// directory's real path must be inside the caller's directory, and the
// file, when it exists, a regular file (not a symbolic link); `value`
// becomes <real directory>/<name>.
absl::Status ConfineOutput(const CallerScope& scope, const std::string& field, std::string* value);

// The export: the repository (taken from the root when relative) a
// directory inside the root and not in another caller's directory, the
// model name one path component whose directory, when it exists, is a real
// directory that the caller's exports made.
absl::Status ConfineExport(const CallerScope& scope, training::TrainingConfig* config);

// Every path of `config`: its inputs, its outputs and its export.
absl::Status ConfineConfig(const CallerScope& scope, training::TrainingConfig* config);

}  // namespace numaserve::serving::training_paths
