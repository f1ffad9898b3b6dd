#include "server/serve_command.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <signal.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "affinity/cpu_features.h"
#include "affinity/memory_bandwidth.h"
#include "affinity/placement.h"
#include "affinity/topology.h"
#include "base/errno_text.h"
#include "base/log.h"
#include "engine/model.h"
#include "engine/training/rank_binding.h"
#include "kernels/dispatch.h"
#include "server/args.h"
#include "server/clock.h"
#include "server/grpc_auth.h"
#include "server/inference_service.h"
#include "server/metrics.h"
#include "server/model_config.h"
#include "server/model_manager.h"
#include "server/model_repository.h"
#include "server/model_scheduler.h"
#include "server/training_service.h"
#include "server/version.h"
#include "server/worker_pool.h"
#include "server/worker_supervisor.h"

namespace numaserve::server {

using base::CurrentLogOptions;
using base::Log;
using base::LogBlock;
using base::LogFormat;
using base::LogLevel;

namespace {

struct ServeOptions {
  std::string model_repository = "models";
  std::string host = "127.0.0.1";
  int64_t grpc_port = 8001;
  int64_t metrics_port = 8002;
  // HOST:PORT of the metrics endpoint; empty = --host:--metrics-port.
  std::string metrics_address;
  // gRPC server reflection (grpcurl, Postman, grpcui list and call the API
  // without its .proto files).
  bool grpc_reflection = true;
  std::string log_format = "text";
  std::string log_level = "info";
  bool version = false;
  std::string domain = "numa";
  std::string topology;
  std::string cpuset;
  bool use_smt = false;
  bool measure_bandwidth = false;
  bool omp_spin = false;
  std::string omp_wait = "short";
  int64_t max_workers = 0;
  int64_t worker_arena_mb = 256;
  int64_t grpc_max_message_bytes = int64_t{64} << 20;
  int64_t max_queue_size = 4096;
  std::string model_control_mode = "none";
  int64_t repository_poll_secs = 15;
  std::string load_model;
  int64_t default_timeout_ms = 60000;
  int64_t shutdown_timeout_s = 30;
  std::string gemm = "auto";
  // gRPC security (server/grpc_auth.h); on both gRPC ports.
  std::string grpc_tls_cert;
  std::string grpc_tls_key;
  std::string grpc_tls_client_ca;
  std::string grpc_auth_token_file;
  // The training service (server/training_service.h): off unless asked for.
  bool training_service = false;
  std::string training_address;  // empty = the gRPC port (needs authentication)
  std::string training_root;
  int64_t training_max_ranks = 0;  // 0 = the NUMA domains of this machine
  int64_t training_max_jobs = 1;
  int64_t training_max_config_bytes = int64_t{1} << 20;
  // Instances per worker of models whose config.pbtxt sets none.
  std::string instances = "1";
  // Bounds on what clients can make the server hold.
  int64_t max_inflight_bytes_mb = 1024;
  int64_t max_stream_outstanding = 128;
  int64_t grpc_max_concurrent_streams = 256;
  int64_t grpc_memory_quota_mb = 2048;
  // Scheduler tests: every batch takes at least this long in the worker.
  int64_t test_batch_compute_us = 0;
};

// Runs `task` on a thread of its own every `period` until Stop() (or
// destruction); Stop() wakes it at once. Not started for a zero period.
class PeriodicTask {
 public:
  PeriodicTask(std::chrono::microseconds period, std::function<void()> task)
      : task_(std::move(task)) {
    if (period.count() > 0) thread_ = std::thread([this, period] { Loop(period); });
  }
  ~PeriodicTask() { Stop(); }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop(std::chrono::microseconds period) {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      lock.unlock();
      task_();
      lock.lock();
      cv_.wait_for(lock, period, [this] { return stopping_; });
    }
  }

  const std::function<void()> task_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

// Each worker's resident memory, from /proc/<pid>/statm.
void SampleResidentMemory(const WorkerSupervisor& workers, Metrics* metrics) {
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  for (int w = 0; w < workers.size(); ++w) {
    const pid_t pid = workers.Pid(w);
    if (pid <= 0) continue;
    FILE* f = fopen(absl::StrCat("/proc/", pid, "/statm").c_str(), "r");
    if (f == nullptr) continue;
    long size = 0, resident = 0;
    if (fscanf(f, "%ld %ld", &size, &resident) == 2) {
      metrics->SetWorkerResidentBytes(w, workers.placement(w).numa_node,
                                      static_cast<double>(resident) * page);
    }
    fclose(f);
  }
}

// systemd's watchdog (WatchdogSec= in the unit, WATCHDOG_USEC in the
// environment): the ping period, half of systemd's, or 0 when the watchdog
// is off. The pings go out for as long as the probe before each returns, so
// a server stuck on the locks the probe takes stops them and systemd
// restarts the service.
std::chrono::microseconds SystemdWatchdogPeriod() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return std::chrono::microseconds(0);
  const auto period = std::chrono::microseconds(std::max<uint64_t>(usec / 2, 1000));
  Log(LogLevel::kInfo, "serve",
      absl::StrFormat("systemd watchdog: a ping every %.3f s",
                      static_cast<double>(period.count()) / 1e6),
      {{"watchdog_period_s", static_cast<double>(period.count()) / 1e6}});
  return period;
}

// Takes gRPC's reflection plugin ("proto_server_reflection") out of a
// ServerBuilder: linking grpc++_reflection registers it for every builder
// (a static initializer), so --grpc-reflection=false removes it again.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return p->name().find("reflection") != std::string::npos;
                                  }),
                   plugins->end());
  }
};

// Start-up failed: the reason, then exit code 1.
int Fail(const absl::Status& status) {
  if (CurrentLogOptions().format == LogFormat::kText) {
    fprintf(stderr, "numaserve serve: %s\n", std::string(status.message()).c_str());
  } else {
    Log(LogLevel::kError, "serve", status.message());
  }
  return 1;
}

// Sets the log format and level from the flags.
absl::Status ConfigureLogFromFlags(const std::string& format_name, const std::string& level_name) {
  auto format = base::ParseLogFormat(format_name);
  if (!format.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log-format: ", format.status().message()));
  }
  auto level = base::ParseLogLevel(level_name);
  if (!level.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log-level: ", level.status().message()));
  }
  base::ConfigureLog({.format = *format, .level = *level});
  return absl::OkStatus();
}

// The host part of HOST:PORT, [V6]:PORT or unix:PATH (the whole string).
std::string HostOf(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return address;
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

// Reachable from this machine only: loopback addresses and Unix sockets.
bool IsLocalOnly(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1" ||
         host.rfind("unix:", 0) == 0;
}

// Checks the training flags against each other and the security in force.
absl::Status CheckTrainingFlags(const ServeOptions& o, const GrpcAuth& auth) {
  if (!o.training_service) {
    if (!o.training_address.empty() || !o.training_root.empty()) {
      return absl::InvalidArgumentError(
          "--training-address and --training-root need --training-service");
    }
    return absl::OkStatus();
  }
  if (o.training_root.empty()) {
    return absl::InvalidArgumentError(
        "--training-service needs --training-root DIR: every file a job reads or writes must be "
        "inside it");
  }
  if (o.training_address.empty() && !auth.authenticates()) {
    return absl::InvalidArgumentError(
        "--training-service on the gRPC port needs authentication (--grpc-auth-token-file or "
        "--grpc-tls-client-ca); or give it a loopback address of its own, e.g. "
        "--training-address 127.0.0.1:8003");
  }
  if (!o.training_address.empty() && !auth.authenticates() &&
      !IsLocalOnly(HostOf(o.training_address))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--training-address ", o.training_address,
        " is reachable from other machines: it needs authentication (--grpc-auth-token-file or "
        "--grpc-tls-client-ca), or use a loopback address such as 127.0.0.1"));
  }
  if (o.training_max_ranks < 0 || o.training_max_jobs < 1 || o.training_max_config_bytes < 1) {
    return absl::InvalidArgumentError(
        "--training-max-ranks must be 0 (auto) or more, --training-max-jobs and "
        "--training-max-config-bytes at least 1");
  }
  return absl::OkStatus();
}

}  // namespace

int ServeCommand(const std::vector<std::string>& args) {
  ServeOptions o;
  ArgParser parser("serve", "Serve the models of a repository over gRPC (KServe v2).");
  parser.AddConfigFile("config",
                       "read options from FILE: one 'name: value' a line, names as the flags "
                       "without --, '#' comments; flags on the command line override it");
  parser.AddString("model-repository", &o.model_repository,
                   "directory of <model>/<version>/model.onnx");
  parser.AddString("host", &o.host, "address to listen on (0.0.0.0 for every interface)");
  parser.AddInt("grpc-port", &o.grpc_port, "gRPC port; 0 picks a free one");
  parser.AddInt("metrics-port", &o.metrics_port, "Prometheus /metrics port; 0 picks a free one");
  parser.AddString("metrics-address", &o.metrics_address,
                   "HOST:PORT of the Prometheus /metrics endpoint, instead of --host and "
                   "--metrics-port (port 0 picks a free one)");
  parser.AddBool("grpc-reflection", &o.grpc_reflection,
                 "offer gRPC server reflection (grpc.reflection.v1alpha), so grpcurl and similar "
                 "tools list and call the API; --grpc-reflection=false hides it");
  parser.AddString("log-format", &o.log_format,
                   "text (\"numaserve: ...\" lines) | json (one object a line: ts, level, "
                   "component, msg and fields)");
  parser.AddString("log-level", &o.log_level, "least level logged: debug | info | warning | error");
  parser.AddBool("version", &o.version,
                 "print the version, git revision and dispatched ISA, and exit");
  parser.AddString("domain", &o.domain, "one worker per: numa | package | l3 | core");
  parser.AddString("topology", &o.topology,
                   "plan for an hwloc synthetic topology or XML file instead of this machine");
  parser.AddString("cpuset", &o.cpuset, "use only these cpus, e.g. 0-7");
  parser.AddBool("use-smt", &o.use_smt, "give workers the SMT siblings of their cores too");
  parser.AddBool("measure-bandwidth", &o.measure_bandwidth,
                 "measure each NUMA node's memory bandwidth at start (STREAM triad on its "
                 "workers' cpus, ~1 s and up to 512 MiB per node) for "
                 "numaserve_memory_bandwidth_bytes_per_second");
  parser.AddString("omp-wait", &o.omp_wait,
                   "how idle OpenMP threads wait: passive (sleep at once) | short (spin ~25 us, "
                   "then sleep) | spin (spin ~1 ms: only when workers' cores are not shared with "
                   "the front end or other processes)");
  parser.AddBool("omp-spin", &o.omp_spin, "the same as --omp-wait spin");
  parser.AddInt("max-workers", &o.max_workers, "at most this many workers (0: one per domain)");
  parser.AddInt("worker-arena-mb", &o.worker_arena_mb,
                "shared memory per worker for batch inputs and outputs");
  parser.AddInt("grpc-max-message-bytes", &o.grpc_max_message_bytes,
                "largest gRPC request or response; requests declaring bigger tensors are refused");
  parser.AddInt("max-queue-size", &o.max_queue_size,
                "queued requests per model version (when its config sets none) before "
                "RESOURCE_EXHAUSTED");
  parser.AddString("model-control-mode", &o.model_control_mode,
                   "none (load all at start) | poll (follow the repository's changes) | "
                   "explicit (RepositoryModelLoad / RepositoryModelUnload)");
  parser.AddInt("repository-poll-secs", &o.repository_poll_secs,
                "poll mode: seconds between reads of the repository");
  parser.AddString("load-model", &o.load_model,
                   "explicit mode: models to load at start-up, comma-separated");
  parser.AddInt("default-timeout-ms", &o.default_timeout_ms,
                "deadline for requests whose client sets none");
  parser.AddInt("shutdown-timeout", &o.shutdown_timeout_s,
                "seconds SIGTERM waits for accepted requests to finish");
  parser.AddInt("max-inflight-bytes-mb", &o.max_inflight_bytes_mb,
                "accepted, unanswered inferences (inputs + outputs) the server holds before "
                "refusing more with RESOURCE_EXHAUSTED; 0 = no limit");
  parser.AddInt("max-stream-outstanding", &o.max_stream_outstanding,
                "requests one ModelStreamInfer stream may have unanswered; the server stops "
                "reading it (flow control holds the client) until answers are written");
  parser.AddInt("grpc-max-concurrent-streams", &o.grpc_max_concurrent_streams,
                "calls one client connection may have open at once (HTTP/2 streams)");
  parser.AddInt("grpc-memory-quota-mb", &o.grpc_memory_quota_mb,
                "memory gRPC may use for connections and messages in flight (ResourceQuota)");
  parser.AddString("instances", &o.instances,
                   "instances per worker of models whose config.pbtxt sets no "
                   "instance_placement.instances_per_domain: N | auto (measure the model's "
                   "scaling at load and pick the most throughput) | per_core (one per core)");
  parser.AddInt("test-batch-compute-us", &o.test_batch_compute_us,
                "for scheduler tests: every batch takes at least this many microseconds in its "
                "worker (the worker sleeps out the rest); 0 = off");
  parser.AddString("gemm", &o.gemm,
                   "GEMM backend for models whose config names none: onednn | blis | openblas | "
                   "numaserve (the own AVX2 kernel) | "
                   "auto (each timed once per shape at load, the fastest kept)");
  parser.AddString("grpc-tls-cert", &o.grpc_tls_cert,
                   "PEM certificate chain: serve gRPC over TLS (with --grpc-tls-key)");
  parser.AddString("grpc-tls-key", &o.grpc_tls_key, "PEM private key of --grpc-tls-cert");
  parser.AddString("grpc-tls-client-ca", &o.grpc_tls_client_ca,
                   "PEM CA certificates: clients must present a certificate they signed (mTLS)");
  parser.AddString("grpc-auth-token-file", &o.grpc_auth_token_file,
                   "bearer tokens, one a line (\"NAME TOKEN\" or \"TOKEN\"): every call but the "
                   "grpc.health.v1 health checks needs 'authorization: Bearer <token>' "
                   "(needs TLS)");
  parser.AddBool("training-service", &o.training_service,
                 "offer the training service (numaserve.training.TrainingService); its jobs run "
                 "processes and write files as this server's user");
  parser.AddString("training-address", &o.training_address,
                   "HOST:PORT of the training service's own gRPC port (port 0 picks one); empty "
                   "= the gRPC port, which then needs authentication");
  parser.AddString("training-root", &o.training_root,
                   "the directory every model, dataset, checkpoint and export path of a training "
                   "job must be inside (relative paths are taken from it)");
  parser.AddInt("training-max-ranks", &o.training_max_ranks,
                "most ranks (processes) one training job may run; 0 = the NUMA domains of "
                "this machine");
  parser.AddInt("training-max-jobs", &o.training_max_jobs, "most training jobs running at once");
  parser.AddInt("training-max-config-bytes", &o.training_max_config_bytes,
                "largest training config a client may send");
  const absl::Status parsed = parser.Parse(args);
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  // Even a parse error is reported in the format asked for, if it was read.
  if (absl::Status s = ConfigureLogFromFlags(o.log_format, o.log_level); !s.ok()) return Fail(s);
  if (!parsed.ok()) return Fail(parsed);
  if (o.version) {
    printf("%s\n", VersionText().c_str());
    return 0;
  }
  if (!o.metrics_address.empty() && o.metrics_address.rfind(':') == std::string::npos) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--metrics-address expects HOST:PORT, got '", o.metrics_address, "'")));
  }
  if (o.grpc_port < 0 || o.grpc_port > 65535 || o.metrics_port < 0 || o.metrics_port > 65535) {
    return Fail(absl::InvalidArgumentError("ports must be between 0 and 65535"));
  }
  if (o.grpc_max_message_bytes < 1024 || o.max_queue_size < 1) {
    return Fail(absl::InvalidArgumentError(
        "--grpc-max-message-bytes must be at least 1024 and --max-queue-size at least 1"));
  }
  if (o.worker_arena_mb < 1) {
    return Fail(absl::InvalidArgumentError("--worker-arena-mb must be at least 1"));
  }
  auto default_instances = ParseInstances(o.instances);
  if (!default_instances.ok()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--instances: ", default_instances.status().message())));
  }
  if (o.max_inflight_bytes_mb < 0 || o.max_inflight_bytes_mb > (int64_t{1} << 30) ||
      o.max_stream_outstanding < 1 || o.grpc_max_concurrent_streams < 1 ||
      o.grpc_max_concurrent_streams > (int64_t{1} << 30) || o.grpc_memory_quota_mb < 16 ||
      o.grpc_memory_quota_mb > (int64_t{1} << 30)) {
    return Fail(absl::InvalidArgumentError(
        "--max-inflight-bytes-mb must be 0 or more, --max-stream-outstanding and "
        "--grpc-max-concurrent-streams at least 1, --grpc-memory-quota-mb at least 16"));
  }
  if (o.test_batch_compute_us < 0 || o.test_batch_compute_us > 60'000'000) {
    return Fail(absl::InvalidArgumentError("--test-batch-compute-us must be 0..60000000"));
  }
  if (absl::Status s = engine::CheckGemmBackendChoice(o.gemm); !s.ok()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--gemm: ", s.message())));
  }
  auto auth = GrpcAuth::Create({.tls_cert_file = o.grpc_tls_cert,
                                .tls_key_file = o.grpc_tls_key,
                                .tls_client_ca_file = o.grpc_tls_client_ca,
                                .token_file = o.grpc_auth_token_file});
  if (!auth.ok()) return Fail(auth.status());
  if (absl::Status s = CheckTrainingFlags(o, **auth); !s.ok()) return Fail(s);

  // SIGINT/SIGTERM are taken by sigwait below; block them before any thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // 1. The machine and the plan.
  auto topology = affinity::DiscoverTopology({o.topology, o.cpuset});
  if (!topology.ok()) return Fail(topology.status());
  auto domain = affinity::ParseDomain(o.domain);
  if (!domain.ok()) return Fail(domain.status());
  affinity::PlacementOptions placement;
  placement.domain = *domain;
  placement.use_smt = o.use_smt;
  auto omp_wait = affinity::ParseOmpWait(o.omp_spin ? "spin" : o.omp_wait);
  if (!omp_wait.ok()) return Fail(omp_wait.status());
  placement.omp_wait = *omp_wait;
  placement.max_workers = static_cast<int>(o.max_workers);
  auto plan = affinity::MakePlan(*topology, placement);
  if (!plan.ok()) return Fail(plan.status());
  Log(LogLevel::kInfo, "serve", absl::StrCat("starting ", VersionText()),
      {{"version", BuildVersion()}, {"revision", BuildRevision()}});
  LogBlock(LogLevel::kInfo, "placement", affinity::FormatReport(*topology, *plan));

  // 2. The models.
  auto repository =
      ModelRepository::Open(o.model_repository, static_cast<int>(plan->workers.size()));
  if (!repository.ok()) return Fail(repository.status());
  auto control_mode = ParseModelControlMode(o.model_control_mode);
  if (!control_mode.ok()) return Fail(control_mode.status());
  if (o.repository_poll_secs < 1) {
    return Fail(absl::InvalidArgumentError("--repository-poll-secs must be at least 1"));
  }
  // Explicit mode starts with the models --load-model names only.
  const std::vector<std::string> load_first = absl::StrSplit(o.load_model, ',', absl::SkipEmpty());
  std::vector<RepositoryModel> initial;
  std::vector<std::string> not_loaded;
  for (const auto& m : (*repository)->models()) {
    if (*control_mode == ModelControlMode::kExplicit &&
        std::find(load_first.begin(), load_first.end(), m.name) == load_first.end()) {
      if (not_loaded.empty() || not_loaded.back() != m.name) not_loaded.push_back(m.name);
      continue;
    }
    initial.push_back(m);
  }
  std::vector<WorkerSupervisor::ModelToLoad> to_load;
  for (const auto& m : initial) {
    if (m.error.empty()) {
      to_load.push_back(ModelToLoadFor(m, *default_instances, o.gemm));
      Log(LogLevel::kInfo, "serve",
          absl::StrFormat("model %s version %d: %s", m.name, m.version, m.path),
          {{"model", m.name}, {"version", m.version}, {"path", m.path}});
    } else {
      Log(LogLevel::kError, "serve",
          absl::StrFormat("model %s is not available: %s", m.name, m.error),
          {{"model", m.name}, {"error", m.error}});
    }
  }

  // 3. Metrics, workers, router.
  const std::string metrics_address =
      o.metrics_address.empty() ? absl::StrCat(o.host, ":", o.metrics_port) : o.metrics_address;
  auto metrics = Metrics::Create(metrics_address);
  if (!metrics.ok()) return Fail(metrics.status());
  // The training service (server/training_service.h): jobs run as child
  // `numaserve train` processes. Only with --training-service: on its own
  // port (--training-address) or, with authentication, on the gRPC port.
  std::unique_ptr<TrainingService> training_service;
  if (o.training_service) {
    int max_ranks = static_cast<int>(o.training_max_ranks);
    if (max_ranks == 0) {
      absl::StatusOr<int> domains = training::AutoRankCount();
      if (!domains.ok()) return Fail(domains.status());
      max_ranks = *domains;
    }
    const GrpcAuth* auth_ptr = auth->get();
    TrainingServiceOptions training_options;
    training_options.root = o.training_root;
    training_options.max_ranks = max_ranks;
    training_options.max_jobs = static_cast<int>(o.training_max_jobs);
    training_options.max_config_bytes = static_cast<size_t>(o.training_max_config_bytes);
    training_options.caller = [auth_ptr](const grpc::ServerContextBase& c) {
      return auth_ptr->Caller(c);
    };
    training_options.authenticated = auth_ptr->authenticates();
    training_options.metrics = metrics->get();
    auto created = TrainingService::Create(std::move(training_options));
    if (!created.ok()) return Fail(created.status());
    training_service = std::move(*created);
  }
  // The supervisor's cue (a worker became ready or was lost) reaches the
  // scheduler and the health status through this hook, set once both exist.
  std::atomic<std::function<void()>*> on_workers_changed{nullptr};
  WorkerSupervisor::Options worker_options;
  worker_options.arena_bytes = static_cast<size_t>(o.worker_arena_mb) << 20;
  worker_options.test_batch_compute_us = o.test_batch_compute_us;
  auto workers = WorkerSupervisor::Create(worker_options, *plan, to_load, metrics->get(), [&] {
    if (auto* hook = on_workers_changed.load()) (*hook)();
  });
  if (!workers.ok()) return Fail(workers.status());
  SupervisedWorkerPool pool(workers->get());
  ModelStatistics statistics;
  ModelScheduler::Options scheduler_options;
  scheduler_options.default_max_queue_size = static_cast<size_t>(o.max_queue_size);
  scheduler_options.statistics = &statistics;
  ModelScheduler scheduler(scheduler_options, &pool, metrics->get(), Clock::Real());
  scheduler.Start();
  std::function<void()> pump_scheduler = [&] { scheduler.Pump(); };
  on_workers_changed = &pump_scheduler;
  const double peak_per_core = kernels::Fp32PeakGflopsPerCore();
  const affinity::PeakFlops& peaks = affinity::GetPeakFlops();
  for (const auto& p : plan->workers) {
    (*metrics)->SetWorkerPeak(p.index, p.numa_node, peak_per_core * p.num_threads);
    if (kernels::GetBf16Support().native && peaks.peak_bf16_gflops_per_core > 0) {
      (*metrics)->SetWorkerPeakFlops(p.index, p.numa_node, "bf16",
                                     peaks.peak_bf16_gflops_per_core * p.num_threads * 1e9);
    }
    if (peaks.peak_int8_gops_per_core > 0) {
      (*metrics)->SetWorkerPeakFlops(p.index, p.numa_node, "int8",
                                     peaks.peak_int8_gops_per_core * p.num_threads * 1e9);
    }
  }
  if (o.measure_bandwidth) {
    // Before the workers start, on the cpus each node's workers will use.
    std::map<int, std::vector<int>> node_cpus;
    for (const auto& p : plan->workers) {
      std::vector<int>& cpus = node_cpus[std::max(p.numa_node, 0)];
      cpus.insert(cpus.end(), p.cpus.begin(), p.cpus.end());
    }
    for (const auto& [node, cpus] : node_cpus) {
      affinity::BandwidthOptions probe;
      probe.cpus = cpus;
      absl::StatusOr<affinity::BandwidthResult> r = affinity::MeasureMemoryBandwidth(probe);
      if (!r.ok()) {
        Log(LogLevel::kWarning, "serve",
            absl::StrCat("NUMA node ", node,
                         ": memory bandwidth not measured: ", r.status().message()));
        continue;
      }
      (*metrics)->SetMemoryBandwidth(node, r->gb_per_second * 1e9);
      Log(LogLevel::kInfo, "serve",
          absl::StrFormat("NUMA node %d: memory bandwidth %.1f GB/s (triad, %d threads, %d MiB)",
                          node, r->gb_per_second, r->threads,
                          static_cast<int>(r->bytes_per_pass >> 20)));
    }
  }
  PeriodicTask rss_sampler(std::chrono::seconds(1), [workers = workers->get(), m = metrics->get()] {
    SampleResidentMemory(*workers, m);
  });
  (*workers)->Start(std::chrono::minutes(5));
  ModelManager::Options manager_options;
  manager_options.repository = o.model_repository;
  manager_options.num_workers = static_cast<int>(plan->workers.size());
  manager_options.mode = *control_mode;
  manager_options.poll_interval = std::chrono::seconds(o.repository_poll_secs);
  manager_options.default_instances = *default_instances;
  manager_options.default_gemm_backend = o.gemm;
  ModelManager models(manager_options, workers->get(), &scheduler, metrics->get());
  models.Start(initial, not_loaded);
  for (const auto& m : initial) {
    bool ready = m.error.empty() && (*workers)->ModelAvailable(m.key());
    (*metrics)->SetModelReady(m.name, absl::StrCat(m.version), ready);
    if (m.error.empty() && !ready) {
      const std::string error = (*workers)->LoadError(m.key());
      Log(LogLevel::kError, "serve", absl::StrFormat("model %s failed to load: %s", m.name, error),
          {{"model", m.name}, {"version", m.version}, {"error", error}});
    }
  }

  // 4. gRPC.
  InferenceService::Options service_options;
  service_options.default_timeout = std::chrono::milliseconds(o.default_timeout_ms);
  service_options.max_message_bytes = static_cast<size_t>(o.grpc_max_message_bytes);
  service_options.statistics = &statistics;
  service_options.default_max_queue_size = static_cast<size_t>(o.max_queue_size);
  service_options.max_inflight_bytes = static_cast<size_t>(o.max_inflight_bytes_mb) << 20;
  service_options.max_stream_outstanding = o.max_stream_outstanding;
  InferenceService service(service_options, &models, workers->get(), &scheduler, metrics->get());
  grpc::EnableDefaultHealthCheckService(true);
  // Reflection describes every service a builder registers (the
  // inference, health and training services) to tools such as grpcurl.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!o.grpc_reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  int grpc_port = 0;
  builder.AddListeningPort(absl::StrCat(o.host, ":", o.grpc_port), (*auth)->ServerCredentials(),
                           &grpc_port);
  const int max_message = static_cast<int>(
      std::min<int64_t>(o.grpc_max_message_bytes, std::numeric_limits<int>::max()));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  // What one client can hold: memory for connections and messages, calls
  // per connection, and idle or silent connections closed.
  grpc::ResourceQuota quota("numaserve-grpc");
  quota.Resize(static_cast<size_t>(o.grpc_memory_quota_mb) << 20);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(o.grpc_max_concurrent_streams));
  // Ping a silent client every 60 s, drop it if it does not answer in 20 s;
  // a client may not ping more often than every 10 s without data.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 15 * 60'000);
  // Every gRPC service the server offers is registered here.
  builder.RegisterService(&service);
  // The training service (made above): on the gRPC port, or on its own port below.
  if (training_service != nullptr && o.training_address.empty()) {
    builder.RegisterService(training_service.get());
  }
  std::unique_ptr<grpc::Server> training_server;
  int training_port = 0;
  if (training_service != nullptr && !o.training_address.empty()) {
    grpc::ServerBuilder training_builder;
    if (!o.grpc_reflection) training_builder.SetOption(std::make_unique<WithoutReflection>());
    training_builder.AddListeningPort(o.training_address, (*auth)->ServerCredentials(),
                                      &training_port);
    // Configs are small; nothing bigger is read on this port.
    training_builder.SetMaxReceiveMessageSize(static_cast<int>(
        std::min<int64_t>(o.training_max_config_bytes + 65536, std::numeric_limits<int>::max())));
    training_builder.RegisterService(training_service.get());
    training_server = training_builder.BuildAndStart();
    if (!training_server || training_port == 0) {
      return Fail(absl::UnavailableError(
          absl::StrCat("cannot listen for training on --training-address ", o.training_address)));
    }
  }
  // --- end training service
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || grpc_port == 0) {
    return Fail(absl::UnavailableError(
        absl::StrCat("cannot listen for gRPC on ", o.host, ":", o.grpc_port)));
  }
  Log(LogLevel::kInfo, "serve", absl::StrCat("gRPC security: ", (*auth)->Describe()),
      {{"security", (*auth)->Describe()}, {"reflection", o.grpc_reflection}});
  if (!(*auth)->tls() && !IsLocalOnly(o.host)) {
    Log(LogLevel::kWarning, "serve",
        absl::StrFormat("gRPC on %s is plaintext and unauthenticated: anyone who reaches it may "
                        "infer and manage models (see --grpc-tls-cert, --grpc-auth-token-file)",
                        o.host),
        {{"host", o.host}});
  }
  // Where the training service listens: HOST:PORT, or unix:PATH.
  std::string training_where;
  if (training_server != nullptr) {
    training_where = o.training_address.rfind("unix:", 0) == 0
                         ? o.training_address
                         : absl::StrCat(o.training_address.substr(0, o.training_address.rfind(':')),
                                        ":", training_port);
  } else if (training_service != nullptr) {
    training_where = absl::StrCat(o.host, ":", grpc_port);
  }
  if (training_service != nullptr) {
    Log(LogLevel::kInfo, "serve",
        absl::StrCat("training service on ", training_where,
                     training_server == nullptr ? " (the gRPC port)" : "", ", files under ",
                     o.training_root),
        {{"training_address", training_where}, {"training_root", o.training_root}});
  }
  // Health follows readiness: NOT_SERVING while no worker is ready.
  std::mutex health_mu;
  bool health_serving = false;
  std::function<void()> update_health = [&] {
    std::lock_guard<std::mutex> lock(health_mu);
    bool ready = service.Ready();
    if (ready == health_serving) return;
    health_serving = ready;
    server->GetHealthCheckService()->SetServingStatus(ready);
  };
  // Register the inference service's own name too; SetServingStatus(bool)
  // then keeps every registered name in step.
  server->GetHealthCheckService()->SetServingStatus(
      inference::GRPCInferenceService::service_full_name(), false);
  server->GetHealthCheckService()->SetServingStatus(false);
  update_health();
  std::function<void()> on_change = [&] {
    scheduler.Pump();
    update_health();
  };
  on_workers_changed = &on_change;

  // The one line scripts wait for.
  // With the training service: " training=HOST:PORT" (the gRPC port's own
  // address when it shares it).
  const std::string training_line =
      training_where.empty() ? "" : absl::StrCat(" training=", training_where);
  const std::string metrics_host = metrics_address.substr(0, metrics_address.rfind(':'));
  printf("grpc=%s:%d metrics=%s:%d%s\n", o.host.c_str(), grpc_port, metrics_host.c_str(),
         (*metrics)->port(), training_line.c_str());
  fflush(stdout);
  Log(LogLevel::kInfo, "serve",
      absl::StrFormat("serving: grpc=%s:%d metrics=%s:%d%s", o.host, grpc_port, metrics_host,
                      (*metrics)->port(), training_line),
      {{"grpc_address", absl::StrCat(o.host, ":", grpc_port)},
       {"metrics_address", absl::StrCat(metrics_host, ":", (*metrics)->port())}});
  // Under systemd (Type=notify): ready once the initial models are loaded
  // and both ports listen; a no-op without NOTIFY_SOCKET.
  sd_notifyf(0, "READY=1\nSTATUS=serving: grpc=%s:%d metrics=%s:%d", o.host.c_str(), grpc_port,
             metrics_host.c_str(), (*metrics)->port());
  // The probe: readiness, through the worker supervisor's locks.
  PeriodicTask watchdog(SystemdWatchdogPeriod(), [&] {
    (void)service.Ready();
    sd_notify(0, "WATCHDOG=1");
  });

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  Log(LogLevel::kInfo, "serve",
      absl::StrCat(base::SignalText(signal_number), " received, draining"),
      {{"signal", signal_number}});
  sd_notify(0, "STOPPING=1\nSTATUS=draining");

  // Stop taking work, finish what was accepted, then stop the workers.
  service.SetShuttingDown();
  // Training jobs stop after their current step with a checkpoint
  // (training_service.h); ~TrainingService waits for them.
  if (training_service != nullptr) training_service->StopAll();
  on_workers_changed = &pump_scheduler;
  {
    std::lock_guard<std::mutex> lock(health_mu);
    server->GetHealthCheckService()->SetServingStatus(false);
  }
  // Every accepted call (unary or read on a stream) is answered before gRPC
  // stops, and every stream ends once its requests are answered; calls
  // arriving meanwhile are refused UNAVAILABLE by the service. A load or
  // unload under way finishes and is answered.
  const auto drain_deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(o.shutdown_timeout_s);
  if (!service.WaitUntilIdle(drain_deadline, std::chrono::milliseconds(100))) {
    Log(LogLevel::kWarning, "serve", "accepted requests still running after --shutdown-timeout");
  }
  service.StopLifecycle();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (training_server != nullptr) {
    training_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  models.Stop();
  scheduler.Stop();
  rss_sampler.Stop();
  on_workers_changed = nullptr;
  (*workers)->Stop();
  watchdog.Stop();
  Log(LogLevel::kInfo, "serve", "stopped");
  return 0;
}

}  // namespace numaserve::server
