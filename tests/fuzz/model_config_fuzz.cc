// config.pbtxt: ParseModelConfigText (the instance-word rewriting, then
// protobuf's text format) on arbitrary text, and every check a parsed
// config goes through before the server uses it. What validation accepts
// must hold what the server then relies on.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"
#include "serving/repository/model_config.h"
#include "tests/fuzz/fuzz_target.h"

namespace numaserve::fuzz {
namespace {

constexpr int kWorkers = 2;

engine::ModelInfo Model(bool batched) {
  engine::ModelInfo info;
  info.path = "m/1/model.onnx";
  info.batched = batched;
  info.inputs = {{"input", engine::DataType::kFloat32, {batched ? -1 : 1, 4}},
                 {"mask", engine::DataType::kBool, {batched ? -1 : 1, 4}}};
  info.outputs = {{"output", engine::DataType::kFloat32, {batched ? -1 : 1, 2}}};
  return info;
}

}  // namespace

int FuzzOne(const uint8_t* data, size_t size) {
  const std::string text(AsText(data, size));
  absl::StatusOr<config::ModelConfig> parsed =
      serving::ParseModelConfigText(text, "m/config.pbtxt");
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const config::ModelConfig& c = *parsed;
  if (serving::ValidateModelConfigFields(c, "m", kWorkers).ok()) {
    FUZZ_CHECK(c.max_batch_size() >= 0);
    FUZZ_CHECK(c.dynamic_batching().max_queue_delay_microseconds() <=
               serving::kMaxConfigMicroseconds);
    FUZZ_CHECK(c.dynamic_batching().default_timeout_microseconds() <=
               serving::kMaxConfigMicroseconds);
    const int instances = c.instance_placement().instances_per_domain();
    FUZZ_CHECK(instances == serving::kInstancesAuto || instances == serving::kInstancesPerCore ||
               (instances >= 0 && instances <= serving::kMaxInstances));
    // What `numaserve` prints for the instances reads back as the same.
    if (instances != 0) {
      absl::StatusOr<int> again = serving::ParseInstances(serving::FormatInstances(instances));
      FUZZ_CHECK(again.ok() && *again == instances);
    }
    for (int w : serving::PlacementWorkers(c, kWorkers)) FUZZ_CHECK(w >= 0 && w < kWorkers);
    for (int cores : {1, 4}) {
      (void)serving::CheckInstancesFit("m", instances, 0, cores);
    }
  }
  for (bool batched : {true, false}) {
    (void)serving::ValidateModelConfig(c, "m", Model(batched), kWorkers);
  }
  for (const std::vector<int64_t>& available :
       {std::vector<int64_t>{}, std::vector<int64_t>{1}, std::vector<int64_t>{1, 2, 7}}) {
    absl::StatusOr<std::vector<int64_t>> versions = serving::SelectVersions(c, available);
    if (!versions.ok()) continue;
    for (int64_t v : *versions) {
      FUZZ_CHECK(std::binary_search(available.begin(), available.end(), v));
    }
  }
  return 0;
}

}  // namespace numaserve::fuzz
