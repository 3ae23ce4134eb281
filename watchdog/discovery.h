// Finding the job's collector (docs/protocol.md, "Finding the collector"): an explicit
// NCCLWATCH_COLLECTOR=host:port with NCCLWATCH_SECRET, or, under a torchrun-style launcher, the
// default address MASTER_ADDR:(MASTER_PORT+17) with a secret derived from the ncclUniqueId of
// the first root communicator the process initialises: only the job's ranks received that id.
#pragma once
#include <cstddef>
#include <functional>
#include <string>

#include "trace/job_secret.h"
#include "trace/wire.h"
#include "watchdog/exchange.h"

namespace ncclwatch::watchdog {

inline constexpr int kCollectorPortOffset = trace::wire::kCollectorPortOffset;
using trace::DerivedSecretText;
using trace::kDerivedSecretDigits;

// MASTER_PORT+17, or MASTER_PORT-17 where that would pass 65535.
int defaultCollectorPort(int masterPort);

// The collector this process talks to, read from `lookup` (getenv in the library):
// NCCLWATCH_COLLECTOR=off: none; NCCLWATCH_COLLECTOR=host:port: that one, with NCCLWATCH_SECRET;
// unset: with MASTER_ADDR and MASTER_PORT, the default address (NCCLWATCH_COLLECTOR_PORT
// overrides its port) whose secret is NCCLWATCH_SECRET or, unset, derived later
// (CollectorAddress::secretFromUniqueId). False when there is none. `note` gets one line to
// print when a variable is set but wrong, whether or not a collector is still found.
using EnvironmentLookup = std::function<const char*(const char*)>;
bool collectorFromLookup(const EnvironmentLookup& lookup, CollectorAddress* address,
                         std::string* note);
bool collectorFromEnvironment(CollectorAddress* address, std::string* note);

// The first communicator's commHash, from the interposer inside a root init or from the
// plugin's init: the first offer is kept, later ones are ignored (both doors offer the same
// value for the same communicator). No allocation, no lock: a flag claimed once, a fixed
// buffer, a release store.
void offerCommHashForSecret(uint64_t commHash);
// The secret derived from the offered hash; false until one was offered (watchdog thread).
bool derivedSecret(DerivedSecretText& text);
// In a fork child: an offer that a parent thread had half written is dropped, so that the
// child can offer again.
void forgetUnfinishedSecretAfterFork();

}  // namespace ncclwatch::watchdog
