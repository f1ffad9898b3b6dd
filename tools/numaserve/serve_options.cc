// `numaserve serve`'s flags, by concern, and their checks (serve_options.h).
#include "tools/numaserve/serve_options.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model.h"
#include "serving/workers/input_copier.h"

namespace numaserve::cli {

using serving::GrpcAuth;

std::string HostOf(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return address;
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

absl::Status CheckRanges(absl::Span<const FlagRange> ranges) {
  for (const FlagRange& r : ranges) {
    if (r.value < r.low || r.value > r.high) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", r.flag, " must be between ", r.low, " and ", r.high, r.meaning, ", got ", r.value));
    }
  }
  return absl::OkStatus();
}

bool IsLocalOnly(const std::string& host) {
  if (host == "localhost") return true;
  // Parsed, not matched as text: "127.evil.example" is a name anyone may
  // point anywhere. inet_pton takes only the dotted quad.
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6) != 0;
  return false;
}

absl::Status CheckPrivateSocket(const std::string& address) {
  std::string path = address.substr(std::string("unix:").size());
  if (path.rfind("//", 0) == 0) path = path.substr(2);  // unix:///abs/path
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  struct stat st{};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--training-address ", address, ": no directory ", dir));
  }
  if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--training-address %s without authentication needs a directory only this server's "
        "user can enter, so that no other user can reach the socket: %s is mode %04o, owned by "
        "uid %d (e.g. mkdir -m 700 a directory of its own)",
        address, dir, st.st_mode & 07777, st.st_uid));
  }
  return absl::OkStatus();
}

std::string MetricsAddress(const ServeOptions& o) {
  return o.metrics_address.empty() ? absl::StrCat(o.host, ":", o.metrics_port) : o.metrics_address;
}

absl::Status CheckMetricsFlags(const ServeOptions& o) {
  const bool tls = !o.metrics_tls_cert.empty() || !o.metrics_tls_key.empty();
  const std::string host = HostOf(MetricsAddress(o));
  if (!o.metrics_auth_token_file.empty() && !tls && !IsLocalOnly(host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-auth-token-file needs --metrics-tls-cert and --metrics-tls-key when /metrics "
        "listens on ",
        host,
        ", which other machines can reach (a bearer token sent over plain HTTP can be read on "
        "the way); or listen on a loopback address (--metrics-address 127.0.0.1:PORT)"));
  }
  return absl::OkStatus();
}

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
      o.training_address.rfind("unix:", 0) == 0) {
    if (absl::Status s = CheckPrivateSocket(o.training_address); !s.ok()) return s;
  } else if (!o.training_address.empty() && !auth.authenticates() &&
             !IsLocalOnly(HostOf(o.training_address))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--training-address ", o.training_address,
        " is reachable from other machines: it needs authentication (--grpc-auth-token-file or "
        "--grpc-tls-client-ca), or use a loopback address such as 127.0.0.1"));
  }
  const FlagRange ranges[] = {
      {"training-max-ranks", o.training_max_ranks, 0, 65536, " (0: the NUMA domains)"},
      {"training-max-jobs", o.training_max_jobs, 1, 65536, ""},
      {"training-max-finished-jobs", o.training_max_finished_jobs, 0, 65536, ""},
      {"training-max-config-bytes", o.training_max_config_bytes, 1, int64_t{1} << 30, " (1 GiB)"},
  };
  return CheckRanges(ranges);
}

namespace {

void AddListenFlags(base::ArgParser& parser, ServeOptions& o) {
  parser.AddConfigFile("config",
                       "read options from FILE: one 'name: value' a line, names as the flags "
                       "without --, '#' comments; flags on the command line override it");
  parser.AddString("model-repository", &o.model_repository,
                   "directory of <model>/<version>/model.onnx");
  parser.AddString("host", &o.host, "address to listen on (0.0.0.0 for every interface)");
  parser.AddInt("grpc-port", &o.grpc_port, "gRPC port; 0 picks a free one");
  parser.AddInt("metrics-port", &o.metrics_port, "Prometheus /metrics port; 0 picks a free one");
  parser.AddInt("http-port", &o.http_port,
                "HTTP/REST port (KServe v2 REST, with the gRPC port's TLS and tokens); 0 picks a "
                "free one, -1 turns HTTP off");
  parser.AddInt("http-threads", &o.http_threads,
                "HTTP event-loop threads; connections are spread over them (no thread per "
                "connection)");
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
}

void AddPlacementFlags(base::ArgParser& parser, ServeOptions& o) {
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
  parser.AddString("frontend-cpus", &o.frontend_cpus,
                   "cpus for the front end (gRPC, HTTP, timers, metrics), taken out of the "
                   "workers' plan: none (it floats over every cpu) | auto (one core of each "
                   "package of 4 or more cores) | a cpu list, e.g. 0 or 0,64");
  parser.AddString("input-copy", &o.input_copy,
                   "which thread copies a batch's inputs into its worker's shared memory: "
                   "caller (the one that forms the batch) | node (a thread per worker on its "
                   "NUMA node: the front end's cpus there, else the worker's) | auto (node "
                   "with --frontend-cpus and workers on more than one NUMA node, else caller)");
  parser.AddInt("worker-arena-mb", &o.worker_arena_mb,
                "shared memory per worker for batch inputs and outputs");
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
}

void AddModelControlFlags(base::ArgParser& parser, ServeOptions& o) {
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
}

// Bounds on what clients can make the server hold.
void AddLimitFlags(base::ArgParser& parser, ServeOptions& o) {
  parser.AddInt("grpc-max-message-bytes", &o.grpc_max_message_bytes,
                "largest gRPC request or response; requests declaring bigger tensors are refused");
  parser.AddInt("max-queue-size", &o.max_queue_size,
                "queued requests per model version (when its config sets none) before "
                "RESOURCE_EXHAUSTED");
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
  parser.AddInt("max-activation-mb", &o.max_activation_mb,
                "activation memory one run of a model may need (when its config sets no "
                "max_activation_bytes); a batch needing more is refused with "
                "RESOURCE_EXHAUSTED; 0 = no limit");
}

void AddSecurityFlags(base::ArgParser& parser, ServeOptions& o) {
  parser.AddString("grpc-tls-cert", &o.grpc_tls_cert,
                   "PEM certificate chain: serve gRPC over TLS (with --grpc-tls-key)");
  parser.AddString("grpc-tls-key", &o.grpc_tls_key, "PEM private key of --grpc-tls-cert");
  parser.AddString("grpc-tls-client-ca", &o.grpc_tls_client_ca,
                   "PEM CA certificates: clients must present a certificate they signed (mTLS)");
  parser.AddString("grpc-auth-token-file", &o.grpc_auth_token_file,
                   "bearer tokens, one a line (\"NAME TOKEN\" or \"TOKEN\"): every call but the "
                   "grpc.health.v1 health checks needs 'authorization: Bearer <token>' "
                   "(needs TLS)");
  parser.AddString("metrics-tls-cert", &o.metrics_tls_cert,
                   "PEM certificate chain: serve /metrics over HTTPS only (with "
                   "--metrics-tls-key)");
  parser.AddString("metrics-tls-key", &o.metrics_tls_key, "PEM private key of --metrics-tls-cert");
  parser.AddString("metrics-auth-token-file", &o.metrics_auth_token_file,
                   "bearer tokens, one a line (as --grpc-auth-token-file): every /metrics "
                   "request needs 'Authorization: Bearer <token>', else 401 (needs "
                   "--metrics-tls-cert unless /metrics listens on a loopback address)");
}

void AddTrainingFlags(base::ArgParser& parser, ServeOptions& o) {
  parser.AddBool("training-service", &o.training_service,
                 "offer the training service (numaserve.training.TrainingService); its jobs run "
                 "processes and write files as this server's user");
  parser.AddString("training-address", &o.training_address,
                   "HOST:PORT of the training service's own gRPC port (port 0 picks one); empty "
                   "= the gRPC port, which then needs authentication");
  parser.AddString("training-root", &o.training_root,
                   "the directory every model, dataset, checkpoint and export path of a training "
                   "job must be inside (relative inputs are taken from it); each caller's outputs "
                   "go to its own callers/<id> there");
  parser.AddInt("training-max-ranks", &o.training_max_ranks,
                "most ranks (processes) one training job may run; 0 = the NUMA domains of "
                "this machine");
  parser.AddInt("training-max-jobs", &o.training_max_jobs, "most training jobs running at once");
  parser.AddInt("training-max-finished-jobs", &o.training_max_finished_jobs,
                "most ended training jobs whose status (and metrics) the server keeps; the "
                "oldest is forgotten first");
  parser.AddInt("training-max-config-bytes", &o.training_max_config_bytes,
                "largest training config a client may send");
}

}  // namespace

void AddServeFlags(base::ArgParser& parser, ServeOptions& o) {
  AddListenFlags(parser, o);
  AddPlacementFlags(parser, o);
  AddModelControlFlags(parser, o);
  AddLimitFlags(parser, o);
  AddSecurityFlags(parser, o);
  AddTrainingFlags(parser, o);
  serving::AddProcessFlags(parser, o.process, serving::kAllProcessFlags);
}

absl::Status CheckServeFlags(const ServeOptions& o) {
  if (!o.metrics_address.empty() && o.metrics_address.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-address expects HOST:PORT, got '", o.metrics_address, "'"));
  }
  // Every number a flag takes, within what the server can use it for:
  // durations that fit the clocks they are added to, sizes that fit the
  // types they are shifted and cast to.
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  constexpr int64_t kDaySeconds = 24 * 60 * 60;
  const FlagRange ranges[] = {
      {"grpc-port", o.grpc_port, 0, 65535, " (0: a free one)"},
      {"metrics-port", o.metrics_port, 0, 65535, " (0: a free one)"},
      {"http-port", o.http_port, -1, 65535, " (0: a free one; -1: off)"},
      {"http-threads", o.http_threads, 1, 64, ""},
      {"max-workers", o.max_workers, 0, 65536, " (0: one per domain)"},
      {"worker-arena-mb", o.worker_arena_mb, 1, int64_t{1} << 20, " (1 TiB)"},
      {"repository-poll-secs", o.repository_poll_secs, 1, kDaySeconds, " (24 hours)"},
      {"default-timeout-ms", o.default_timeout_ms, 1, kDaySeconds * 1000, " (24 hours)"},
      {"shutdown-timeout", o.shutdown_timeout_s, 0, kDaySeconds, " seconds (24 hours)"},
      {"grpc-max-message-bytes", o.grpc_max_message_bytes, 1024, kInt32Max, " (gRPC's limit)"},
      {"max-queue-size", o.max_queue_size, 1, kInt32Max, ""},
      {"max-inflight-bytes-mb", o.max_inflight_bytes_mb, 0, int64_t{1} << 30, " (0: no limit)"},
      {"max-stream-outstanding", o.max_stream_outstanding, 1, int64_t{1} << 20, ""},
      {"grpc-max-concurrent-streams", o.grpc_max_concurrent_streams, 1, int64_t{1} << 30, ""},
      {"grpc-memory-quota-mb", o.grpc_memory_quota_mb, 16, int64_t{1} << 30, ""},
      {"max-activation-mb", o.max_activation_mb, 0, int64_t{1} << 30, " (0: no limit)"},
      {"test-batch-compute-us", o.test_batch_compute_us, 0, 60'000'000, " (0: off)"},
  };
  if (absl::Status s = CheckRanges(ranges); !s.ok()) return s;
  if (absl::Status s = engine::CheckGemmBackendChoice(o.gemm); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--gemm: ", s.message()));
  }
  if (auto copy = serving::ParseInputCopy(o.input_copy); !copy.ok()) return copy.status();
  return absl::OkStatus();
}

}  // namespace numaserve::cli
