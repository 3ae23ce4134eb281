#include "child.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <thread>

#include "traces.h"

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

std::vector<pid_t> collectorsFor(const std::string& directory, bool sidecarsOnly) {
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  while (dirent* entry = proc ? readdir(proc) : nullptr) {
    pid_t pid = std::atoi(entry->d_name);
    if (pid <= 0) continue;
    std::string base = "/proc/" + std::string(entry->d_name);
    std::string cmdline = readFile(base + "/cmdline");
    std::string stat = readFile(base + "/stat");
    size_t close = stat.rfind(')');
    bool zombie = close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
    if (!zombie && cmdline.find(std::string("collect\0", 8)) != std::string::npos &&
        (!sidecarsOnly || cmdline.find("--until-idle") != std::string::npos) &&
        cmdline.find(directory) != std::string::npos) {
      found.push_back(pid);
    }
  }
  if (proc) closedir(proc);
  return found;
}

}  // namespace testsupport
