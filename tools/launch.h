// `ncclwatch launch`: starts N ranks of a program on this machine with torchrun's variables,
// prefixes their output, forwards signals, and ends the job like torchrun does: at the first
// failure the other ranks are stopped.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace ncclwatch::launch {

struct Options {
  int ranks = 0;
  std::chrono::milliseconds grace{5000};  // SIGTERM → SIGKILL delay when stopping ranks
  bool prefix = true;
  // Leave the other ranks running when one fails (as a job whose launcher does not notice would
  // hang), so that the failure's effect on them can be watched; the job ends when all have.
  bool keepGoing = false;
  std::vector<std::string> command;  // program and its arguments
};

// How one rank ended.
struct RankExit {
  int rank = -1;
  int status = 0;  // exit code, or 128 + signal number for a signal death
  bool bySignal = false;
};

// The job's exit code: the first non-zero rank exit in time order, else 0.
int jobExitCode(const std::vector<RankExit>& exitsInOrder);

// "rank 3 exited with code 139 (SIGSEGV)".
std::string describeExit(const RankExit& exit);

// A TCP port p on 127.0.0.1 such that p, p+1 and the collector's port above it were free when
// checked (the examples serve their NCCL id on MASTER_PORT+1), outside the ephemeral range when
// it leaves room. Returns 0 when none was found.
int findFreePortPair();

// net.ipv4.ip_local_port_range (Linux's default, 32768-60999, when unreadable).
std::pair<int, int> ephemeralPorts();

// Splits `pending` into complete lines, each written as `prefix + line + '\n'` to `out`;
// keeps an unfinished last line in `pending`.
std::string takeCompleteLines(std::string& pending, const std::string& prefix);

// Runs the job; returns its exit code. Writes one-line errors to stderr.
int run(const Options& options);

}  // namespace ncclwatch::launch
