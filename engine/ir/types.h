// The types every layer of the engine and the server share: an element's
// DataType (KServe v2 names), a tensor's name, type and shape, and a
// model's inputs, outputs and batching (ModelInfo).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace numaserve::engine {

enum class DataType {
  kUnknown,
  kBool,
  kUint8,
  kInt8,
  kInt16,
  kUint16,
  kInt32,
  kUint32,
  kInt64,
  kUint64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};
// KServe v2 names: "FP32", "INT64", "BOOL", ...; "UNKNOWN" otherwise.
const char* DataTypeName(DataType type);
DataType DataTypeFromName(const std::string& name);  // kUnknown if not a v2 name
size_t DataTypeSize(DataType type);                  // bytes per element, 0 if unknown

struct TensorInfo {
  std::string name;
  DataType type = DataType::kUnknown;
  // -1 where the dimension is dynamic: dim 0 of an input (its rows) or any
  // other dim of an input (a sequence length, an image's height: the model
  // runs at input shapes given per run, CompiledModel's InputShapes), any
  // dim of an output whose size follows a dynamic dim (or that shape
  // propagation cannot tell).
  std::vector<int64_t> shape;
  // By dim of `shape` (as many): the ONNX dim_param of a
  // dynamic dim ("seq"), "" for a fixed dim or an unnamed one. Dims of one
  // name, in any input, have one size in every run; unnamed dynamic dims
  // other than dim 0 are independent.
  std::vector<std::string> dim_names;
};

struct ModelInfo {
  std::string path;
  std::vector<TensorInfo> inputs;
  std::vector<TensorInfo> outputs;
  // True when requests may be batched together: dim 0 of every input is
  // dynamic (the rows), and every output is [rows, static...] with row i
  // computed from row i of the inputs alone (CheckRowIndependence), so rows
  // of several requests can be concatenated into one run and the output rows
  // scattered back. A model with a dynamic dim 0 that is not batched still
  // takes any number of rows, one request per run (max_batch_size 0).
  bool batched = false;
  // Why a model with a dynamic dim 0 is not batched ("output 'y' is [3,3]
  // at 3 rows: node 'mm' (op MatMul) pairs rows with rows"); empty otherwise.
  std::string unbatched_reason;
  // The output shapes of a run at `rows` (the inputs' dynamic dim 0), from
  // the graph's own shape functions, for a model that is not batched but has
  // outputs whose shape follows the rows (a Reshape of [n,64] to [1,-1] is
  // [1,64n]; x times its transpose is [n,n]); an error when the model cannot
  // run at that many rows. Null otherwise: an output is then `outputs` with
  // dim 0 = rows where it is -1.
  std::function<absl::StatusOr<std::vector<std::vector<int64_t>>>(int64_t rows)> output_shapes_at;
  int64_t opset = 0;            // default-domain opset the model imports
  int64_t parameter_bytes = 0;  // bytes of initializers (weights)
  double flops_per_row = 0;     // multiply-adds x2 per batch row (Gemm/MatMul/Conv)
};

}  // namespace numaserve::engine
