// A model's config.pbtxt: parsing (protobuf text format, errors with file,
// line and column), validation against the ONNX model's inputs and outputs,
// and the version policy that picks which version directories are served.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "model_config.pb.h"

namespace numaserve::serving {

// The file name inside <repo>/<model>/.
inline constexpr char kModelConfigFile[] = "config.pbtxt";

// The largest dynamic_batching.default_timeout_microseconds and
// max_queue_delay_microseconds accepted (24 hours): far below where the
// microseconds would overflow as clock durations.
inline constexpr uint64_t kMaxConfigMicroseconds = uint64_t{24} * 3600 * 1000 * 1000;

// The largest max_activation_bytes accepted (1 PiB): no run needs more, and
// the value stays far within the int64 the engine takes.
inline constexpr uint64_t kMaxActivationBytes = uint64_t{1} << 50;

// The most dynamic_batching.priority_levels accepted.
inline constexpr uint64_t kMaxPriorityLevels = 1000;

// A config.pbtxt as read: numaserve's config, whichever schema the file is
// written in.
struct ModelConfigFile {
  config::ModelConfig config;
  // The file is in Triton's schema (proto/triton_config_file.proto) and was
  // converted; false for numaserve's own (proto/model_config.proto).
  bool triton = false;
  // Triton fields set in the file that have no effect on numaserve, as
  // dotted paths ("optimization", "input.format"), each once, in field order.
  std::vector<std::string> ignored_fields;
};

// Reads `path`, in numaserve's schema or Triton's: a file that numaserve's
// schema does not parse is read in Triton's (TYPE_FP32 data types, platform,
// instance_group, ...) and converted. INVALID_ARGUMENT
// "<path>:<line>:<column>: <problem>" for a syntax error or an unknown
// field (from the schema whose parse got further into the file; numaserve's
// on a tie), and for a Triton setting numaserve cannot honour (a GPU
// instance group, a platform other than ONNX Runtime's, sequence batching,
// ...), naming the field; NOT_FOUND if the file cannot be read.
// `num_workers` is the server's: Triton's instance_group count is the
// model's copies in all, spread over the workers that hold the model
// (instances_per_domain = ceil(count / workers)).
// `instances_per_domain: auto` and `instances_per_domain: per_core` (the
// field is an int32) are read as kInstancesAuto and kInstancesPerCore; a
// negative number written there is refused with its line and column, since
// those values stand for the words.
absl::StatusOr<ModelConfigFile> ReadModelConfig(const std::string& path, int num_workers = 1);
// The same, from text (`origin` names it in errors).
absl::StatusOr<ModelConfigFile> ReadModelConfigText(const std::string& text,
                                                    const std::string& origin, int num_workers = 1);
// The largest config override (RepositoryModelLoad's parameter `config`)
// accepted, in bytes.
inline constexpr size_t kMaxConfigJsonBytes = size_t{1} << 20;

// A config given as JSON (tritonclient's load_model(config=...)), in
// numaserve's schema or Triton's (the protobuf JSON mapping of either: field
// names as in config.pbtxt or in lowerCamelCase, enums as names), with the
// same refusals as ReadModelConfigText. INVALID_ARGUMENT "<origin>: <problem>"
// naming the field for: more than kMaxConfigJsonBytes, text that is not
// JSON, an unknown field or a value of the wrong type, and a negative
// instances_per_domain (the words auto and per_core have no JSON form in
// numaserve's schema; Triton's takes them as the parameter
// "instance_placement.instances_per_domain").
absl::StatusOr<ModelConfigFile> ReadModelConfigJson(const std::string& json,
                                                    const std::string& origin, int num_workers = 1);

// The config alone, for a server of one worker.
absl::StatusOr<config::ModelConfig> ParseModelConfig(const std::string& path);
absl::StatusOr<config::ModelConfig> ParseModelConfigText(const std::string& text,
                                                         const std::string& origin);

// Checks the config on its own and against the model: the name matches the
// directory, durations within kMaxConfigMicroseconds, max_activation_bytes
// within kMaxActivationBytes,
// max_batch_size needs a batched model, preferred sizes fit, priority_levels
// within kMaxPriorityLevels and default_priority_level within 1..levels,
// placement names existing workers (`num_workers`), listed tensors exist with
// the same datatype and dims, model_warmup entries fit the model
// (CheckWarmups, serving/repository/model_warmup.h). INVALID_ARGUMENT
// naming the field otherwise.
absl::Status ValidateModelConfig(const config::ModelConfig& config, const std::string& model_name,
                                 const engine::ModelInfo& info, int num_workers);
// The config-only part of the checks (no model file needed).
absl::Status ValidateModelConfigFields(const config::ModelConfig& config,
                                       const std::string& model_name, int num_workers);

// Versions to serve out of `available` (ascending), by the policy; the
// default policy serves the highest one. Error for a `specific` version that
// is not on disk.
absl::StatusOr<std::vector<int64_t>> SelectVersions(const config::ModelConfig& config,
                                                    const std::vector<int64_t>& available);

// The workers that load the model, out of 0..num_workers-1.
std::vector<int> PlacementWorkers(const config::ModelConfig& config, int num_workers);

// instance_placement.instances_per_domain (and worker::LoadModel.instances)
// beyond a count: `auto`, the worker measures the model's throughput at load
// on 1, 2, 4, ... copies and picks the count; `per_core`, one copy per core
// of the worker. config.pbtxt spells them as words; the parser turns them
// into these values.
inline constexpr int kInstancesAuto = -1;
inline constexpr int kInstancesPerCore = -2;
// The largest count accepted.
inline constexpr int kMaxInstances = 1024;

// "auto" -> kInstancesAuto, "per_core" -> kInstancesPerCore, or a count
// 1..kMaxInstances. INVALID_ARGUMENT naming the accepted forms otherwise.
absl::StatusOr<int> ParseInstances(std::string_view text);
// The other way: "auto", "per_core", or the count (0 or unset: "1").
std::string FormatInstances(int instances);

// Checks that `instances` copies of `model` (instance_placement.
// instances_per_domain) fit on `worker`, which has `cores` cores: each copy
// needs at least one core of its own. kInstancesAuto and kInstancesPerCore
// always fit (the worker resolves them to at most its cores).
// INVALID_ARGUMENT naming the file and field otherwise.
absl::Status CheckInstancesFit(const std::string& model, int instances, int worker, int cores);

// Matrix-multiply backends the engine is built with ("auto" picks).
const std::vector<std::string>& KnownGemmBackends();

}  // namespace numaserve::serving
