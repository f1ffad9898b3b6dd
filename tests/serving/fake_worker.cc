// A stand-in for `numaserve worker` that WorkerSupervisor spawns in
// worker_supervisor_test: it speaks the control protocol (hello, then one
// reply per command) without the engine, and crashes on request, for real
// (abort), so the supervisor's restart and crash accounting can be tested
// on a real dying process.
//
//   FAKE_WORKER_LOG          file that gets its arguments at start ("args
//                            worker --index 0 ..."), the NUMASERVE_*
//                            variables of its environment ("env
//                            NUMASERVE_A=1 NUMASERVE_B=2", in its order)
//                            and one line per command ("load KEY", "run KEY
//                            BATCH", "unload KEY")
//   FAKE_WORKER_CRASH_LOAD   abort() when loading a key containing this
//   FAKE_WORKER_CRASH_RUN    abort() when running a key containing this
//   FAKE_WORKER_CRASH_BATCH  abort() when running a batch of this many rows
//   FAKE_WORKER_INSTANCES    a load's reply says it runs this many instances,
//                            with instances_report "fake measurement" and
//                            memory_nodes "0=7" (unset: none of the three)
//   FAKE_WORKER_HOLD_HELLO   before its hello, log "hold hello PID" and wait
//                            until this file exists
//   FAKE_WORKER_HOLD_LOADS   before answering the load of KEY, log "hold load
//                            KEY" and wait until the file named this plus
//                            ".KEY" exists
//
// A hold gives up after 60 s (a test that failed leaves nothing behind).
// It changes no signal disposition or mask: what it has, it inherited.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "serving/workers/framing.h"
#include "serving/workers/worker_main.h"
#include "worker.pb.h"

extern char** environ;

namespace {

std::string Env(const char* name) {
  const char* v = getenv(name);
  return v == nullptr ? "" : v;
}

void Log(const std::string& line) {
  const std::string path = Env("FAKE_WORKER_LOG");
  if (path.empty()) return;
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const std::string text = line + "\n";
  (void)!write(fd, text.data(), text.size());
  close(fd);
}

// With the environment variable `name` set: logs `line`, then waits until
// the file it names, plus `suffix`, exists.
void Hold(const char* name, const std::string& line, const std::string& suffix = "") {
  if (Env(name).empty()) return;
  const std::string path = Env(name) + suffix;
  Log(line);
  for (int i = 0; i < 60000 && access(path.c_str(), F_OK) != 0; ++i) usleep(1000);
}

bool Contains(const std::string& key, const std::string& part) {
  return !part.empty() && key.find(part) != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  using numaserve::serving::kWorkerControlFd;
  namespace worker = numaserve::worker;
  const struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);  // its crashes leave no core files
  Hold("FAKE_WORKER_HOLD_HELLO", absl::StrCat("hold hello ", getpid()));
  worker::Reply hello;
  hello.mutable_hello()->set_pid(getpid());
  hello.mutable_hello()->set_binding("fake worker");
  hello.set_ok(true);
  if (!numaserve::serving::WriteFramed(kWorkerControlFd, hello).ok()) return 1;
  std::string args = "args";
  for (int i = 1; i < argc; ++i) absl::StrAppend(&args, " ", argv[i]);
  Log(args);
  std::string env = "env";
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "NUMASERVE_", 10) == 0) absl::StrAppend(&env, " ", *e);
  }
  Log(env);
  int64_t crash_batch = -1;
  int32_t instances = 0;
  if (!absl::SimpleAtoi(Env("FAKE_WORKER_INSTANCES"), &instances)) instances = 0;
  if (!absl::SimpleAtoi(Env("FAKE_WORKER_CRASH_BATCH"), &crash_batch)) crash_batch = -1;
  worker::Command command;
  while (numaserve::serving::ReadFramed(kWorkerControlFd, &command).ok()) {
    worker::Reply reply;
    reply.set_id(command.id());
    reply.set_ok(true);
    if (command.has_load()) {
      Log(absl::StrCat("load ", command.load().key()));
      if (Contains(command.load().key(), Env("FAKE_WORKER_CRASH_LOAD"))) abort();
      Hold("FAKE_WORKER_HOLD_LOADS", absl::StrCat("hold load ", command.load().key()),
           absl::StrCat(".", command.load().key()));
      if (instances > 0) {
        reply.set_instances(instances);
        reply.set_instances_report("fake measurement");
        reply.set_memory_nodes("0=7");
      }
    } else if (command.has_run()) {
      Log(absl::StrCat("run ", command.run().key(), " ", command.run().batch()));
      if (Contains(command.run().key(), Env("FAKE_WORKER_CRASH_RUN")) ||
          command.run().batch() == crash_batch) {
        abort();
      }
    } else if (command.has_unload()) {
      Log(absl::StrCat("unload ", command.unload().key()));
    }
    if (!numaserve::serving::WriteFramed(kWorkerControlFd, reply).ok()) return 1;
  }
  return 0;
}
