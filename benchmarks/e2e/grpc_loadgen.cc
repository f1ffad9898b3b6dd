// Closed-loop load against a running numaserve: N callers, each sending
// ModelInfer with `batch` random rows back to back for a bounded time.
// Prints requests/s, inferences/s and latency percentiles (text and JSON).
//   grpc_loadgen --url 127.0.0.1:8001 --model fashion_classifier --batch 1 --concurrency 4
//   --seconds 10
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "grpc_service.grpc.pb.h"
#include "server/args.h"

namespace {

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

}  // namespace

int main(int argc, char** argv) {
  std::string url = "127.0.0.1:8001", model = "fashion_classifier";
  int64_t batch = 1, concurrency = 1;
  double seconds = 5;
  numaserve::server::ArgParser parser("loadgen", "Closed-loop gRPC load generator.");
  parser.AddString("url", &url, "server HOST:PORT");
  parser.AddString("model", &model, "model name");
  parser.AddInt("batch", &batch, "rows per request");
  parser.AddInt("concurrency", &concurrency, "callers, each with one request in flight");
  parser.AddDouble("seconds", &seconds, "duration (bounded to 600)");
  if (auto s = parser.Parse(std::vector<std::string>(argv + 1, argv + argc)); !s.ok()) {
    fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  seconds = std::min(seconds, 600.0);
  auto channel = grpc::CreateChannel(url, grpc::InsecureChannelCredentials());
  auto stub = inference::GRPCInferenceService::NewStub(channel);

  inference::ModelMetadataRequest meta_request;
  meta_request.set_name(model);
  inference::ModelMetadataResponse meta;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto s = stub->ModelMetadata(&ctx, meta_request, &meta);
    if (!s.ok()) {
      fprintf(stderr, "ModelMetadata: %s\n", s.error_message().c_str());
      return 1;
    }
  }
  inference::ModelInferRequest request;
  request.set_model_name(model);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(0, 1);
  for (const auto& t : meta.inputs()) {
    auto* in = request.add_inputs();
    in->set_name(t.name());
    in->set_datatype(t.datatype());
    int64_t n = 1;
    for (int i = 0; i < t.shape_size(); ++i) {
      int64_t d = t.shape(i) < 0 ? (i == 0 ? batch : 1) : t.shape(i);
      in->add_shape(d);
      n *= d;
    }
    std::string* raw = request.add_raw_input_contents();
    raw->resize(static_cast<size_t>(n) * 4);
    for (int64_t i = 0; i < n; ++i) reinterpret_cast<float*>(raw->data())[i] = u(rng);
  }

  std::mutex mu;
  std::vector<double> latencies_ms;
  std::atomic<int64_t> errors{0};
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> callers;
  auto start = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < concurrency; ++c) {
    callers.emplace_back([&] {
      std::vector<double> mine;
      inference::ModelInferResponse response;
      while (std::chrono::steady_clock::now() < end) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        auto t0 = std::chrono::steady_clock::now();
        auto s = stub->ModelInfer(&ctx, request, &response);
        auto t1 = std::chrono::steady_clock::now();
        if (!s.ok()) {
          ++errors;
          continue;
        }
        mine.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      std::lock_guard<std::mutex> lock(mu);
      latencies_ms.insert(latencies_ms.end(), mine.begin(), mine.end());
    });
  }
  for (auto& t : callers) t.join();
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double rps = static_cast<double>(latencies_ms.size()) / elapsed;
  double p50 = Percentile(latencies_ms, 0.50), p90 = Percentile(latencies_ms, 0.90),
         p99 = Percentile(latencies_ms, 0.99);
  printf(
      "model=%s batch=%ld concurrency=%ld: %.0f req/s, %.0f inferences/s, latency p50 %.3f ms "
      "p90 %.3f ms p99 %.3f ms, errors %ld\n",
      model.c_str(), batch, concurrency, rps, rps * static_cast<double>(batch), p50, p90, p99,
      errors.load());
  printf(
      "{\"model\":\"%s\",\"batch\":%ld,\"concurrency\":%ld,\"requests_per_second\":%.1f,"
      "\"inferences_per_second\":%.1f,\"p50_ms\":%.4f,\"p90_ms\":%.4f,\"p99_ms\":%.4f,"
      "\"errors\":%ld}\n",
      model.c_str(), batch, concurrency, rps, rps * static_cast<double>(batch), p50, p90, p99,
      errors.load());
  return errors.load() == 0 ? 0 : 1;
}
