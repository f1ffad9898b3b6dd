// Internal to the gRPC front end: one training job as the training service
// runs it (training_service.cc): the `numaserve train` child's private
// directory, its output read back into TrainingProgress, the metrics and
// log records it makes, and stopping it. Not part of the front end's API;
// nothing outside serving/frontend includes it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/log.h"
#include "base/mutex.h"
#include "training.pb.h"

namespace numaserve::serving {

class Metrics;

// A job's private directory (mkdtemp: a fresh name, mode 0700) and the
// config file in it; both are removed by Remove() or the destructor.
class PrivateDir {
 public:
  // Makes <parent>/numaserve-training-XXXXXX and writes `config` into it
  // as job.cfg (0600, O_EXCL | O_NOFOLLOW).
  static absl::StatusOr<std::unique_ptr<PrivateDir>> Create(const std::string& parent,
                                                            const std::string& config);
  ~PrivateDir() { Remove(); }

  std::string config_path() const { return dir_ + "/job.cfg"; }
  void Remove() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit PrivateDir(std::string dir) : dir_(std::move(dir)) {}
  const std::string dir_;
  base::Mutex mu_;
  bool removed_ ABSL_GUARDED_BY(mu_) = false;
};

// The ServerWriteReactor of a WatchTraining call (training_service.cc).
class WatchReactor;

// What a job notifies: a watcher that may already be gone (reactor null).
// `mu` guards `reactor` and the reactor's own state; the reactor's calls
// into gRPC (StartWrite, Finish) are made after it is released, as gRPC
// may run OnDone, which takes it, inline from Finish.
struct WatchSink {
  base::Mutex mu;
  WatchReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
};

// One `numaserve train` child and what it has reported.
class TrainingJob {
 public:
  // `label` is the public part of `id` (metrics, log); `files` is removed
  // when the process has exited. Start() starts reading its output.
  TrainingJob(std::string id, std::string label, std::string owner, std::string model, pid_t pid,
              std::unique_ptr<PrivateDir> files, Metrics* metrics,
              std::chrono::milliseconds stop_grace);
  ~TrainingJob();

  // Starts the thread that reads the job's output (`output_fd`, taken) and
  // waits for its process. When no thread can be started: the process
  // group is killed and waited for, the job is FAILED, and the error is
  // RESOURCE_EXHAUSTED naming the cause.
  absl::Status Start(int output_fd) ABSL_LOCKS_EXCLUDED(mu_);

  // Once the job has finished: joins its threads (the reader has then done
  // its last notification). Any thread may call it, more than once.
  void JoinThreads() ABSL_LOCKS_EXCLUDED(mu_, join_mu_);
  // Once the job has been joined and is forgotten: removes its metric
  // series.
  void RemoveMetrics();

  const std::string& id() const { return id_; }
  const std::string& label() const { return label_; }
  const std::string& owner() const { return owner_; }

  // The latest progress and its version (incremented on every change).
  std::pair<training::TrainingProgress, int64_t> Snapshot() ABSL_LOCKS_EXCLUDED(mu_);
  bool finished() ABSL_LOCKS_EXCLUDED(mu_);

  // Starts stopping the job (see training_service.h): FAILED_PRECONDITION
  // when it has already ended, RESOURCE_EXHAUSTED (nothing done) when the
  // thread that escalates cannot be started. A job already stopping stays
  // so.
  absl::Status Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  // SIGTERM to the job's process group: mpirun kills its ranks, without a
  // checkpoint. For when Cancel cannot be.
  void Terminate() ABSL_LOCKS_EXCLUDED(mu_);

  void AddSink(std::shared_ptr<WatchSink> sink) ABSL_LOCKS_EXCLUDED(sinks_mu_);
  void RemoveSink(const WatchSink* sink) ABSL_LOCKS_EXCLUDED(sinks_mu_);

 private:
  // Pumps every watcher still there; defined in training_service.cc, where
  // WatchReactor is.
  void Notify() ABSL_LOCKS_EXCLUDED(mu_, sinks_mu_);

  // SIGTERM when the job has not ended stop_grace after SIGUSR1, SIGKILL
  // 5 s later.
  void Escalate() ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until the process has exited (true) or `timeout` has passed
  // (false).
  bool WaitForExit(std::chrono::milliseconds timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The "progress" field of a record of rank 0 (trainer.cc, WriteProgress):
  // a JSON string holding a ProgressReport as protobuf JSON. Refused, with
  // the reason, when it is not one or when its figures cannot be (an epoch
  // or step out of range, a ratio outside 0..1, a negative or non-finite
  // rate or eta); the loss may be anything, NaN included (a diverged run).
  static absl::StatusOr<training::ProgressReport> ReadProgressReport(const std::string& field_json);

  void ExportFigures() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // One line of the job's output (mpirun's stdout and stderr): a log
  // record of a rank or of the launcher (JSON, see SpawnJob in
  // training_service.cc), among them rank 0's progress reports
  // (trainer.cc: intervals, epoch ends, an early stop, the export), or a
  // line of mpirun's. The progress it reports is kept; the line goes into
  // the server's log as a record naming the job.
  void ParseLine(const std::string& line) ABSL_LOCKS_EXCLUDED(mu_);

  // The "progress" field of a progress report's record (component
  // "training"), else null.
  static const base::LogField* ProgressField(const base::LogRecord& record);

  // Rank 0's progress report: LINE (the record's message) as `numaserve
  // train` prints it in text, and the "progress" field's JSON. A report
  // that does not read back is left out with a debug record saying why:
  // the job's output is not trusted to be well formed.
  void ReadProgress(const std::string& line, const std::string& field_json)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A record a rank or the launcher wrote, in the server's log with the
  // job's label; its error is what the job's failure reports.
  void ForwardRecord(const base::LogRecord& record) ABSL_LOCKS_EXCLUDED(mu_);

  // One line of the job's output without its newline, at most
  // kMaxOutputLine bytes of it: the rest of a longer line is dropped, so a
  // job cannot make the server hold a line of any length. False at the end
  // of the output.
  static bool ReadBoundedLine(FILE* in, std::string* line);

  void ReadOutput(int fd) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string id_;
  const std::string label_;  // the public part of id_: metrics and log
  const std::string owner_;  // the caller that started it ("" = anonymous)
  const std::string model_;  // metrics label
  const pid_t pid_;
  Metrics* const metrics_;
  const std::chrono::milliseconds stop_grace_;
  const std::unique_ptr<PrivateDir> files_;
  base::Mutex mu_;
  base::CondVar exited_cv_;  // signalled when exited_ turns true
  training::TrainingProgress progress_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 1;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool exited_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::string stop_line_ ABSL_GUARDED_BY(mu_);
  base::Mutex sinks_mu_;  // never held while notifying
  std::vector<std::shared_ptr<WatchSink>> sinks_ ABSL_GUARDED_BY(sinks_mu_);
  base::Mutex join_mu_;                           // JoinThreads, one caller at a time
  std::thread reader_ ABSL_GUARDED_BY(join_mu_);  // started by Start
  // Started by Cancel; moved out and joined by JoinThreads or the destructor.
  std::thread stopper_ ABSL_GUARDED_BY(mu_);
};

}  // namespace numaserve::serving
