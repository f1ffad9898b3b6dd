// InferenceService's ModelStreamInfer call: the InferStream reactor, which
// starts an inference for every request it reads and writes the answers
// back in completion order, and the service's list of open streams
// (AddStream, RemoveStream, and SetShuttingDown, which drains them and
// refuses the loads and unloads not yet started). Its messages are read and
// written over gRPC's buffers, as ModelInfer's (raw_infer.h).
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "serving/frontend/inference_service.h"
#include "serving/frontend/raw_infer.h"
#include "serving/request/request_parameters.h"

namespace numaserve::serving {

// One ModelStreamInfer call: every request read starts an inference; the
// answers are written back one at a time as they complete. The call ends
// when the client has finished writing and every answer has been written,
// or, once the server drains, when every request read so far is answered.
class InferStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  InferStream(InferenceService* service, grpc::CallbackServerContext* context)
      : service_(service), cancel_(std::make_shared<CallCancellation>()) {
    cancel_->deadline = context->deadline();
    if (service_->AddStream(this)) {
      ReadNext();
    } else {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
    }
  }

  void OnReadDone(bool ok) override {
    bool read_more = false;
    {
      base::MutexLock lock(&mu_);
      if (!ok || finished_) {
        reads_done_ = true;
        MaybeFinishLocked();
        return;
      }
      ++outstanding_;
      // Draining: this request is answered (UNAVAILABLE), no more are read.
      read_more = !draining_;
      if (!read_more) reads_done_ = true;
      // At the limit, the next read waits for an answer to be written.
      if (read_more && outstanding_ >= service_->options_.max_stream_outstanding) {
        read_more = false;
        read_paused_ = true;
      }
    }
    std::shared_ptr<Item> item = std::move(reading_);
    Start(item);
    // The next read starts once this request is queued, so the stream's
    // requests reach the scheduler in the order they were sent.
    if (read_more) ReadOn();
  }

  void OnWriteDone(bool) override {
    // The reply is written (or the call is over): its request's bytes
    // leave the in-flight budget only now, so a client that stops reading
    // holds the budget rather than memory outside it.
    InflightRelease release;
    {
      base::MutexLock lock(&mu_);
      release = std::move(writes_.front()->release);
      writes_.pop_front();
    }
    if (release) release();
    base::MutexLock lock(&mu_);
    --outstanding_;
    if (read_paused_ && !draining_ && !finished_ &&
        outstanding_ < service_->options_.max_stream_outstanding) {
      read_paused_ = false;
      ReadNext();  // the read chain was idle: nothing else touches reading_
    }
    if (!writes_.empty()) {
      StartWrite(&writes_.front()->wire);
      return;
    }
    writing_ = false;
    MaybeFinishLocked();
  }

  void OnCancel() override { service_->CancelCall(*cancel_); }

  void OnDone() override {
    service_->RemoveStream(this);
    delete this;
  }

  // The server is shutting down: stop reading, end the call once every
  // request read so far has been answered.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_) {
    base::MutexLock lock(&mu_);
    draining_ = true;
    MaybeFinishLocked();
  }

 private:
  struct Item {
    grpc::ByteBuffer received;
    RawInferRequest request;
    inference::ModelStreamInferResponse reply;  // its outputs' bytes in `outputs`
    std::vector<grpc::Slice> outputs;
    grpc::ByteBuffer wire;    // the reply as written
    InflightRelease release;  // run once the reply is written
  };

  // Parses `item` and hands it to the service; a malformed one is answered.
  void Start(const std::shared_ptr<Item>& item) {
    absl::StatusOr<RawInferRequest> read = ReadRawInferRequest(item->received);
    item->received.Clear();
    if (!read.ok()) {
      service_->RecordUnreadRequest(read.status());
      return Answer(item, read.status());
    }
    item->request = *std::move(read);
    Item* raw = item.get();
    service_->StartInference(
        Protocol::kGrpc, cancel_, &item->request.message, item->reply.mutable_infer_response(),
        [this, item](const absl::Status& status, InflightRelease release) {
          item->release = std::move(release);
          Answer(item, status);
        },
        TransportBuffers{item->request.transport, [raw](const char* data, size_t size) {
                           raw->outputs.emplace_back(data, size);
                         }});
  }

  void ReadOn() ABSL_LOCKS_EXCLUDED(mu_) {
    base::MutexLock lock(&mu_);
    if (finished_ || draining_) {  // Drain() came meanwhile
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    ReadNext();
  }

  void ReadNext() {
    reading_ = std::make_shared<Item>();
    StartRead(&reading_->received);
  }

  // Writes `item`'s reply: its outputs, or the error that ended it.
  void Answer(const std::shared_ptr<Item>& item, const absl::Status& status) {
    const inference::ModelInferRequest& request = item->request.message;
    if (!status.ok()) {
      item->reply.Clear();
      item->outputs.clear();
      item->reply.set_error_message(
          absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message()));
      item->reply.mutable_infer_response()->set_id(request.id());
      item->reply.mutable_infer_response()->set_model_name(request.model_name());
    }
    // Asked for (Triton's clients do): every request has one response
    // here, so this one is its last.
    const auto& asked = request.parameters();
    if (const auto it = asked.find(kEmptyFinalResponseParameter);
        it != asked.end() && it->second.bool_param()) {
      (*item->reply.mutable_infer_response()->mutable_parameters())[kFinalResponseParameter]
          .set_bool_param(true);
    }
    item->wire = WriteRawStreamResponse(item->reply, std::move(item->outputs));
    Write(item);
  }

  void Write(std::shared_ptr<Item> item) ABSL_LOCKS_EXCLUDED(mu_) {
    base::MutexLock lock(&mu_);
    writes_.push_back(std::move(item));
    if (!writing_) {
      writing_ = true;
      StartWrite(&writes_.front()->wire);
    }
  }

  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if ((!reads_done_ && !draining_) || outstanding_ > 0 || writing_ || finished_) return;
    finished_ = true;
    if (reads_done_ && !draining_) {
      Finish(grpc::Status::OK);
    } else {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the server is shutting down; every request read on this stream "
                          "has been answered"));
    }
  }

  InferenceService* const service_;
  const std::shared_ptr<CallCancellation> cancel_;
  std::shared_ptr<Item> reading_;  // only touched by the read chain
  base::Mutex mu_;
  std::deque<std::shared_ptr<Item>> writes_ ABSL_GUARDED_BY(mu_);  // front: being written
  int64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;                   // read, not yet written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // At max_stream_outstanding; OnWriteDone reads on.
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

bool InferenceService::AddStream(InferStream* stream) {
  base::MutexLock lock(&streams_mu_);
  streams_.insert(stream);
  return !shutting_down_;
}

void InferenceService::RemoveStream(InferStream* stream) {
  base::MutexLock lock(&streams_mu_);
  streams_.erase(stream);
}

void InferenceService::SetShuttingDown() {
  {
    base::MutexLock lock(&streams_mu_);
    shutting_down_ = true;
    for (InferStream* stream : streams_) stream->Drain();
  }
  // Loads and unloads not yet started are refused; the one under way ends.
  std::deque<LifecycleJob> refused;
  {
    base::MutexLock lock(&lifecycle_mu_);
    refused.swap(lifecycle_jobs_);
  }
  for (auto& job : refused) job.answer(absl::UnavailableError("the server is shutting down"));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* InferenceService::ModelStreamInfer(
    grpc::CallbackServerContext* context) {
  return new InferStream(this, context);
}

}  // namespace numaserve::serving
