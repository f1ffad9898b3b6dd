#include "serving/repository/model_warmup.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "serving/repository/model_config.h"

namespace numaserve::serving {
namespace {

// "model 'm' config.pbtxt: model_warmup[0] ('zeros'): <problem>".
absl::Status Refused(const std::string& model, int index, const config::ModelWarmup& w,
                     const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrFormat("model '%s' %s: model_warmup[%d] ('%s'): %s",
                                                    model, kModelConfigFile, index, w.name(),
                                                    problem));
}

// The shape of `input` in warm-up `w`: its dims checked against the
// model's, the batch in front for a batched config; "" and the shape, or
// the problem.
absl::StatusOr<std::vector<int64_t>> InputShape(const engine::TensorInfo& input,
                                                const config::ModelWarmup::Input& given,
                                                int64_t batch) {
  const std::string where = absl::StrCat("input '", input.name, "'");
  const std::string type = engine::DataTypeName(input.type);
  if (absl::StripPrefix(given.data_type(), "TYPE_") != type) {
    return absl::InvalidArgumentError(absl::StrCat(where, " data_type '", given.data_type(),
                                                   "' but the model's input is ", type));
  }
  if (given.zero_data() == given.random_data()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": give exactly one of zero_data and random_data"));
  }
  std::vector<int64_t> shape;
  if (batch > 0) shape.push_back(batch);
  shape.insert(shape.end(), given.dims().begin(), given.dims().end());
  if (shape.size() != input.shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " dims [", absl::StrJoin(given.dims(), ","), "] but the model has [",
        absl::StrJoin(input.shape, ","), "]", batch > 0 ? " (the batch in front)" : ""));
  }
  int64_t elements = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    const bool dynamic = input.shape[d] < 0;
    if ((!dynamic && shape[d] != input.shape[d]) || shape[d] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(where, " dim ", d, " is ", shape[d],
                                                     " but the model has ", input.shape[d],
                                                     dynamic ? " (dynamic: at least 1)" : ""));
    }
    if (shape[d] > kMaxWarmupElements / elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " [", absl::StrJoin(shape, ","), "] is above ", kMaxWarmupElements, " elements"));
    }
    elements *= shape[d];
  }
  return shape;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<int64_t>>> WarmupInputShapes(const config::ModelConfig& c,
                                                                    int index,
                                                                    const std::string& model,
                                                                    const engine::ModelInfo& info) {
  const config::ModelWarmup& w = c.model_warmup(index);
  if (c.model_warmup_size() > kMaxWarmups) {
    return Refused(model, index, w, absl::StrCat("at most ", kMaxWarmups, " warm-ups"));
  }
  if (w.count() > kMaxWarmupCount) {
    return Refused(model, index, w,
                   absl::StrCat("count ", w.count(), " is above ", kMaxWarmupCount));
  }
  const bool batched = c.max_batch_size() > 0;
  if (batched ? (w.batch_size() < 1 || w.batch_size() > static_cast<uint32_t>(c.max_batch_size()))
              : w.batch_size() > 1) {
    return Refused(model, index, w,
                   batched ? absl::StrCat("batch_size ", w.batch_size(), " is outside 1..",
                                          c.max_batch_size(), " (max_batch_size)")
                           : absl::StrCat("batch_size ", w.batch_size(),
                                          " needs max_batch_size > 0 (give 0 or 1, and the "
                                          "batch in dims)"));
  }
  for (const auto& [name, given] : w.inputs()) {
    bool known = false;
    for (const engine::TensorInfo& t : info.inputs) known = known || t.name == name;
    if (!known)
      return Refused(model, index, w, absl::StrCat("the model has no input '", name, "'"));
  }
  std::vector<std::vector<int64_t>> shapes;
  for (const engine::TensorInfo& t : info.inputs) {
    auto given = w.inputs().find(t.name);
    if (given == w.inputs().end()) {
      return Refused(model, index, w, absl::StrCat("input '", t.name, "' is missing"));
    }
    auto shape = InputShape(t, given->second, batched ? w.batch_size() : 0);
    if (!shape.ok()) return Refused(model, index, w, std::string(shape.status().message()));
    shapes.push_back(*std::move(shape));
  }
  return shapes;
}

absl::Status CheckWarmups(const config::ModelConfig& c, const std::string& model,
                          const engine::ModelInfo& info) {
  for (int i = 0; i < c.model_warmup_size(); ++i) {
    if (auto shapes = WarmupInputShapes(c, i, model, info); !shapes.ok()) return shapes.status();
  }
  return absl::OkStatus();
}

}  // namespace numaserve::serving
