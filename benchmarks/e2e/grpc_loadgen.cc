// Load against a running numaserve over gRPC, bounded in time.
//   closed loop: N callers, each with one request in flight, back to back
//     (throughput at a given concurrency; saturation with enough callers).
//     Callers are asynchronous calls restarted from their own completion, so
//     64 callers cost no more client threads than 1.
//   stream: closed loop over ModelStreamInfer: each of --channels streams
//     keeps concurrency/channels requests in flight, sending one more for
//     each answer (no per-call set-up; latency pairs answers with sends in
//     order, exact with one worker, which answers a stream in order).
//   open loop: requests sent at a fixed rate whatever the answers do, each
//     latency measured from its scheduled send time, so a server that falls
//     behind shows it (no coordinated omission).
// The request is serialized once and sent as the same bytes every time
// (answers are not parsed, only their status read), so the load generator's
// own CPU time per request, printed with the results, is little more than
// gRPC's: on a machine where it shares cores with the server, it takes as
// little from the server as a client can.
// Prints requests/s, rows/s, latency p50/p90/p99/p99.9 and that CPU time
// (text, then JSON).
//   grpc_loadgen --url 127.0.0.1:8001 --model fashion_classifier --rows 16
//     --mode closed --concurrency 16 --seconds 10 --cpus 0
//   grpc_loadgen --url 127.0.0.1:8001 --model fashion_classifier --mode open --rate 2000
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "affinity/topology.h"
#include "base/args.h"
#include "grpc_service.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

// User + system CPU seconds of this process so far.
double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

// Latencies of answers to requests sent in the measured window, failures by
// code, and every answer (warm-up included) for the CPU-per-request figure.
class Recorder {
 public:
  explicit Recorder(Clock::time_point measure_from) : from_(measure_from) {}
  void Record(Clock::time_point sent, Clock::time_point answered, const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++answered_;
    if (sent < from_) return;  // warm-up
    const double ms = std::chrono::duration<double, std::milli>(answered - sent).count();
    if (!status.ok()) {
      if (++errors_[status.error_code()] == 1)
        first_error_[status.error_code()] = status.error_message();
      error_latencies_ms_.push_back(ms);
      return;
    }
    latencies_ms_.push_back(ms);
  }
  std::vector<double>& latencies() { return latencies_ms_; }
  // How long failed calls took to fail (a refusal should come at once).
  std::vector<double>& error_latencies() { return error_latencies_ms_; }
  int64_t answered() const { return answered_; }
  int64_t errors() const {
    int64_t n = 0;
    for (const auto& [code, count] : errors_) n += count;
    return n;
  }
  std::string ErrorSummary() const {
    std::string s;
    for (const auto& [code, count] : errors_) {
      if (!s.empty()) s += ',';
      s += std::to_string(static_cast<int>(code));
      s += ':';
      s += std::to_string(count);
    }
    return s.empty() ? "none" : s;
  }
  // One message per failing code, the first seen, for the text line.
  std::string FirstErrors() const {
    std::string s;
    for (const auto& [code, message] : first_error_) {
      s += "\n  first failure with code " + std::to_string(static_cast<int>(code)) + ": " + message;
    }
    return s;
  }
  // {"8":12,"14":3}: failures by gRPC status code.
  std::string ErrorsJson() const {
    std::string s = "{";
    for (const auto& [code, count] : errors_) {
      if (s.size() > 1) s += ',';
      s += "\"" + std::to_string(static_cast<int>(code)) + "\":" + std::to_string(count);
    }
    return s + "}";
  }

 private:
  const Clock::time_point from_;
  std::mutex mu_;
  int64_t answered_ = 0;
  std::vector<double> latencies_ms_;
  std::vector<double> error_latencies_ms_;
  std::map<grpc::StatusCode, int64_t> errors_;
  std::map<grpc::StatusCode, std::string> first_error_;
};

// Counts calls in flight; Wait() returns once none is left (or at `until`).
class InFlight {
 public:
  void Add() {
    std::lock_guard<std::mutex> lock(mu_);
    ++n_;
  }
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--n_ == 0) cv_.notify_all();
  }
  int64_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return n_;
  }
  bool Wait(Clock::time_point until) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, until, [&] { return n_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t n_ = 0;
};

constexpr char kModelInfer[] = "/inference.GRPCInferenceService/ModelInfer";
constexpr char kModelStreamInfer[] = "/inference.GRPCInferenceService/ModelStreamInfer";

struct Call {
  grpc::ClientContext ctx;
  grpc::ByteBuffer response;
  Clock::time_point sent;
};

// One closed-loop caller: sends, and from the answer's callback sends again
// until `end`.
class Caller {
 public:
  Caller(grpc::GenericStub* stub, const grpc::ByteBuffer* request, Recorder* recorder,
         InFlight* in_flight, Clock::time_point end)
      : stub_(stub), request_(request), recorder_(recorder), in_flight_(in_flight), end_(end) {}

  void Send() {
    const auto now = Clock::now();
    if (now >= end_) {
      in_flight_->Done();
      return;
    }
    auto* call = new Call();
    call->sent = now;
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stub_->UnaryCall(&call->ctx, kModelInfer, grpc::StubOptions(), request_, &call->response,
                     [this, call](grpc::Status s) {
                       recorder_->Record(call->sent, Clock::now(), s);
                       delete call;
                       Send();
                     });
  }

 private:
  grpc::GenericStub* const stub_;
  const grpc::ByteBuffer* const request_;
  Recorder* const recorder_;
  InFlight* const in_flight_;
  const Clock::time_point end_;
};

// One ModelStreamInfer stream with `window` requests in flight until `end`.
class StreamCaller final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamCaller(grpc::GenericStub* stub, const grpc::ByteBuffer* request, int64_t window,
               Recorder* recorder, InFlight* in_flight, Clock::time_point end)
      : request_(request), recorder_(recorder), in_flight_(in_flight), end_(end) {
    ctx_.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::seconds>(end - Clock::now()) +
                      std::chrono::seconds(60));
    stub->PrepareBidiStreamingCall(&ctx_, kModelStreamInfer, grpc::StubOptions(), this);
    StartRead(&answer_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      to_send_ = window;
      SendLocked();
    }
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      to_send_ = 0;
      return;
    }
    SendLocked();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    const auto now = Clock::now();
    inference::ModelStreamInferResponse answer;
    grpc::Status status = grpc::Status::OK;
    if (!grpc::SerializationTraits<inference::ModelStreamInferResponse>::Deserialize(&answer_,
                                                                                     &answer)
             .ok() ||
        !answer.error_message().empty()) {
      status = grpc::Status(grpc::StatusCode::UNKNOWN, answer.error_message());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      recorder_->Record(sent_.front(), now, status);
      sent_.pop_front();
      if (now < end_) {
        ++to_send_;
        SendLocked();
      } else if (sent_.empty() && !writes_done_) {
        writes_done_ = true;
        if (!writing_) StartWritesDone();
      }
    }
    StartRead(&answer_);
  }

  void OnDone(const grpc::Status& status) override {
    if (!status.ok()) recorder_->Record(end_, Clock::now(), status);
    in_flight_->Done();
    delete this;
  }

 private:
  void SendLocked() {
    if (writing_ || to_send_ == 0 || writes_done_) {
      if (!writing_ && writes_done_) StartWritesDone();
      return;
    }
    --to_send_;
    writing_ = true;
    sent_.push_back(Clock::now());
    StartWrite(request_);
  }

  grpc::ClientContext ctx_;
  const grpc::ByteBuffer* const request_;
  Recorder* const recorder_;
  InFlight* const in_flight_;
  const Clock::time_point end_;
  grpc::ByteBuffer answer_;  // only touched by the read chain
  std::mutex mu_;
  std::deque<Clock::time_point> sent_;  // written, not yet answered
  int64_t to_send_ = 0;
  bool writing_ = false;
  bool writes_done_ = false;
};

// The command line, checked.
struct LoadOptions {
  std::string url = "127.0.0.1:8001", model = "fashion_classifier", mode = "closed", cpus;
  int64_t rows = 1, concurrency = 1, max_outstanding = 4096, channels = 1;
  double seconds = 5, warmup = 1, rate = 1000;
};

// Parses and checks the options; the process's exit code when it should
// stop here (2 on a usage error, 0 after --help), else -1.
int ParseOptions(int argc, char** argv, LoadOptions& o) {
  numaserve::base::ArgParser parser("loadgen",
                                    "gRPC load generator (closed loop, open loop or streams).");
  parser.AddString("url", &o.url, "server HOST:PORT");
  parser.AddString("model", &o.model, "model name");
  parser.AddInt("rows", &o.rows, "rows per request (the input's first dimension)");
  parser.AddInt("batch", &o.rows, "same as --rows");
  parser.AddString("mode", &o.mode,
                   "closed (fixed concurrency) | open (fixed rate) | stream (closed loop over "
                   "ModelStreamInfer)");
  parser.AddInt("concurrency", &o.concurrency, "closed loop: callers, one request in flight each");
  parser.AddDouble("rate", &o.rate, "open loop: requests per second");
  parser.AddInt("max-outstanding", &o.max_outstanding,
                "open loop: requests in flight before sends are counted as dropped");
  parser.AddInt("channels", &o.channels,
                "gRPC channels (connections); calls are spread over them (bounded to 64)");
  parser.AddString("cpus", &o.cpus, "run the load generator only on these cpus, e.g. 0 or 0-1");
  parser.AddDouble("seconds", &o.seconds, "measured duration (bounded to 600)");
  parser.AddDouble("warmup-seconds", &o.warmup, "load before measuring (bounded to 60)");
  if (auto s = parser.Parse(std::vector<std::string>(argv + 1, argv + argc)); !s.ok()) {
    fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  if (o.mode != "closed" && o.mode != "open" && o.mode != "stream") {
    fprintf(stderr, "--mode must be closed, open or stream, not '%s'\n", o.mode.c_str());
    return 2;
  }
  if (o.rows < 1 || o.concurrency < 1 || o.rate <= 0 || o.max_outstanding < 1 || o.channels < 1) {
    fprintf(stderr,
            "--rows, --concurrency, --rate, --max-outstanding and --channels must be positive\n");
    return 2;
  }
  o.channels = std::min<int64_t>(o.channels, 64);
  o.seconds = std::clamp(o.seconds, 0.1, 600.0);
  o.warmup = std::clamp(o.warmup, 0.0, 60.0);
  return -1;
}

// Binds this process to `cpus` (before gRPC starts its threads: they
// inherit the mask); false after printing why.
bool BindToCpus(const std::string& cpus) {
  auto list = numaserve::affinity::ParseCpuList(cpus);
  if (!list.ok()) {
    fprintf(stderr, "--cpus: %s\n", std::string(list.status().message()).c_str());
    return false;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : *list) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    fprintf(stderr, "--cpus %s: cannot bind to these cpus\n", cpus.c_str());
    return false;
  }
  return true;
}

// One generic stub per channel, and a typed stub on the first channel.
void MakeStubs(const LoadOptions& o, std::vector<std::unique_ptr<grpc::GenericStub>>* stubs,
               std::unique_ptr<inference::GRPCInferenceService::Stub>* typed) {
  for (int64_t c = 0; c < o.channels; ++c) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    // Distinct arguments keep channels from sharing one connection.
    args.SetInt("numaserve.loadgen_channel", static_cast<int>(c));
    auto channel = grpc::CreateCustomChannel(o.url, grpc::InsecureChannelCredentials(), args);
    if (c == 0) *typed = inference::GRPCInferenceService::NewStub(channel);
    stubs->push_back(std::make_unique<grpc::GenericStub>(channel));
  }
}

// The request every call sends: the model's inputs (from ModelMetadata),
// `rows` rows where the first dimension is dynamic, random values. False
// after printing why when the metadata call fails.
bool MakeRequest(const LoadOptions& o, inference::GRPCInferenceService::Stub& typed,
                 inference::ModelInferRequest* request) {
  inference::ModelMetadataRequest meta_request;
  meta_request.set_name(o.model);
  inference::ModelMetadataResponse meta;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto s = typed.ModelMetadata(&ctx, meta_request, &meta);
  if (!s.ok()) {
    fprintf(stderr, "ModelMetadata: %s\n", s.error_message().c_str());
    return false;
  }
  request->set_model_name(o.model);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(0, 1);
  for (const auto& t : meta.inputs()) {
    auto* in = request->add_inputs();
    in->set_name(t.name());
    in->set_datatype(t.datatype());
    int64_t n = 1;
    for (int i = 0; i < t.shape_size(); ++i) {
      int64_t d = t.shape(i) < 0 ? (i == 0 ? o.rows : 1) : t.shape(i);
      in->add_shape(d);
      n *= d;
    }
    std::string* raw = request->add_raw_input_contents();
    raw->resize(static_cast<size_t>(n) * 4);
    for (int64_t i = 0; i < n; ++i) reinterpret_cast<float*>(raw->data())[i] = u(rng);
  }
  return true;
}

// What a run shares with its calls: the stubs, the request, the recorder,
// the calls in flight, and its times.
struct Run {
  const LoadOptions& o;
  std::vector<std::unique_ptr<grpc::GenericStub>>& stubs;
  const grpc::ByteBuffer& request_bytes;
  Recorder& recorder;
  InFlight& in_flight;
  Clock::time_point start, measure_from, end;
};

// `concurrency` requests in flight over min(channels, concurrency) streams.
void RunStreams(Run& run) {
  const int64_t concurrency = run.o.concurrency;
  const int64_t streams = std::min(run.o.channels, concurrency);
  for (int64_t c = 0; c < streams; ++c) {
    const int64_t window = concurrency / streams + (c < concurrency % streams ? 1 : 0);
    run.in_flight.Add();
    new StreamCaller(run.stubs[static_cast<size_t>(c)].get(), &run.request_bytes, window,
                     &run.recorder, &run.in_flight, run.end);
  }
  if (!run.in_flight.Wait(run.end + std::chrono::seconds(60))) {
    fprintf(stderr, "stream: %ld streams still open 60 s after the end\n", run.in_flight.count());
    _exit(1);
  }
}

// `concurrency` callers, each sending its next request when one returns.
void RunClosedLoop(Run& run) {
  std::vector<std::unique_ptr<Caller>> callers;
  for (int64_t c = 0; c < run.o.concurrency; ++c) {
    callers.push_back(
        std::make_unique<Caller>(run.stubs[static_cast<size_t>(c % run.o.channels)].get(),
                                 &run.request_bytes, &run.recorder, &run.in_flight, run.end));
  }
  for (auto& caller : callers) {
    run.in_flight.Add();
    caller->Send();
  }
  if (!run.in_flight.Wait(run.end + std::chrono::seconds(60))) {
    fprintf(stderr, "closed loop: %ld calls still unanswered 60 s after the end\n",
            run.in_flight.count());
    _exit(1);  // callers still referenced by gRPC: do not destroy them
  }
}

// Requests at a fixed rate whatever the answers; those beyond
// max_outstanding in flight are counted as dropped. Returns the drops.
int64_t RunOpenLoop(Run& run) {
  int64_t dropped = 0;
  const auto interval =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / run.o.rate));
  Recorder& recorder = run.recorder;
  InFlight& in_flight = run.in_flight;
  for (int64_t k = 0;; ++k) {
    const auto scheduled = run.start + interval * k;
    if (scheduled >= run.end) break;
    std::this_thread::sleep_until(scheduled);
    if (in_flight.count() >= run.o.max_outstanding) {
      if (scheduled >= run.measure_from) ++dropped;
      continue;
    }
    auto* call = new Call();
    call->sent = scheduled;
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    in_flight.Add();
    run.stubs[static_cast<size_t>(k % run.o.channels)]->UnaryCall(
        &call->ctx, kModelInfer, grpc::StubOptions(), &run.request_bytes, &call->response,
        [call, &recorder, &in_flight](grpc::Status s) {
          recorder.Record(call->sent, Clock::now(), s);
          delete call;
          in_flight.Done();
        });
  }
  if (!in_flight.Wait(Clock::now() + std::chrono::seconds(60))) {
    fprintf(stderr, "open loop: %ld calls still unanswered 60 s after the end\n",
            in_flight.count());
    _exit(1);
  }
  return dropped;
}

// The summary line, then the same figures as one JSON object.
void PrintResults(const LoadOptions& o, Recorder& recorder, int64_t dropped,
                  double cpu_us_per_request) {
  const std::string& mode = o.mode;
  std::vector<double>& lat = recorder.latencies();
  const double rps = static_cast<double>(lat.size()) / o.seconds;
  const double p50 = Percentile(lat, 0.50), p90 = Percentile(lat, 0.90),
               p99 = Percentile(lat, 0.99), p999 = Percentile(lat, 0.999);
  std::vector<double>& error_lat = recorder.error_latencies();
  const double error_p50 = Percentile(error_lat, 0.50), error_p99 = Percentile(error_lat, 0.99);
  const std::string load = mode != "open" ? "concurrency=" + std::to_string(o.concurrency)
                                          : "rate=" + std::to_string(static_cast<int64_t>(o.rate));
  printf(
      "model=%s rows=%ld mode=%s %s: %.0f req/s, %.0f rows/s, latency p50 %.3f ms p90 %.3f ms "
      "p99 %.3f ms p99.9 %.3f ms, errors %s, dropped %ld, client cpu %.1f us/req%s\n",
      o.model.c_str(), o.rows, mode.c_str(), load.c_str(), rps, rps * static_cast<double>(o.rows),
      p50, p90, p99, p999, recorder.ErrorSummary().c_str(), dropped, cpu_us_per_request,
      recorder.FirstErrors().c_str());
  printf(
      "{\"model\":\"%s\",\"rows\":%ld,\"mode\":\"%s\",\"concurrency\":%ld,\"rate\":%.1f,"
      "\"requests_per_second\":%.1f,\"rows_per_second\":%.1f,\"p50_ms\":%.4f,\"p90_ms\":%.4f,"
      "\"p99_ms\":%.4f,\"p999_ms\":%.4f,\"errors\":%ld,\"errors_by_code\":%s,"
      "\"error_p50_ms\":%.4f,\"error_p99_ms\":%.4f,\"dropped\":%ld,"
      "\"client_cpu_us_per_request\":%.2f}\n",
      o.model.c_str(), o.rows, mode.c_str(), mode != "open" ? o.concurrency : 0,
      mode == "open" ? o.rate : 0.0, rps, rps * static_cast<double>(o.rows), p50, p90, p99, p999,
      recorder.errors(), recorder.ErrorsJson().c_str(), error_p50, error_p99, dropped,
      cpu_us_per_request);
  fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  LoadOptions o;
  if (int code = ParseOptions(argc, argv, o); code >= 0) return code;
  if (!o.cpus.empty() && !BindToCpus(o.cpus)) return 2;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  std::unique_ptr<inference::GRPCInferenceService::Stub> typed;
  MakeStubs(o, &stubs, &typed);
  inference::ModelInferRequest request;
  if (!MakeRequest(o, *typed, &request)) return 1;
  const std::string serialized = request.SerializeAsString();
  grpc::Slice slice(serialized);
  const grpc::ByteBuffer request_bytes(&slice, 1);

  const double cpu_start = ProcessCpuSeconds();
  const auto start = Clock::now();
  const auto measure_from =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.warmup));
  const auto end = measure_from + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(o.seconds));
  Recorder recorder(measure_from);
  InFlight in_flight;
  Run run{o, stubs, request_bytes, recorder, in_flight, start, measure_from, end};
  int64_t dropped = 0;
  if (o.mode == "stream") {
    RunStreams(run);
  } else if (o.mode == "closed") {
    RunClosedLoop(run);
  } else {
    dropped = RunOpenLoop(run);
  }
  const double cpu_us_per_request = (ProcessCpuSeconds() - cpu_start) * 1e6 /
                                    static_cast<double>(std::max<int64_t>(1, recorder.answered()));
  PrintResults(o, recorder, dropped, cpu_us_per_request);
  return recorder.errors() == 0 && dropped == 0 ? 0 : 1;
}
