// A model as the server sees it: metadata to validate requests against
// (InspectModel, no kernels) and a compiled, runnable form (CompiledModel)
// built once per worker with its weights prepared in the kernels' layout.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace numaserve::engine {

enum class DataType {
  kUnknown,
  kBool,
  kUint8,
  kInt8,
  kInt32,
  kInt64,
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
  std::vector<int64_t> shape;  // -1 where the dimension is dynamic
};

struct ModelInfo {
  std::string path;
  std::vector<TensorInfo> inputs;
  std::vector<TensorInfo> outputs;
  // True when dim 0 of every input and output is dynamic (the batch
  // dimension). Requests may then carry any number of rows >= 1.
  bool batched = false;
  int64_t opset = 0;            // default-domain opset the model imports
  int64_t parameter_bytes = 0;  // bytes of initializers (weights)
  double flops_per_row = 0;     // multiply-adds x2 per batch row (Gemm/MatMul/Conv)
};

// Parses, checks (onnx::checker) and shape-infers the file; reads metadata.
// Errors name the file and the problem, including unsupported operators
// ("model.onnx: node 'conv1' uses unsupported op Conv").
absl::StatusOr<ModelInfo> InspectModel(const std::string& path);

struct CompileOptions {
  // Threads for the kernels; 0 = the OpenMP default (OMP_NUM_THREADS).
  int num_threads = 0;
  // Backend for Gemm/MatMul with constant weights (kernels/gemm): "onednn",
  // "blis", "openblas", or "auto", which times each available backend once
  // per distinct shape at load and keeps the fastest (logged on stderr and
  // shown by DescribePlan). A named backend that cannot run here fails the
  // load with the reason.
  std::string gemm_backend = "onednn";
  // "auto" only: a file that remembers the choices across processes (see
  // DefaultGemmCacheFile); empty: remembered in this process only.
  std::string gemm_cache_file;
};

// The backends CompileOptions::gemm_backend accepts: "onednn", "blis",
// "openblas", "auto".
const std::vector<std::string>& GemmBackendChoices();
// OK, or INVALID_ARGUMENT naming the accepted values.
absl::Status CheckGemmBackendChoice(const std::string& name);

// Where the CLI and workers keep "auto" choices: $NUMASERVE_GEMM_CACHE if it
// is set (empty: none), else $XDG_CACHE_HOME/numaserve/gemm_choices.tsv,
// else ~/.cache/numaserve/gemm_choices.tsv ("" without a home).
std::string DefaultGemmCacheFile();

class CompiledModel {
 public:
  virtual ~CompiledModel() = default;

  // Imports and compiles the model: fuses ops into oneDNN primitives and
  // reorders weights once into the layout the kernels prefer. Call it in the
  // worker after it is pinned, so the weights land in node-local memory.
  static absl::StatusOr<std::unique_ptr<CompiledModel>> Load(const std::string& path,
                                                             const CompileOptions& options);

  virtual const ModelInfo& info() const = 0;

  // Concrete output shapes for `batch` rows (dim 0 replaced when batched).
  virtual std::vector<std::vector<int64_t>> OutputShapes(int64_t batch) const = 0;

  // Runs `batch` rows. inputs[i] holds info().inputs[i] for all rows,
  // contiguous and row-major; outputs[i] has room for OutputShapes(batch)[i].
  // Not thread-safe: one Run at a time per CompiledModel.
  virtual absl::Status Run(int64_t batch, const std::vector<const void*>& inputs,
                           const std::vector<void*>& outputs) = 0;

  // Peak activation bytes at `batch` rows: the size of the activation
  // arena, whose buffers are reused between values that are not alive at
  // the same time (graph inputs, outputs and weights not included).
  virtual absl::StatusOr<int64_t> ActivationBytes(int64_t batch) { return int64_t{0}; }

  // The compiled plan, one line per kernel step with the graph nodes it
  // stands for ("matmul: fc1+relu1"), for logs and tests.
  virtual std::string DescribePlan() const { return ""; }
};

}  // namespace numaserve::engine
