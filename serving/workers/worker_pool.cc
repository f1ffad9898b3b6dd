#include "serving/workers/worker_pool.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "serving/workers/worker_supervisor.h"

namespace numaserve::serving {

namespace {

// The bytes of a tensor's pieces, laid end to end.
size_t PiecesBytes(const std::vector<std::pair<const char*, size_t>>& pieces) {
  size_t bytes = 0;
  for (const auto& piece : pieces) bytes += piece.second;
  return bytes;
}

// Copies a tensor's pieces end to end to `to`.
void CopyPieces(const std::vector<std::pair<const char*, size_t>>& pieces, char* to) {
  for (const auto& [data, n] : pieces) {
    memcpy(to, data, n);  // the one copy in
    to += n;
  }
}

// The outcome of a batch that never reached the worker: lost and not sent,
// so the scheduler sends it again.
RunOutcome NotSent(absl::Status status) {
  RunOutcome outcome;
  outcome.lost = true;
  outcome.not_sent = true;
  outcome.status = std::move(status);
  return outcome;
}

// The failure of a batch the worker answered with an error, or that was lost
// with its worker.
void SetRunFailure(const worker::Reply& reply, bool lost, RunOutcome* outcome) {
  if (lost) {
    outcome->lost = true;
    outcome->status = absl::UnavailableError(reply.error());
  } else {
    // The engine's own code (INVALID_ARGUMENT for an integer division
    // by zero, ...); INTERNAL when the worker sent none.
    const bool known = reply.code() > 0 && reply.code() <= 16;
    const auto code =
        known ? static_cast<absl::StatusCode>(reply.code()) : absl::StatusCode::kInternal;
    outcome->status = absl::Status(code, reply.error());
  }
}

}  // namespace

int SupervisedWorkerPool::size() const { return workers_->size(); }

bool SupervisedWorkerPool::Ready(int worker) const { return workers_->Ready(worker); }

bool SupervisedWorkerPool::HasModel(int worker, const std::string& key) const {
  return workers_->HasModel(worker, key);
}

bool SupervisedWorkerPool::ModelExpected(const std::string& key) const {
  return workers_->ModelExpected(key);
}

int SupervisedWorkerPool::Instances(int worker, const std::string& key) const {
  return std::max(1, workers_->Instances(worker, key));
}

int SupervisedWorkerPool::NumaNode(int worker) const {
  return workers_->placement(worker).numa_node;
}

size_t SupervisedWorkerPool::BatchBytesLimit() const { return workers_->batch_bytes(); }

SupervisedWorkerPool::SupervisedWorkerPool(WorkerSupervisor* workers)
    : workers_(workers), copiers_(static_cast<size_t>(workers->size())) {}

void SupervisedWorkerPool::StartCopiers(const std::vector<std::vector<int>>& copier_cpus) {
  for (size_t i = 0; i < copiers_.size() && i < copier_cpus.size(); ++i) {
    if (!copier_cpus[i].empty()) {
      copiers_[i] = std::make_unique<CopierThread>(static_cast<int>(i), copier_cpus[i]);
    }
  }
}

SupervisedWorkerPool::~SupervisedWorkerPool() { StopCopiers(); }

void SupervisedWorkerPool::StopCopiers() {
  for (auto& copier : copiers_) {
    if (copier != nullptr) copier->Stop();
  }
}

void SupervisedWorkerPool::Run(int worker, const InferenceTask& task, RunDoneFn done) {
  CopierThread* copier = copiers_[static_cast<size_t>(worker)].get();
  if (copier == nullptr) return CopyAndSend(worker, task, std::move(done));
  // `task` outlives `done` (WorkerPool::Run); the closure holds `done`.
  copier->Post([this, worker, &task, done = std::move(done)]() mutable {
    CopyAndSend(worker, task, std::move(done));
  });
}

void SupervisedWorkerPool::CopyAndSend(int worker, const InferenceTask& task, RunDoneFn done) {
  ArenaAllocator& allocator = workers_->allocator(worker);
  char* base = workers_->arena(worker).data();
  worker::Command command;
  worker::RunBatch* run = command.mutable_run();
  run->set_key(task.model_key);
  run->set_batch(task.rows);
  run->set_profile(task.profile);
  for (const auto& shape : task.input_shapes) {
    run->add_input_shapes()->mutable_dims()->Add(shape.begin(), shape.end());
  }
  // The inputs' slices, then the outputs'.
  auto offsets = std::make_shared<std::vector<uint64_t>>();
  auto release = [&allocator, offsets] {
    for (uint64_t offset : *offsets) allocator.Free(offset);
  };
  auto reserve = [&](size_t bytes, worker::TensorSlice* slice) {
    auto offset = allocator.Allocate(bytes);
    if (!offset) return false;
    offsets->push_back(*offset);
    slice->set_offset(*offset);
    slice->set_bytes(bytes);
    return true;
  };
  bool fits = true;
  const auto copy_start = std::chrono::steady_clock::now();
  for (const auto& pieces : task.inputs) {
    const size_t bytes = PiecesBytes(pieces);
    worker::TensorSlice* slice = run->add_inputs();
    fits = reserve(bytes, slice);
    if (!fits) break;
    CopyPieces(pieces, base + slice->offset());
  }
  const double input_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - copy_start).count();
  for (size_t i = 0; fits && i < task.output_bytes.size(); ++i) {
    fits = reserve(task.output_bytes[i], run->add_outputs());
  }
  if (!fits) {
    // Every batch fits the arena alone (the scheduler keeps batches within
    // BatchBytesLimit), so this one waits for the batches ahead of it to
    // free their space and is sent again, not failed.
    release();
    return done(NotSent(absl::ResourceExhaustedError(absl::StrCat(
        "worker ", worker, "'s shared arena of ", allocator.capacity(), " bytes is full"))));
  }
  const size_t num_inputs = task.inputs.size();
  // Copied: the command may be answered (or lost) before Send returns.
  auto finish = std::make_shared<RunDoneFn>(std::move(done));
  bool sent = workers_->Send(
      worker, std::move(command),
      [this, worker, offsets, release, num_inputs, input_seconds, finish](
          const worker::Reply& reply, bool lost) {
        RunOutcome outcome;
        outcome.input_seconds = input_seconds;
        outcome.compute_seconds = static_cast<double>(reply.compute_ns()) * 1e-9;
        outcome.instance = reply.instance();
        outcome.profile_json = reply.profile_json();
        if (reply.ok()) {
          for (size_t i = num_inputs; i < offsets->size(); ++i) {
            outcome.outputs.push_back(workers_->arena(worker).data() + (*offsets)[i]);
          }
        } else {
          SetRunFailure(reply, lost, &outcome);
        }
        (*finish)(outcome);  // copies the outputs out of the arena
        release();
      });
  if (!sent) {
    // The worker turned unready between choosing it and sending.
    release();
    (*finish)(NotSent(absl::UnavailableError(absl::StrCat("worker ", worker, " is not ready"))));
  }
}

}  // namespace numaserve::serving
