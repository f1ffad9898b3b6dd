// What JSON tensors cost the HTTP front end, per element, against the same
// tensor as binary data: ParseJsonInferRequest on a request body of one FP32
// input (or INT64, or BYTES strings), and FormatJsonInferResponse on a
// response of one output, at 784 to 602,112 elements. Counters: elements/s
// and bytes/s of tensor data; the time per element is 1 / elements/s.
//   build/release/bin/rest_json_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpc_service.pb.h"
#include "serving/http/infer_json.h"

namespace numaserve::bench {
namespace {

constexpr size_t kMaxTensorBytes = size_t{1} << 30;

// A body of one input "x" of `n` elements of `datatype`, as JSON values or
// (binary) as Triton's binary data after the JSON.
std::string RequestBody(const std::string& datatype, int64_t n, bool binary, size_t* json_size) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1.0F, 1.0F);
  std::string json =
      absl::StrCat(R"({"inputs":[{"name":"x","datatype":")", datatype, R"(","shape":[)", n, "]");
  std::string data;
  if (binary) {
    if (datatype == "FP32") {
      data.resize(static_cast<size_t>(n) * 4);
      for (int64_t i = 0; i < n; ++i) {
        const float v = uniform(rng);
        std::memcpy(data.data() + i * 4, &v, 4);
      }
    } else {
      data.resize(static_cast<size_t>(n) * 8);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = static_cast<int64_t>(rng() % 30522);
        std::memcpy(data.data() + i * 8, &v, 8);
      }
    }
    absl::StrAppend(&json, R"(,"parameters":{"binary_data_size":)", data.size(), "}}]}");
  } else {
    json += R"(,"data":[)";
    for (int64_t i = 0; i < n; ++i) {
      if (i > 0) json += ',';
      if (datatype == "FP32") {
        absl::StrAppend(&json, uniform(rng));
      } else if (datatype == "INT64") {
        absl::StrAppend(&json, rng() % 30522);
      } else {
        absl::StrAppend(&json, "\"token", rng() % 30522, "\"");
      }
    }
    json += "]}]}";
  }
  *json_size = json.size();
  return json + data;
}

void Parse(benchmark::State& state, const std::string& datatype, bool binary) {
  const int64_t n = state.range(0);
  size_t json_size = 0;
  const std::string body = RequestBody(datatype, n, binary, &json_size);
  const absl::string_view view(body);
  for (auto _ : state) {
    auto parsed = serving::http::ParseJsonInferRequest(view.substr(0, json_size),
                                                       view.substr(json_size), kMaxTensorBytes);
    if (!parsed.ok()) {
      state.SkipWithError(std::string(parsed.status().message()).c_str());
      break;
    }
    const char* first = parsed->inputs->inputs[0].pieces[0].first;
    benchmark::DoNotOptimize(first);
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(body.size()));
  state.counters["body_bytes"] = static_cast<double>(body.size());
}

void Format(benchmark::State& state, bool binary) {
  const int64_t n = state.range(0);
  serving::http::JsonInferRequest request;
  request.binary_outputs = binary;
  inference::ModelInferResponse response;
  response.set_model_name("m");
  auto* output = response.add_outputs();
  output->set_name("y");
  output->set_datatype("FP32");
  output->add_shape(n);
  std::string raw(static_cast<size_t>(n) * 4, '\0');
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> uniform(-1.0F, 1.0F);
  for (int64_t i = 0; i < n; ++i) {
    const float v = uniform(rng);
    std::memcpy(raw.data() + i * 4, &v, 4);
  }
  response.add_raw_output_contents(raw);
  size_t bytes = 0;
  for (auto _ : state) {
    serving::http::JsonInferReply reply = serving::http::FormatJsonInferResponse(response, request);
    bytes = reply.json.size();
    for (const auto& part : reply.binary) bytes += part.size();
    benchmark::DoNotOptimize(reply.json.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["body_bytes"] = static_cast<double>(bytes);
}

// 784: one Fashion-MNIST image; 150,528: one 224x224 RGB image;
// 602,112: four of them (the 602 KB input of the issue's profile is one).
void Sizes(benchmark::internal::Benchmark* b) { b->Arg(784)->Arg(150528)->Arg(602112); }

BENCHMARK_CAPTURE(Parse, fp32_json, std::string("FP32"), false)->Apply(Sizes);
BENCHMARK_CAPTURE(Parse, fp32_binary, std::string("FP32"), true)->Apply(Sizes);
BENCHMARK_CAPTURE(Parse, int64_json, std::string("INT64"), false)->Arg(128)->Arg(65536);
BENCHMARK_CAPTURE(Parse, int64_binary, std::string("INT64"), true)->Arg(128)->Arg(65536);
BENCHMARK_CAPTURE(Parse, bytes_json, std::string("BYTES"), false)->Arg(128)->Arg(65536);
BENCHMARK_CAPTURE(Format, fp32_json, false)->Apply(Sizes);
BENCHMARK_CAPTURE(Format, fp32_binary, true)->Apply(Sizes);

}  // namespace
}  // namespace numaserve::bench

BENCHMARK_MAIN();
