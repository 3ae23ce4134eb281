// The sidecar collector: without `ncclwatch run`, the agent of global rank 0 starts the job's
// collector (`ncclwatch collect ... --until-idle`) as a process of its own, so that a hung or
// crashed rank never takes the diagnosis down with it and the analysis never loads into the
// host. It is spawned from the watchdog thread (posix_spawn, never an application thread) once
// the job's secret is known, and reaped there without blocking: no SIGCHLD handler, the host
// owns its signals.
#pragma once
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "watchdog/exchange.h"

namespace ncclwatch::watchdog {

struct SidecarOptions {
  std::string masterAddr;  // where the agents look for the collector
  int port = 0;
  std::string directory;  // the collector's --dir (verdicts.jsonl): the trace folder
  std::string cli;        // NCCLWATCH_CLI; empty: bin/ncclwatch beside libncclwatch.so's lib/
  std::vector<std::string> environment;  // the process's environment at its first NCCL call
};

// What the sidecar needs from the environment, taken with the other settings (at the first
// NCCL call) so that the watchdog thread never reads an environment the host may be changing.
SidecarOptions sidecarFromEnvironment(const CollectorAddress& address);

// LD_PRELOAD without the entries naming libncclwatch: the collector must not record itself.
std::string withoutOurPreload(const std::string& list);
// A helper process's environment (the sidecar's, the relay's): the parent's, LD_PRELOAD
// cleaned, NCCLWATCH_SECRET left out.
std::vector<std::string> helperEnvironment(const std::vector<std::string>& parent);
// The sidecar's: the helper environment with NCCLWATCH_SECRET = `secret`.
std::vector<std::string> sidecarEnvironment(const std::vector<std::string>& parent,
                                            const std::string& secret);
// Where the collector listens: loopback when MASTER_ADDR is loopback, else every address of
// the family agents will use for MASTER_ADDR (IPv4, unless it is an IPv6 literal).
std::string sidecarListenAddress(const std::string& masterAddr, int port);
std::vector<std::string> sidecarArguments(const std::string& cli, const SidecarOptions& options);
// <dir of the library>/../bin/ncclwatch.
std::string cliBesideLibrary(const std::string& libraryPath);
// The file this code was loaded from (libncclwatch.so in a job), absolute; "" if unknown.
std::string ownLibraryPath();
// The ncclwatch binary a helper process runs: `configured` (NCCLWATCH_CLI) if set, else the one
// beside libncclwatch.so; "" when neither is known.
std::string helperProgram(const std::string& configured);
// Whether `host` names this machine: loopback, localhost, our host name, or an address of one
// of our interfaces.
bool isLocalAddress(const std::string& host);

class Sidecar {
 public:
  enum class State { kWaiting, kRunning, kExited, kFailed };

  explicit Sidecar(SidecarOptions options) : options_(std::move(options)) {}
  // Watchdog thread, every poll: starts the collector once `secret` is known (non-null), and
  // reaps it without blocking once it runs. Never spawns twice.
  void step(const char* secret);
  State state() const { return state_; }
  pid_t pid() const { return pid_; }
  // Exit code, or 128 + signal; -1 while running or when it was reaped by someone else.
  int exitStatus() const { return exitStatus_; }

 private:
  void spawn(const char* secret);
  void reap();

  SidecarOptions options_;
  State state_ = State::kWaiting;
  pid_t pid_ = -1;
  int exitStatus_ = -1;
};

}  // namespace ncclwatch::watchdog
