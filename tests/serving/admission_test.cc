// A request queued while its model version is switched out follows the
// switch only where it fits the new version as a new request would: on a
// real ModelScheduler whose old queue is gone, with a worker pool that
// holds nothing (requests stay queued).
#include "serving/scheduling/admission.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"

namespace numaserve::serving {
namespace {

class IdlePool final : public WorkerPool {
 public:
  int size() const override { return 1; }
  bool Ready(int) const override { return false; }
  bool HasModel(int, const std::string&) const override { return false; }
  bool ModelExpected(const std::string&) const override { return true; }
  int Instances(int, const std::string&) const override { return 1; }
  int NumaNode(int) const override { return 0; }
  size_t BatchBytesLimit() const override { return size_t{1} << 30; }
  void Run(int, const InferenceTask&, RunDoneFn) override { ADD_FAILURE() << "nothing runs"; }
};

// Version `version` of "m": x [-1, 1] FP32 in, y [-1, out_width] FP32 out.
std::shared_ptr<RepositoryModel> Version(int64_t version, int max_batch, int64_t out_width) {
  auto m = std::make_shared<RepositoryModel>();
  m->name = "m";
  m->version = version;
  m->info.inputs.push_back({"x", engine::DataType::kFloat32, {-1, 1}});
  m->info.outputs.push_back({"y", engine::DataType::kFloat32, {-1, out_width}});
  m->info.batched = true;
  m->config.set_max_batch_size(max_batch);
  m->config.mutable_dynamic_batching();
  return m;
}

inference::ModelInferRequest Rows(int64_t rows) {
  inference::ModelInferRequest r;
  r.set_model_name("m");
  auto* in = r.add_inputs();
  in->set_name("x");
  in->set_datatype("FP32");
  in->add_shape(rows);
  in->add_shape(1);
  r.add_raw_input_contents()->assign(static_cast<size_t>(rows) * 4, '\0');
  return r;
}

class AdmissionTest : public ::testing::Test {
 protected:
  // v1 admits the request and is switched out (its queue removed) before
  // the request is queued; `next` replaces it.
  absl::Status SubmitAcrossSwitch(const std::shared_ptr<RepositoryModel>& next, int64_t rows,
                                  size_t max_message_bytes = size_t{64} << 20) {
    auto v1 = Version(1, 8, 1);
    EXPECT_TRUE(scheduler_.AddModel(v1).ok());
    EXPECT_TRUE(scheduler_.AddModel(next).ok());
    request_ = Rows(rows);
    auto admitted = Admit(*v1, request_, max_message_bytes);
    EXPECT_TRUE(admitted.ok()) << admitted.status();
    pending_ = std::make_shared<PendingInference>();
    pending_->model = v1;
    pending_->rows = admitted->parsed.rows;
    pending_->bytes = admitted->worker_bytes();
    pending_->parsed = std::move(admitted->parsed);
    pending_->reject = [](const absl::Status&) {};
    EXPECT_TRUE(scheduler_.RemoveModel(v1->key(), std::chrono::milliseconds(0)));
    SwitchFollowing how;
    how.submit = [this](std::shared_ptr<PendingInference> p) {
      return scheduler_.Submit(std::move(p));
    };
    how.resolve = [next]() -> absl::StatusOr<std::shared_ptr<const RepositoryModel>> {
      return std::shared_ptr<const RepositoryModel>(next);
    };
    how.readmit = [this](const RepositoryModel& model, const Admission& a) {
      readmitted_to_ = model.version;
      readmitted_bytes_ = a.held_bytes();
      return absl::OkStatus();
    };
    how.max_message_bytes = max_message_bytes;
    return SubmitFollowingSwitch(pending_, request_, how);
  }

  base::FakeClock clock_;
  IdlePool pool_;
  inference::ModelInferRequest request_;
  std::shared_ptr<PendingInference> pending_;
  int64_t readmitted_to_ = 0;
  size_t readmitted_bytes_ = 0;
  // Last: it is stopped (answering what is queued) before the rest goes.
  ModelScheduler scheduler_{ModelScheduler::Options{}, &pool_, nullptr, &clock_};
};

TEST_F(AdmissionTest, ARequestThatFitsTheNewVersionIsQueuedThere) {
  auto v2 = Version(2, 8, 3);
  ASSERT_TRUE(SubmitAcrossSwitch(v2, 4).ok());
  EXPECT_EQ(scheduler_.pending(), 1u);
  EXPECT_EQ(pending_->model, v2);
  EXPECT_EQ(readmitted_to_, 2);
  // 16 bytes in; 48 bytes out, computed and in the response.
  EXPECT_EQ(readmitted_bytes_, 16u + 48u + 48u);
  EXPECT_EQ(pending_->bytes, 16u + 48u);
  EXPECT_EQ(pending_->parsed.output_bytes, (std::vector<size_t>{48}));
}

TEST_F(AdmissionTest, ARequestOverTheNewMaxBatchSizeIsRefusedAsANewOneWouldBe) {
  const absl::Status s = SubmitAcrossSwitch(Version(2, 2, 1), 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("the request has 4 rows; model 'm' takes at most max_batch_size = 2"),
            std::string::npos)
      << s;
  EXPECT_EQ(scheduler_.pending(), 0u);
  EXPECT_EQ(readmitted_to_, 0);
}

TEST_F(AdmissionTest, AResponseThatOutgrowsTheMessageLimitIsRefusedAsANewOneWouldBe) {
  // 4 rows of 1 float each fit 1000 bytes; of 100 floats each they do not.
  const absl::Status s = SubmitAcrossSwitch(Version(2, 8, 100), 4, 1000);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("the response would carry 1600 bytes"), std::string::npos) << s;
  EXPECT_EQ(scheduler_.pending(), 0u);
  EXPECT_EQ(readmitted_to_, 0);
}

TEST_F(AdmissionTest, TheNewVersionsBudgetRefusalIsReturned) {
  auto v1 = Version(1, 8, 1);
  auto v2 = Version(2, 8, 1);
  ASSERT_TRUE(scheduler_.AddModel(v1).ok());
  ASSERT_TRUE(scheduler_.AddModel(v2).ok());
  request_ = Rows(1);
  auto admitted = Admit(*v1, request_, 1 << 20);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  pending_ = std::make_shared<PendingInference>();
  pending_->model = v1;
  pending_->parsed = std::move(admitted->parsed);
  ASSERT_TRUE(scheduler_.RemoveModel(v1->key(), std::chrono::milliseconds(0)));
  SwitchFollowing how;
  how.submit = [this](std::shared_ptr<PendingInference> p) {
    return scheduler_.Submit(std::move(p));
  };
  how.resolve = [v2]() -> absl::StatusOr<std::shared_ptr<const RepositoryModel>> { return v2; };
  how.readmit = [](const RepositoryModel&, const Admission&) {
    return absl::ResourceExhaustedError("over the budget");
  };
  how.max_message_bytes = 1 << 20;
  EXPECT_EQ(SubmitFollowingSwitch(pending_, request_, how).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(scheduler_.pending(), 0u);
}

}  // namespace
}  // namespace numaserve::serving
