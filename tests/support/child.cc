#include "child.h"

#include <signal.h>
#include <sys/wait.h>

#include <thread>

namespace testsupport {

bool Child::running() {
  if (status_ == -1) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      status_ = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    }
  }
  return status_ == -1;
}

bool Child::waitExit(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return !running();
}

void Child::signal(int number) const {
  kill(pid_, number);
}

}  // namespace testsupport
