// RestService (rest_service.h): each route's call into the InferenceService
// and its answer as JSON.
#include "serving/http/rest_service.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "serving/http/http_status.h"
#include "serving/http/infer_json.h"
#include "serving/http/json_writer.h"
#include "serving/http/rapidjson.h"

namespace numaserve::serving::http {
namespace {

constexpr char kJson[] = "application/json";

HttpReply JsonReply(int status, std::string body) {
  HttpReply reply;
  reply.status = status;
  reply.headers.emplace_back("Content-Type", kJson);
  reply.body = std::move(body);
  return reply;
}

// An empty answer: the health and readiness calls say it in the status.
HttpReply EmptyReply(int status) {
  HttpReply reply;
  reply.status = status;
  return reply;
}

HttpReply ErrorReply(const absl::Status& status) {
  return JsonReply(HttpStatusFor(status.code()).code, ErrorBody(status.message()));
}

// Whether an unload body's "parameters" asks for nothing this server lacks:
// none, or Triton's "unload_dependents", which tritonclient sends on every
// unload (a model here has no dependents: true and false unload the same).
bool UnloadParametersAccepted(const rapidjson::Value& parameters) {
  for (const auto& p : parameters.GetObject()) {
    const absl::string_view key(p.name.GetString(), p.name.GetStringLength());
    if (key != "unload_dependents" || !p.value.IsBool()) return false;
  }
  return true;
}

// One request's state from its body to its reply, shared by the answer and
// the reply (whose binary outputs point into `response`).
struct InferCall {
  JsonInferRequest request;
  inference::ModelInferResponse response;
  std::shared_ptr<CallCancellation> cancel = std::make_shared<CallCancellation>();
};

HttpReply InferReply(const InferCall& call) {
  JsonInferReply body = FormatJsonInferResponse(call.response, call.request);
  HttpReply reply;
  if (body.binary.empty()) {
    reply.headers.emplace_back("Content-Type", kJson);
  } else {
    reply.headers.emplace_back("Content-Type", "application/octet-stream");
    reply.headers.emplace_back("Inference-Header-Content-Length", absl::StrCat(body.json.size()));
  }
  reply.body = std::move(body.json);
  reply.more_body = std::move(body.binary);
  return reply;
}

// A repository call's optional JSON object body, at most `max_bytes`.
absl::StatusOr<rapidjson::Document> ControlBody(absl::string_view body, size_t max_bytes) {
  rapidjson::Document document;
  if (body.empty()) {
    document.SetObject();
    return document;
  }
  if (body.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the body is %d bytes; this call takes at most %d", body.size(), max_bytes));
  }
  constexpr unsigned kFlags =
      rapidjson::kParseIterativeFlag | rapidjson::kParseValidateEncodingFlag;
  document.Parse<kFlags>(body.data(), body.size());
  if (document.HasParseError()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the body is not valid JSON: %s (at byte %d)",
        rapidjson::GetParseError_En(document.GetParseError()), document.GetErrorOffset()));
  }
  if (!document.IsObject()) return absl::InvalidArgumentError("the body must be a JSON object");
  return document;
}

// The value of header `name` as a byte count: absent (nullopt-like -1), or
// exactly one decimal number.
absl::StatusOr<int64_t> LengthHeader(const HttpExchange& exchange, absl::string_view name) {
  std::vector<absl::string_view> values = exchange.Headers(name);
  if (values.empty()) return -1;
  uint64_t length = 0;
  if (values.size() > 1 || values[0].empty() ||
      values[0].find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(values[0], &length) ||
      length > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("one ", name, " header with a byte count is expected"));
  }
  return static_cast<int64_t>(length);
}

}  // namespace

RestService::RestService(const Options& options, InferenceService* service, const GrpcAuth* auth)
    : options_(options), service_(service), auth_(auth) {}

bool RestService::Authorize(HttpExchange* exchange) const {
  if (auth_ == nullptr || !auth_->checks_tokens()) return true;
  std::vector<absl::string_view> given = exchange->Headers("Authorization");
  if (given.size() == 1 && auth_->FindToken(given[0]) != nullptr) return true;
  HttpReply reply = JsonReply(
      401, ErrorBody(given.empty() ? "this server needs one 'Authorization: Bearer <token>' header"
                     : given.size() > 1 ? "more than one Authorization header"
                                        : "unknown bearer token"));
  reply.headers.emplace_back("WWW-Authenticate", given.empty() ? "Bearer realm=\"numaserve\""
                                                               : "Bearer realm=\"numaserve\", "
                                                                 "error=\"invalid_token\"");
  exchange->Reply(std::move(reply));
  return false;
}

void RestService::Handle(HttpExchange* exchange) {
  absl::StatusOr<Route> route = MatchRoute(exchange->path());
  if (!(route.ok() && route->open()) && !Authorize(exchange)) return;
  if (!route.ok()) return exchange->Reply(ErrorReply(route.status()));
  if (exchange->method() != route->method) {
    HttpReply reply =
        JsonReply(405, ErrorBody(absl::StrCat(exchange->method(), " ", exchange->path(),
                                              ": this path takes ", route->method)));
    reply.headers.emplace_back("Allow", route->method);
    return exchange->Reply(std::move(reply));
  }
  switch (route->kind) {
    case Route::Kind::kLive:
      return exchange->Reply(EmptyReply(200));
    case Route::Kind::kReady:
      // Not ready is 400, as Triton answers.
      return exchange->Reply(EmptyReply(service_->Ready() ? 200 : 400));
    case Route::Kind::kModelReady: {
      absl::StatusOr<bool> ready = service_->ModelIsReady(route->model, route->version);
      if (!ready.ok()) return exchange->Reply(ErrorReply(ready.status()));
      return exchange->Reply(EmptyReply(*ready ? 200 : 400));
    }
    case Route::Kind::kServerMetadata:
    case Route::Kind::kModelMetadata:
    case Route::Kind::kModelConfig:
    case Route::Kind::kModelStats:
      return Metadata(exchange, *route);
    case Route::Kind::kInfer:
      return Infer(exchange, *route);
    case Route::Kind::kRepositoryIndex:
      return RepositoryIndex(exchange);
    case Route::Kind::kLoad:
    case Route::Kind::kUnload:
      return LoadOrUnload(exchange, *route);
  }
}

void RestService::Metadata(HttpExchange* exchange, const Route& route) {
  absl::Status status;
  std::string json;
  if (route.kind == Route::Kind::kServerMetadata) {
    inference::ServerMetadataResponse response;
    service_->FillServerMetadata(&response);
    json = ProtoToJson(response);
  } else if (route.kind == Route::Kind::kModelMetadata) {
    inference::ModelMetadataResponse response;
    status = service_->FillModelMetadata(route.model, route.version, &response);
    json = ProtoToJson(response);
  } else if (route.kind == Route::Kind::kModelConfig) {
    inference::ModelConfigResponse response;
    status = service_->FillModelConfig(route.model, route.version, &response);
    json = ProtoToJson(response.config());
  } else {
    inference::ModelStatisticsResponse response;
    status = service_->FillModelStatistics(route.model, route.version, &response);
    json = ProtoToJson(response);
  }
  if (!status.ok()) return exchange->Reply(ErrorReply(status));
  exchange->Reply(JsonReply(200, std::move(json)));
}

void RestService::RepositoryIndex(HttpExchange* exchange) {
  absl::StatusOr<rapidjson::Document> body =
      ControlBody(exchange->Body(), options_.max_control_body_bytes);
  if (!body.ok()) return exchange->Reply(ErrorReply(body.status()));
  inference::RepositoryIndexRequest request;
  for (const auto& member : body->GetObject()) {
    const absl::string_view name(member.name.GetString(), member.name.GetStringLength());
    if (name != "ready" || !member.value.IsBool()) {
      return exchange->Reply(ErrorReply(absl::InvalidArgumentError(
          "the index request takes one field, \"ready\": true or false")));
    }
    request.set_ready(member.value.GetBool());
  }
  inference::RepositoryIndexResponse response;
  if (absl::Status s = service_->FillRepositoryIndex(request, &response); !s.ok()) {
    return exchange->Reply(ErrorReply(s));
  }
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  writer.StartArray();
  for (const auto& model : response.models()) WriteProto(writer, model);
  writer.EndArray();
  exchange->Reply(JsonReply(200, std::string(buffer.GetString(), buffer.GetSize())));
}

void RestService::LoadOrUnload(HttpExchange* exchange, const Route& route) {
  absl::StatusOr<rapidjson::Document> body =
      ControlBody(exchange->Body(), options_.max_control_body_bytes);
  if (!body.ok()) return exchange->Reply(ErrorReply(body.status()));
  // A load's parameters as gRPC's RepositoryModelLoad carries them; the
  // service says which it takes ("config").
  google::protobuf::Map<std::string, inference::ModelRepositoryParameter> parameters;
  const bool load = route.kind == Route::Kind::kLoad;
  for (const auto& member : body->GetObject()) {
    const absl::string_view name(member.name.GetString(), member.name.GetStringLength());
    if (name != "parameters" || !member.value.IsObject() ||
        (!load && !UnloadParametersAccepted(member.value))) {
      return exchange->Reply(ErrorReply(absl::InvalidArgumentError(
          load ? "a load takes one field, \"parameters\": an object"
               : "unload takes only \"unload_dependents\": true or false (the model is read "
                 "from the repository)")));
    }
    if (!load) continue;
    for (const auto& p : member.value.GetObject()) {
      const std::string key(p.name.GetString(), p.name.GetStringLength());
      if (parameters.count(key) > 0) {
        return exchange->Reply(
            ErrorReply(absl::InvalidArgumentError("a load parameter is given twice")));
      }
      inference::ModelRepositoryParameter& value = parameters[key];
      if (p.value.IsString()) {
        value.set_string_param(std::string(p.value.GetString(), p.value.GetStringLength()));
      } else if (p.value.IsBool()) {
        value.set_bool_param(p.value.GetBool());
      } else if (p.value.IsInt64()) {
        value.set_int64_param(p.value.GetInt64());
      } else {
        return exchange->Reply(ErrorReply(
            absl::InvalidArgumentError("a load parameter is a string, a bool or an integer")));
      }
    }
  }
  auto answer = [exchange](const absl::Status& status) {
    exchange->Reply(status.ok() ? EmptyReply(200) : ErrorReply(status));
  };
  if (load) {
    service_->LoadModel(route.model, parameters, std::move(answer));
  } else {
    service_->UnloadModel(route.model, std::move(answer));
  }
}

void RestService::Infer(HttpExchange* exchange, const Route& route) {
  const size_t body_size = exchange->BodySize();
  absl::StatusOr<int64_t> header_length =
      LengthHeader(*exchange, "Inference-Header-Content-Length");
  if (!header_length.ok()) return exchange->Reply(ErrorReply(header_length.status()));
  size_t json_size = body_size;
  if (*header_length >= 0) {
    if (static_cast<uint64_t>(*header_length) > body_size) {
      return exchange->Reply(ErrorReply(absl::InvalidArgumentError(
          absl::StrFormat("Inference-Header-Content-Length is %d, more than the body's %d bytes",
                          *header_length, body_size))));
    }
    json_size = static_cast<size_t>(*header_length);
  }
  // The JSON made contiguous; the binary part read where it lies, the
  // request holding the body until it is answered (one copy of each input,
  // into the worker's arena).
  TakenBody body = exchange->TakeBody(json_size);
  if (body.prefix.size() != json_size) {
    return exchange->Reply(
        ErrorReply(absl::ResourceExhaustedError("the request body could not be held")));
  }
  absl::StatusOr<JsonInferRequest> parsed = ParseJsonInferRequest(
      body.prefix, body.rest, std::move(body.owner), options_.max_message_bytes);
  if (!parsed.ok()) return exchange->Reply(ErrorReply(parsed.status()));
  auto call = std::make_shared<InferCall>();
  call->request = *std::move(parsed);
  call->request.request.set_model_name(route.model);
  call->request.request.set_model_version(route.version);
  service_->StartInference(
      Protocol::kHttp, call->cancel, &call->request.request, &call->response,
      [call, exchange](const absl::Status& status, InflightRelease release) {
        HttpReply reply = status.ok() ? InferReply(*call) : ErrorReply(status);
        // The request's bytes stay charged until its reply is written.
        reply.keep = call;
        reply.on_written = std::move(release);
        exchange->Reply(std::move(reply));
      },
      TransportBuffers{call->request.inputs, nullptr});
}

}  // namespace numaserve::serving::http
