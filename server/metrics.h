// Every Prometheus metric family numaserve exports, in one place, with units
// in the names. Served as text at http://HOST:PORT/metrics by prometheus-cpp.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
class Registry;
template <typename T>
class Family;
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace numaserve::server {

class Metrics {
 public:
  // Starts the HTTP exposer on `address` ("127.0.0.1:8002"; port 0 picks one).
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& address);
  ~Metrics();

  int port() const { return port_; }

  // One finished ModelInfer call. `outcome` is "success" or the gRPC status
  // name in lower case ("invalid_argument", "not_found", "unavailable", ...).
  void RecordRequest(const std::string& model, const std::string& outcome, double seconds);
  // One computed request of `rows` rows: time waiting for a worker, and in the engine.
  void RecordInference(const std::string& model, int64_t rows, double queue_seconds,
                       double compute_seconds);
  // A worker spent `seconds` computing `rows` rows (`flops` floating-point operations).
  void RecordWorkerBusy(int worker, int numa_node, double seconds, int64_t rows, double flops);
  void RecordWorkerRestart(int worker, int numa_node);
  void SetWorkerReady(int worker, int numa_node, bool ready);
  void SetModelReady(const std::string& model, const std::string& version, bool ready);
  void SetModelWeightBytes(const std::string& model, const std::string& version, int worker,
                           int numa_node, double bytes);

 private:
  Metrics() = default;
  int port_ = 0;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Histogram>* request_duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* inferences_ = nullptr;
  prometheus::Family<prometheus::Histogram>* queue_duration_ = nullptr;
  prometheus::Family<prometheus::Histogram>* compute_duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* worker_busy_ = nullptr;
  prometheus::Family<prometheus::Counter>* worker_inferences_ = nullptr;
  prometheus::Family<prometheus::Counter>* worker_flops_ = nullptr;
  prometheus::Family<prometheus::Counter>* worker_restarts_ = nullptr;
  prometheus::Family<prometheus::Gauge>* worker_ready_ = nullptr;
  prometheus::Family<prometheus::Gauge>* model_ready_ = nullptr;
  prometheus::Family<prometheus::Gauge>* model_weight_bytes_ = nullptr;
};

}  // namespace numaserve::server
