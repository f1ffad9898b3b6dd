// `numaserve serve`'s options: what its flags (or a --config file) set,
// the flags declared by concern (listening, placement, model control,
// limits, security, training) and their checks. serve_command.cc composes
// the server from them.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/args.h"
#include "serving/frontend/grpc_auth.h"
#include "serving/workers/process_options.h"

namespace numaserve::cli {

struct ServeOptions {
  std::string model_repository = "models";
  std::string host = "127.0.0.1";
  int64_t grpc_port = 8001;
  int64_t metrics_port = 8002;
  // The HTTP/REST port (KServe v2 REST), on --host; 0 picks a free one,
  // -1 turns it off.
  int64_t http_port = 8000;
  // HTTP event-loop threads (each serves its share of the connections).
  int64_t http_threads = 2;
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
  // Cpus for the front end, out of the workers' plan: none | auto | a cpu
  // list (affinity::ParseFrontendCpus).
  std::string frontend_cpus = "none";
  std::string input_copy = "auto";  // serving/workers/input_copier.h
  int64_t worker_arena_mb = 256;
  int64_t grpc_max_message_bytes = int64_t{64} << 20;
  int64_t max_queue_size = 4096;
  std::string model_control_mode = "none";
  int64_t repository_poll_secs = 15;
  std::string load_model;
  int64_t default_timeout_ms = 60000;
  int64_t shutdown_timeout_s = 30;
  std::string gemm = "auto";
  // gRPC security (serving/frontend/grpc_auth.h); on both gRPC ports.
  std::string grpc_tls_cert;
  std::string grpc_tls_key;
  std::string grpc_tls_client_ca;
  std::string grpc_auth_token_file;
  // The metrics endpoint's security (serving/observability/metrics_auth.h).
  std::string metrics_tls_cert;
  std::string metrics_tls_key;
  std::string metrics_auth_token_file;
  // The training service (serving/frontend/training_service.h): off unless asked for.
  bool training_service = false;
  std::string training_address;  // empty = the gRPC port (needs authentication)
  std::string training_root;
  int64_t training_max_ranks = 0;  // 0 = the NUMA domains of this machine
  int64_t training_max_jobs = 1;
  int64_t training_max_finished_jobs = 64;
  int64_t training_max_config_bytes = int64_t{1} << 20;
  // Instances per worker of models whose config.pbtxt sets none.
  std::string instances = "1";
  // Bounds on what clients can make the server hold.
  int64_t max_inflight_bytes_mb = 1024;
  int64_t max_stream_outstanding = 128;
  int64_t grpc_max_concurrent_streams = 256;
  int64_t grpc_memory_quota_mb = 2048;
  // Activation bytes one run of a model may need, when its config sets no
  // max_activation_bytes; 0 = no limit.
  int64_t max_activation_mb = 4096;
  // Scheduler tests: every batch takes at least this long in the worker.
  int64_t test_batch_compute_us = 0;
  // The ISA cap, the BLAS kernels, the GEMM cache, step profiling and the
  // training ops (their flags, defaults from the NUMASERVE_* variables):
  // the server's own, and every worker's and training job's.
  serving::ProcessOptions process;
};

// Declares every `serve` flag on PARSER, each writing its field of O.
void AddServeFlags(base::ArgParser& parser, ServeOptions& o);

// A numeric flag's value and the range it must lie in.
struct FlagRange {
  const char* flag;  // without "--"
  int64_t value;
  int64_t low;
  int64_t high;
  const char* meaning;  // appended to the range in the error: " (24 hours)"
};

// The first flag outside its range, as INVALID_ARGUMENT naming the flag,
// the range and the value: "--default-timeout-ms must be between 1 and
// 86400000 (24 hours), got -5".
absl::Status CheckRanges(absl::Span<const FlagRange> ranges);

// Each flag's value checked alone: every port, duration, size and limit in
// its range (docs/cli.md lists them), --metrics-address as HOST:PORT,
// --gemm a known backend. The training flags, which depend on the security
// in force, are CheckTrainingFlags'.
absl::Status CheckServeFlags(const ServeOptions& o);

// Where /metrics listens: --metrics-address, else --host:--metrics-port.
std::string MetricsAddress(const ServeOptions& o);

// The metrics flags against each other: a bearer token for /metrics needs
// HTTPS unless the endpoint listens on a loopback address. (The files
// themselves are MetricsAuth::Create's to check.)
absl::Status CheckMetricsFlags(const ServeOptions& o);

// The training flags against each other and the security in force: the
// service needs a root, and authentication unless it listens on a
// loopback address of its own.
absl::Status CheckTrainingFlags(const ServeOptions& o, const serving::GrpcAuth& auth);

// The host part of HOST:PORT or [V6]:PORT (without the brackets), or the
// whole of a unix:PATH address.
std::string HostOf(const std::string& address);

// Reachable from this machine only: "localhost", and loopback addresses as
// parsed IP addresses (127.0.0.0/8 in dotted-quad form, ::1). A name that
// merely begins with "127." is not.
bool IsLocalOnly(const std::string& host);

// A unix:PATH (or unix:///PATH) training address without authentication:
// PATH's directory must be owned by this process's user and grant group
// and others nothing, so that no other user can reach or replace the
// socket. INVALID_ARGUMENT saying what to do otherwise.
absl::Status CheckPrivateSocket(const std::string& address);

}  // namespace numaserve::cli
