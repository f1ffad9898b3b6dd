// Load against a running numaserve over gRPC, bounded in time.
//   closed loop: N callers, each with one request in flight, back to back
//     (throughput at a given concurrency; saturation with enough callers).
//   open loop: requests sent at a fixed rate whatever the answers do, each
//     latency measured from its scheduled send time, so a server that falls
//     behind shows it (no coordinated omission).
// Prints requests/s, rows/s and latency p50/p90/p99/p99.9 (text, then JSON).
//   grpc_loadgen --url 127.0.0.1:8001 --model fashion_classifier --batch 1 \
//     --mode closed --concurrency 16 --seconds 10
//   grpc_loadgen --url 127.0.0.1:8001 --model fashion_classifier --mode open --rate 2000
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "grpc_service.grpc.pb.h"
#include "server/args.h"

namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

// Latencies of answers that arrive in the measured window, and failures by code.
class Recorder {
 public:
  explicit Recorder(Clock::time_point measure_from) : from_(measure_from) {}
  void Record(Clock::time_point sent, Clock::time_point answered, const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (sent < from_) return;  // warm-up
    if (!status.ok()) {
      ++errors_[status.error_code()];
      return;
    }
    latencies_ms_.push_back(std::chrono::duration<double, std::milli>(answered - sent).count());
  }
  std::vector<double>& latencies() { return latencies_ms_; }
  int64_t errors() const {
    int64_t n = 0;
    for (const auto& [code, count] : errors_) n += count;
    return n;
  }
  std::string ErrorSummary() const {
    std::string s;
    for (const auto& [code, count] : errors_) {
      s += (s.empty() ? "" : ",") + std::to_string(static_cast<int>(code)) + ":" +
           std::to_string(count);
    }
    return s.empty() ? "none" : s;
  }

 private:
  const Clock::time_point from_;
  std::mutex mu_;
  std::vector<double> latencies_ms_;
  std::map<grpc::StatusCode, int64_t> errors_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string url = "127.0.0.1:8001", model = "fashion_classifier", mode = "closed";
  int64_t batch = 1, concurrency = 1, max_outstanding = 4096;
  double seconds = 5, warmup = 1, rate = 1000;
  numaserve::server::ArgParser parser("loadgen", "gRPC load generator (closed or open loop).");
  parser.AddString("url", &url, "server HOST:PORT");
  parser.AddString("model", &model, "model name");
  parser.AddInt("batch", &batch, "rows per request");
  parser.AddString("mode", &mode, "closed (fixed concurrency) | open (fixed rate)");
  parser.AddInt("concurrency", &concurrency, "closed loop: callers, one request in flight each");
  parser.AddDouble("rate", &rate, "open loop: requests per second");
  parser.AddInt("max-outstanding", &max_outstanding,
                "open loop: requests in flight before sends are counted as dropped");
  parser.AddDouble("seconds", &seconds, "measured duration (bounded to 600)");
  parser.AddDouble("warmup-seconds", &warmup, "load before measuring (bounded to 60)");
  if (auto s = parser.Parse(std::vector<std::string>(argv + 1, argv + argc)); !s.ok()) {
    fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  if (mode != "closed" && mode != "open") {
    fprintf(stderr, "--mode must be closed or open, not '%s'\n", mode.c_str());
    return 2;
  }
  if (batch < 1 || concurrency < 1 || rate <= 0 || max_outstanding < 1) {
    fprintf(stderr, "--batch, --concurrency, --rate and --max-outstanding must be positive\n");
    return 2;
  }
  seconds = std::clamp(seconds, 0.1, 600.0);
  warmup = std::clamp(warmup, 0.0, 60.0);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(url, grpc::InsecureChannelCredentials(), args);
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

  const auto start = Clock::now();
  const auto measure_from =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(warmup));
  const auto end = measure_from + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(seconds));
  Recorder recorder(measure_from);
  int64_t dropped = 0;

  if (mode == "closed") {
    std::vector<std::thread> callers;
    for (int64_t c = 0; c < concurrency; ++c) {
      callers.emplace_back([&] {
        inference::ModelInferResponse response;
        while (Clock::now() < end) {
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
          auto t0 = Clock::now();
          auto s = stub->ModelInfer(&ctx, request, &response);
          recorder.Record(t0, Clock::now(), s);
        }
      });
    }
    for (auto& t : callers) t.join();
  } else {
    struct Call {
      grpc::ClientContext ctx;
      inference::ModelInferResponse response;
      Clock::time_point scheduled;
    };
    std::atomic<int64_t> outstanding{0};
    const auto interval =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / rate));
    for (int64_t k = 0;; ++k) {
      const auto scheduled = start + interval * k;
      if (scheduled >= end) break;
      std::this_thread::sleep_until(scheduled);
      if (outstanding.load() >= max_outstanding) {
        if (scheduled >= measure_from) ++dropped;
        continue;
      }
      auto* call = new Call();
      call->scheduled = scheduled;
      call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      ++outstanding;
      stub->async()->ModelInfer(&call->ctx, &request, &call->response,
                                [call, &recorder, &outstanding](grpc::Status s) {
                                  recorder.Record(call->scheduled, Clock::now(), s);
                                  delete call;
                                  --outstanding;
                                });
    }
    const auto give_up = Clock::now() + std::chrono::seconds(60);
    while (outstanding.load() > 0 && Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  std::vector<double>& lat = recorder.latencies();
  const double rps = static_cast<double>(lat.size()) / seconds;
  const double p50 = Percentile(lat, 0.50), p90 = Percentile(lat, 0.90),
               p99 = Percentile(lat, 0.99), p999 = Percentile(lat, 0.999);
  const std::string load = mode == "closed" ? "concurrency=" + std::to_string(concurrency)
                                            : "rate=" + std::to_string(static_cast<int64_t>(rate));
  printf(
      "model=%s batch=%ld mode=%s %s: %.0f req/s, %.0f rows/s, latency p50 %.3f ms p90 %.3f ms "
      "p99 %.3f ms p99.9 %.3f ms, errors %s, dropped %ld\n",
      model.c_str(), batch, mode.c_str(), load.c_str(), rps, rps * static_cast<double>(batch), p50,
      p90, p99, p999, recorder.ErrorSummary().c_str(), dropped);
  printf(
      "{\"model\":\"%s\",\"batch\":%ld,\"mode\":\"%s\",\"concurrency\":%ld,\"rate\":%.1f,"
      "\"requests_per_second\":%.1f,\"rows_per_second\":%.1f,\"p50_ms\":%.4f,\"p90_ms\":%.4f,"
      "\"p99_ms\":%.4f,\"p999_ms\":%.4f,\"errors\":%ld,\"dropped\":%ld}\n",
      model.c_str(), batch, mode.c_str(), mode == "closed" ? concurrency : 0,
      mode == "open" ? rate : 0.0, rps, rps * static_cast<double>(batch), p50, p90, p99, p999,
      recorder.errors(), dropped);
  return recorder.errors() == 0 && dropped == 0 ? 0 : 1;
}
