#include "serving/workers/input_copier.h"

#include <pthread.h>

#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "affinity/pinning.h"
#include "affinity/topology.h"
#include "base/log.h"

namespace numaserve::serving {

absl::StatusOr<InputCopy> ParseInputCopy(const std::string& text) {
  if (text == "auto") return InputCopy::kAuto;
  if (text == "caller") return InputCopy::kCaller;
  if (text == "node") return InputCopy::kNode;
  return absl::InvalidArgumentError(
      absl::StrCat("--input-copy: '", text, "' is not one of auto, caller, node"));
}

std::vector<std::vector<int>> InputCopyCpus(const affinity::Plan& plan, InputCopy mode) {
  std::vector<std::vector<int>> cpus(plan.workers.size());
  if (mode == InputCopy::kAuto) {
    std::set<int> nodes;
    for (const affinity::WorkerPlacement& worker : plan.workers) nodes.insert(worker.numa_node);
    const bool spread = nodes.size() > 1;
    mode = !plan.frontend_cpus.empty() && spread ? InputCopy::kNode : InputCopy::kCaller;
  }
  if (mode == InputCopy::kCaller) return cpus;
  for (size_t i = 0; i < plan.workers.size(); ++i) {
    const affinity::WorkerPlacement& worker = plan.workers[i];
    cpus[i] = worker.supervisor_cpus.empty() ? worker.cpus : worker.supervisor_cpus;
  }
  return cpus;
}

CopierThread::CopierThread(int index, std::vector<int> cpus)
    : cpus_(std::move(cpus)), thread_([this, index] { Loop(index); }) {}

CopierThread::~CopierThread() { Stop(); }

void CopierThread::Post(std::function<void()> work) {
  {
    base::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.push_back(std::move(work));
      cv_.Signal();
      return;
    }
  }
  work();
}

void CopierThread::Stop() {
  {
    base::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

void CopierThread::Loop(int index) {
  // 15 characters at most: "copier-" and up to 8 digits.
  pthread_setname_np(pthread_self(), absl::StrCat("copier-", index).substr(0, 15).c_str());
  if (!cpus_.empty()) {
    if (absl::Status s = affinity::PinCallingThread(cpus_); !s.ok()) {
      base::Log(base::LogLevel::kWarning, "supervisor",
                absl::StrCat("worker ", index, ": input copier not pinned to cpus ",
                             affinity::FormatCpuList(cpus_), ": ", s.message()),
                {{"worker", index}});
    }
  }
  for (;;) {
    std::function<void()> work;
    {
      base::MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) cv_.Wait(&mu_);
      // Stopping still runs what was queued before it.
      if (queue_.empty()) return;
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

}  // namespace numaserve::serving
