// `ncclwatch relay`: one host's relay (docs/protocol.md, "Relays"). The agents of the host
// connect to it on a host-local socket; it passes their frames on to the collector over one
// connection, each stamped with the agent's channel, and the collector's answers (DUMP, ABORT,
// REFUSED, CLOSED) back to the agent they name. It folds the calls of communicators all on its
// host that every member completed alike (relay_fold.h: their records are not sent, a FOLDED
// note says how many), and never drops anything else of an agent's stream: while the collector
// does not read, it stops reading the agents (their own bounded buffers take over). Started by the
// host's relay rank (watchdog/relay_host.h) as a process of its own; when it ends, its agents
// connect to the collector directly.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

#include "relay_fold.h"

namespace ncclwatch::relay {

struct Options {
  int listenFd = -1;       // a listening socket it inherited (the relay rank bound the name)
  std::string listenName;  // else: bind this abstract unix socket name itself
  std::string collectorHost;
  int collectorPort = 0;
  int idleMs = 1000;          // end once agents came and none has been connected this long
  int firstAgentMs = 60'000;  // end when no agent came within this long
  int upstreamMs = 10'000;  // end when the collector was not reached this long after it was needed
  // Fold the calls of communicators all on this host that every member completed alike
  // (relay_fold.h); off: every frame goes on as it came (NCCLWATCH_RELAY_FOLD=off).
  bool fold = true;
  FoldOptions folding;
};

// The relay's writes to the collector gather what its agents sent within kGatherNs of the first
// frame waiting (or kGatherBytes, whichever comes first) into one: the collector then reads a
// host's frames of a poll (its agents poll in step on the host's clock, watchdog/agent.cc) with
// one wake-up, one read and one TCP segment instead of one each per agent frame (at 32,768
// ranks, 41 K reads a second instead of 328 K; docs/scale.md, session 21). Frames wait at most
// kGatherNs more: against the collector's 3 s quiet time and its verdicts' ~200 ms, nothing.
inline constexpr int64_t kGatherNs = 5'000'000;
inline constexpr size_t kGatherBytes = 64u << 10;
inline bool writeDue(size_t waitingBytes, int64_t waitedNs) {
  return waitingBytes >= kGatherBytes || waitedNs >= kGatherNs;
}

// Runs until idle (0), or until the collector cannot be reached or is lost (3: the agents then
// connect directly); 2 for bad options. One line on `log` for each way it ends but idleness.
int runRelay(const Options& options, std::ostream& log);

}  // namespace ncclwatch::relay
