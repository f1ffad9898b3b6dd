// The training service's checks of what a client sends (see
// training_service.h): the paths of a job's config, confined to the
// training root, and the random part of job ids.
//
// Every path in a StartTraining config comes from a client and is treated
// as hostile. Each is confined to the configured root (`root`: absolute and
// normalised, as TrainingService::Create makes --training-root):
//
//   * as text first: no NUL byte, no '..' component; a relative path is
//     taken from the root, and the normalised result must be inside it;
//   * then on disk, symbolic links resolved (realpath): an input's real
//     path must be a regular file inside the root; an output's directory's
//     real path must be inside the root, and the output, when it exists, a
//     regular file and not a symbolic link; the export repository must be
//     a directory inside the root and the export model name one path
//     component whose directory, when it exists, is a real directory.
//
// A path that passes is replaced by its resolved real path, which the job
// runs with; an empty path (the field unset) is left as it is. One that
// fails is INVALID_ARGUMENT naming the config field. These checks are made
// once, when the job starts: the job itself writes its outputs through
// fresh O_EXCL | O_NOFOLLOW files renamed into place.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "training.pb.h"

namespace numaserve::serving::training_paths {

// 2 * bytes random hex digits from the kernel's CSPRNG.
absl::StatusOr<std::string> RandomHex(size_t bytes);

// At most 40 characters of a value, for messages.
std::string Shown(const std::string& value);

// An input file: its real path (symbolic links resolved) must be a regular
// file inside the root; `value` becomes that real path.
absl::Status ConfineInput(const std::string& root, const std::string& field, std::string* value);

// An output file: its directory's real path must be inside the root, and
// the file, when it exists, a regular file (not a symbolic link); `value`
// becomes <real directory>/<name>.
absl::Status ConfineOutput(const std::string& root, const std::string& field, std::string* value);

// The export: the repository a directory inside the root, the model name
// one path component whose directory, when it exists, is a real directory.
absl::Status ConfineExport(const std::string& root, training::TrainingConfig* config);

}  // namespace numaserve::serving::training_paths
