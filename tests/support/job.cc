#include "job.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

namespace testsupport {
namespace {

using Clock = std::chrono::steady_clock;

std::string makeDirectory() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/ncclwatch-test-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) return "/tmp";
  return buffer.data();
}

std::string logPath(const std::string& directory, int rank) {
  return directory + "/rank" + std::to_string(rank) + ".log";
}

// utime + stime of the process, all its threads included, from /proc/<pid>/stat.
double processCpuSeconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int index = 3; fields >> field; ++index) {
    if (index == 14) utime = std::stoull(field);
    if (index == 15) {
      stime = std::stoull(field);
      break;
    }
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

std::string simLibDir() {
  return NCCLWATCH_SIM_LIB_DIR;
}
std::string buildDir() {
  return NCCLWATCH_BUILD_DIR;
}

Job::Job(JobSpec spec) : directory_(makeDirectory()) {
  static std::atomic<int> jobCounter{0};
  std::string jobId = "test-" + std::to_string(getpid()) + "-" + std::to_string(jobCounter++);
  for (int rank = 0; rank < spec.ranks; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      int log = open(logPath(directory_, rank).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
      setpgid(0, 0);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(spec.ranks).c_str(), 1);
      // More ranks than the sim's eight GPUs span hosts of eight, as a real job does: NCCL
      // refuses two ranks of one communicator on one GPU of one host.
      if (spec.ranks > 8) {
        setenv("NCCL_HOSTID", ("simhost" + std::to_string(rank / 8)).c_str(), 1);
      }
      setenv("NCCLWATCH_JOB", jobId.c_str(), 1);
      setenv("TMPDIR", directory_.c_str(), 1);  // the examples' file rendezvous lands here
      unsetenv("MASTER_ADDR");
      if (spec.useSim) {
        const char* existing = std::getenv("LD_LIBRARY_PATH");
        std::string path = simLibDir() + (existing ? std::string(":") + existing : "");
        setenv("LD_LIBRARY_PATH", path.c_str(), 1);
      }
      for (auto& [name, value] : spec.env) setenv(name.c_str(), value.c_str(), 1);
      for (auto& name : spec.unsetEnv) unsetenv(name.c_str());
      std::vector<char*> argv{const_cast<char*>(spec.program.c_str())};
      for (auto& arg : spec.args) argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      std::perror("execv");
      _exit(127);
    }
    pids_.push_back(pid);
    status_.push_back(-1);
  }
}

Job::~Job() {
  signalAll(SIGKILL);
  waitExit(std::chrono::seconds(10));
}

void Job::reap() {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (status_[i] != -1) continue;
    int status = 0;
    if (waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
      status_[i] = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    }
  }
}

bool Job::waitExit(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    reap();
    bool all = true;
    for (int status : status_) all = all && status != -1;
    if (all) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool Job::alive(int rank) {
  reap();
  return status_.at(rank) == -1;
}

int Job::exitStatus(int rank) {
  reap();
  return status_.at(rank);
}

std::string Job::output(int rank) const {
  std::ifstream log(logPath(directory_, rank));
  return std::string((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
}

bool Job::waitForOutput(int rank, const std::string& needle, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (output(rank).find(needle) == std::string::npos) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

bool Job::waitUntilQuiet(std::chrono::milliseconds quiet, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  auto totalBytes = [&] {
    size_t bytes = 0;
    for (int rank = 0; rank < ranks(); ++rank) {
      struct stat info {};
      if (stat(logPath(directory_, rank).c_str(), &info) == 0) bytes += info.st_size;
    }
    return bytes;
  };
  size_t last = totalBytes();
  auto lastChange = Clock::now();
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    size_t now = totalBytes();
    if (now != last) {
      last = now;
      lastChange = Clock::now();
    } else if (Clock::now() - lastChange >= quiet) {
      return true;
    }
  }
  return false;
}

double Job::cpuSeconds() {
  reap();
  double total = 0;
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (status_[i] == -1) total += processCpuSeconds(pids_[i]);
  }
  return total;
}

void Job::signalAll(int signal) {
  reap();
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (status_[i] == -1) kill(-pids_[i], signal);
  }
}

}  // namespace testsupport
