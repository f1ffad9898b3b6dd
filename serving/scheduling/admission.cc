#include "serving/scheduling/admission.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace numaserve::serving {

absl::StatusOr<Admission> Admit(const RepositoryModel& model,
                                const inference::ModelInferRequest& request,
                                size_t max_message_bytes, const TransportInputs* transport) {
  auto parsed =
      ParseInferRequest(model.info, request, max_message_bytes, model.signature_shapes, transport);
  if (!parsed.ok()) return parsed.status();
  const int64_t max_batch = model.config.max_batch_size();
  if (max_batch > 0 && parsed->rows > max_batch) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the request has %d rows; model '%s' takes at most max_batch_size = %d per request",
        parsed->rows, model.name, max_batch));
  }
  Admission a;
  for (int index : parsed->outputs) a.response_bytes += parsed->output_bytes[index];
  if (a.response_bytes > max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the response would carry %d bytes of outputs, more than the %d-byte message limit "
        "(--grpc-max-message-bytes); send fewer rows",
        a.response_bytes, max_message_bytes));
  }
  for (const auto& input : parsed->inputs) a.request_bytes += input.size;
  for (size_t bytes : parsed->output_bytes) a.output_bytes += bytes;
  a.shape_key = BatchShapeKey(model, *parsed);
  a.parsed = *std::move(parsed);
  return a;
}

std::vector<int64_t> BatchShapeKey(const RepositoryModel& model, const ParsedRequest& parsed) {
  std::vector<int64_t> key;
  if (!model.signature_shapes) return key;
  for (const auto& shape : parsed.input_shapes) {
    key.push_back(static_cast<int64_t>(shape.size()));
    if (!shape.empty()) key.insert(key.end(), shape.begin() + 1, shape.end());
  }
  return key;
}

absl::Status SubmitFollowingSwitch(const std::shared_ptr<PendingInference>& pending,
                                   const inference::ModelInferRequest& request,
                                   const SwitchFollowing& how) {
  absl::Status submitted = how.submit(pending);
  if (submitted.code() != absl::StatusCode::kUnavailable) return submitted;
  // The version this request resolved to was switched out meanwhile (a
  // newer version, or the same version reloaded with an edited config):
  // what the request names now takes it, if it fits there as a new
  // request would.
  auto again = how.resolve();
  if (!again.ok() || *again == pending->model) return submitted;
  auto admitted = Admit(**again, request, how.max_message_bytes, how.transport);
  if (!admitted.ok()) return admitted.status();
  if (absl::Status s = how.readmit(**again, *admitted); !s.ok()) return s;
  pending->model = *again;
  pending->rows = admitted->parsed.rows;
  pending->bytes = admitted->worker_bytes();
  pending->shape_key = std::move(admitted->shape_key);
  pending->parsed = std::move(admitted->parsed);
  return how.submit(pending);
}

}  // namespace numaserve::serving
