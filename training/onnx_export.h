// Export of a trained model: the original ONNX inference graph (with its
// final Softmax) and the trained weights in place of its initializers,
// written as a new version of a model repository.
#pragma once

#include <string>
#include <utility>
#include <vector>

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

// The path of the next version: <repository>/<name>/<highest + 1>/model.onnx
// (version 1 when there is none). Creates the version directory.
absl::StatusOr<std::string> NextVersionPath(const std::string& repository, const std::string& name);

}  // namespace numaserve::training
