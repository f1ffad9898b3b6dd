// Export of a trained model: the original ONNX inference graph (with its
// final Softmax) and the trained weights in place of its initializers,
// written as a new version of a model repository.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onnx {
class ModelProto;
}  // namespace onnx

namespace numaserve::training {

struct NamedWeights {
  std::string name;  // initializer name
  const std::vector<float>* data;
};

// Reads `source_model`, replaces the initializers named in `weights` (every
// one must exist with the same element count), folds each
// BatchNormalization that alone consumes a Conv's output into that Conv's
// weights and bias (inference graph), and writes the result to `out_path`
// atomically.
absl::Status ExportOnnx(const std::string& source_model, const std::vector<NamedWeights>& weights,
                        const std::string& out_path);

// Folds BatchNormalization nodes into the Conv before them (weights and
// biases must be initializers); returns how many were folded.
int FoldBatchNorms(onnx::ModelProto* model);

// The file in a model directory that names the owner whose exports made the
// directory: one line, the owner. The training service's jobs export with
// their caller as owner (serving/frontend/training_paths.h); a directory
// without this file, or naming another owner, takes none of their exports.
inline constexpr char kExportOwnerFile[] = ".numaserve-owner";

// An owner: 1 to 128 characters of [A-Za-z0-9_-] (what the file holds).
absl::Status CheckExportOwnerName(const std::string& owner);

// OK when `model_dir` may take an export of `owner`: it does not exist yet,
// or it is a real directory (not a symbolic link) whose kExportOwnerFile,
// a regular file, holds `owner`. Otherwise PERMISSION_DENIED naming the
// directory (INVALID_ARGUMENT when it is not a directory).
absl::Status CheckExportOwner(const std::string& model_dir, const std::string& owner);

// The path of the next version: <repository>/<name>/<highest + 1>/model.onnx
// (version 1 when there is none). Creates the version directory.
//
// With an `owner`, the model directory is the owner's alone: one it makes
// gets kExportOwnerFile (O_EXCL | O_NOFOLLOW) naming the owner, and one
// that exists must pass CheckExportOwner. The mkdir decides who made it:
// of two exports racing to a new name, the second is refused.
absl::StatusOr<std::string> NextVersionPath(const std::string& repository, const std::string& name,
                                            const std::string& owner = "");

}  // namespace numaserve::training
