// Weights kept beside the model file (ONNX external data: a tensor whose
// bytes are in another file, named by `location`, at `offset`, `length`
// bytes), as exporters write models past protobuf's 2 GiB and as
// torch.onnx.export(dynamo=True) and optimum write them by default.
// Internal to engine/import.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>

#include "absl/status/status.h"

namespace numaserve::engine {

// Reads every external tensor of MODEL (initializers and the tensors of
// attributes, in every subgraph) into its raw_data, so that what follows
// (libonnx's checker, the graph) sees the model as if its weights were
// inside it. MODEL_PATH is the model file; a location is followed only
// where it stays in that file's folder:
//   - relative, without a `..` component, naming a regular file that,
//     symbolic links resolved, lies in the model's folder;
//   - keys `location`, `offset`, `length` (decimal) and `checksum`
//     (not checked); any other key is refused;
//   - the bytes the tensor's type and dims need (only types of fixed
//     size), equal to `length` when given, within the file;
//   - all tensors together read at most each file's size from it, so a
//     region named many times cannot multiply what a small file costs.
// Errors name the tensor and the location; nothing is allocated for a
// tensor before its region is checked.
absl::Status LoadExternalData(onnx::ModelProto& model, const std::string& model_path);

}  // namespace numaserve::engine
