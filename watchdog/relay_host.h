// The host's relay (docs/protocol.md, "Relays"): the agents of one host reach the collector
// through one process, `ncclwatch relay`, over one connection, so that the collector holds one
// connection per host instead of one per rank. The relay listens on a host-local abstract unix
// socket whose name follows from the job's secret and the collector's address, so every rank of
// the job on the host finds it without talking, and no other job's does.
//
// Who runs it: the relay rank, LOCAL_RANK 0; where LOCAL_RANK is unknown, every rank tries and
// the first to bind the name wins. The rank binds the name itself (from its watchdog thread,
// once the secret is known) and hands the listening socket to the relay process it spawns, as
// the sidecar collector is spawned: a process of its own, so that the job never waits on it.
// When the relay ends (it died, or lost the collector), its agents connect directly.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

#include "watchdog/exchange.h"

namespace ncclwatch::watchdog {

// Whether this job's agents use relays (NCCLWATCH_RELAY, and the world size for auto).
bool relayWanted(RelayMode mode, int world);
// The abstract socket name (without the leading NUL) of the host's relay for this collector
// and secret: "ncclwatch-relay-" and 16 hex digits of a hash of both.
std::string relaySocketName(const std::string& secret, const std::string& collectorHost,
                            int collectorPort);
struct RelayHostOptions {
  std::string collectorHost;
  int collectorPort = 0;
  std::string cli;                       // NCCLWATCH_CLI; empty: beside libncclwatch.so
  std::vector<std::string> environment;  // the process's environment at its first NCCL call
};

// The relay rank's side: claims the host's relay name and starts the relay on it.
class RelayHost {
 public:
  enum class State { kWaiting, kRunning, kOtherRank, kExited, kFailed };

  explicit RelayHost(RelayHostOptions options) : options_(std::move(options)) {}
  // Watchdog thread, every poll: once `secret` is known, binds the name (once) and spawns the
  // relay on it; reaps it without blocking once it runs.
  void step(const char* secret);
  State state() const { return state_; }
  pid_t pid() const { return pid_; }

 private:
  void start(const char* secret);
  void reap();

  RelayHostOptions options_;
  State state_ = State::kWaiting;
  pid_t pid_ = -1;
};

}  // namespace ncclwatch::watchdog
