// A child process the test forked: reaped without blocking, its status as a shell reports it.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace testsupport {

class Child {
 public:
  // Whether it still runs; reaps it (once) when it has ended.
  bool running();
  // Waits up to `timeout` for it to end; true when it has.
  bool waitExit(std::chrono::milliseconds timeout);
  void signal(int number) const;
  // Its exit code, 128 + the signal that ended it, or -1 while it runs.
  int status() const { return status_; }

 protected:
  pid_t pid_ = -1;
  int status_ = -1;
};

// Live (not zombie) `ncclwatch collect` processes whose command line names `directory`; with
// `sidecarsOnly`, only those started with --until-idle (rank 0's sidecars).
std::vector<pid_t> collectorsFor(const std::string& directory, bool sidecarsOnly);

}  // namespace testsupport
