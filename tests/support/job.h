// Runs multi-process jobs for tests: N ranks of a program with torchrun-style variables, output
// captured per rank, liveness and CPU time observable, and always ended within a bound.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace testsupport {

struct JobSpec {
  std::string program;
  std::vector<std::string> args;
  int ranks = 1;
  std::vector<std::pair<std::string, std::string>> env;  // added to every rank
  std::vector<std::string> unsetEnv;  // removed from every rank after that (RANK, ...)
  bool useSim = true;                 // put the sim's libraries first on LD_LIBRARY_PATH
};

class Job {
 public:
  explicit Job(JobSpec spec);
  ~Job();  // kills whatever still runs
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // Waits until every rank has exited; false on timeout.
  bool waitExit(std::chrono::milliseconds timeout);
  bool alive(int rank);
  // Exit code, or 128+signal; -1 while running.
  int exitStatus(int rank);
  // stdout and stderr of a rank, as written so far.
  std::string output(int rank) const;
  bool waitForOutput(int rank, const std::string& needle, std::chrono::milliseconds timeout);
  // Waits until no rank has written anything for `quiet`, at most `timeout`; true if quiet.
  bool waitUntilQuiet(std::chrono::milliseconds quiet, std::chrono::milliseconds timeout);
  // CPU seconds (user + system, all threads) used so far by the ranks still alive.
  double cpuSeconds();
  void signalAll(int signal);
  const std::string& directory() const { return directory_; }
  int ranks() const { return static_cast<int>(pids_.size()); }

 private:
  void reap();
  std::string directory_;
  std::vector<pid_t> pids_;
  std::vector<int> status_;
};

// Paths baked in at build time.
std::string simLibDir();
std::string buildDir();

}  // namespace testsupport
