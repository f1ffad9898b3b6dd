// Rewrites of the ONNX graph before anything checks its ops, for what
// torch.onnx.export(dynamo=True) writes with sequences of tensors where
// plain tensors would do. The engine runs no sequence values; these make
// the two forms exporters emit into ops it runs. Internal to engine/import.
#pragma once

#include <onnx/onnx_pb.h>

#include "absl/status/status.h"

namespace numaserve::engine {

// A SplitToSequence every reader of which is a SequenceAt at a constant
// index (what `torch.split` / `chunk` followed by indexing exports to)
// becomes a Split, and each SequenceAt an Identity of its part. The
// parts' sizes come from the `split` input (a 1-D constant), or, for a
// scalar chunk size or none, from the axis's size when the model states
// it (a graph input's or a value_info's dim): a dim the model leaves
// dynamic keeps the SplitToSequence (refused as an op the engine lacks).
// An index outside the parts is INVALID_ARGUMENT naming the node. OPSET:
// the model's default-domain opset (Split's `split` is an input from 13).
absl::Status RewriteSplitToSequence(onnx::GraphProto& g, int64_t opset);

// Drops what no graph output depends on: nodes whose outputs nothing
// reads, and a Loop's carried values that neither its outputs nor its
// condition need (with the body nodes only they needed), in subgraphs too.
// `as_strided` exports to such a Loop, carrying a sequence it never
// reads; once that is gone so are its sequence ops.
void DropDeadNodes(onnx::GraphProto& g);

}  // namespace numaserve::engine
