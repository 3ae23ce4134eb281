// Timing across ranks: one clock for every rank of a job, and how late each rank arrives at the
// collectives it shares with the others.
//
// Clocks. Ranks of one host share CLOCK_MONOTONIC, so they need no correction between them. Hosts
// do: their wall clocks (what the ring header's anchors relate monotonic time to) are only as good
// as NTP, often off by milliseconds. A collective completes at nearly the same instant on every
// rank, so each host's offset is the one that best aligns (median) its completion times of the
// collectives it shares with the other hosts. Wall clocks are only the starting point, and the
// answer for a host that shares no completed collective with another.
//
// Lateness. For each collective every member issued, a rank's lateness is its (aligned) issue
// time minus the earliest member's: 0 for the first to arrive, and for the last, how long the
// others waited for it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "trace/ring_reader.h"

namespace ncclwatch::analysis {

// One collective as the members that issued it recorded it.
struct CollectiveInstance {
  uint64_t commHash = 0;
  uint64_t ordinal = 0;  // the call's seq minus the point-to-point calls before it on this comm
  trace::OpKind op = trace::OpKind::kUnknown;
  int commSize = 0;
  struct Member {
    size_t file = 0;    // index into the files given
    size_t record = 0;  // index into that file's records
  };
  std::vector<Member> members;  // one per file, in file order
  bool sameOp = true;           // false: the members disagree on the op (a mismatch)
};

// Every collective of every communicator, ordered by (comm, ordinal). Files that are not usable
// are skipped. Point-to-point calls pair differently (per peer) and are left out.
std::vector<CollectiveInstance> matchCollectives(std::span<const trace::TraceFile> files);

struct HostClock {
  std::string host;
  std::vector<size_t> files;  // indices of its files
  int64_t wallOffsetNs = 0;   // what its wall clock says: realtime minus monotonic
  int64_t offsetNs = 0;       // aligned time = its CLOCK_MONOTONIC + offsetNs
  size_t collectives = 0;     // shared completed collectives the offset rests on (0: wall)
  bool reference = false;     // the host the others are aligned to (offset = wall offset)
};

struct ClockAlignment {
  std::vector<HostClock> hosts;
  std::vector<int> hostOfFile;  // per file given: index into hosts, -1 for unusable files
  // `monotonicNs` of file `file` on the common clock (ns, close to the reference host's wall
  // clock); 0 stays 0 (a time never recorded).
  int64_t aligned(size_t file, int64_t monotonicNs) const;
  // The correction the alignment made to a host, relative to what wall clocks said.
  int64_t correctionNs(size_t host) const;
};

ClockAlignment alignClocks(std::span<const trace::TraceFile> files,
                           std::span<const CollectiveInstance> collectives);
ClockAlignment alignClocks(std::span<const trace::TraceFile> files);

// How late one rank arrives on one communicator.
struct RankLateness {
  int rank = -1;         // global rank
  size_t file = 0;       // its file
  int calls = 0;         // collectives it shared with all the other members
  int last = 0;          // of those, how many it was the last to issue
  int64_t medianNs = 0;  // lateness: issue time minus the earliest member's
  int64_t p95Ns = 0;
  int64_t maxNs = 0;
  double lastShare() const { return calls == 0 ? 0.0 : static_cast<double>(last) / calls; }
};

struct CommLateness {
  CommDesc comm;
  std::string what;     // "allreduces" when every collective is one op, else "collectives"
  int collectives = 0;  // collectives every member issued
  std::vector<RankLateness> ranks;  // by rank
};

// A rank the others wait for, with the sentence a user reads.
struct Straggler {
  int rank = -1;
  uint64_t commHash = 0;
  double lastShare = 0;
  int64_t medianNs = 0;
  std::string reading;  // "rank 3 arrives last in 92% of allreduces on comm 9f3a…(world, 8
                        // ranks), 20.0 ms late at the median: it is the straggler the others wait
                        // for"
};

struct StragglerOptions {
  double minLastShare = 0.6;        // last in at least this share of a comm's collectives
  int64_t minMedianNs = 1'000'000;  // and late by at least this much at the median
  int minCalls = 3;                 // on at least this many collectives
};

struct StragglerReport {
  ClockAlignment clocks;
  int ranks = 0;
  std::vector<CommLateness> comms;    // comms of 2 ranks or more with shared collectives
  std::vector<Straggler> stragglers;  // most significant first
};

StragglerReport computeStragglers(std::span<const trace::TraceFile> files,
                                  const StragglerOptions& options = {});

// "20.0 ms", "350 us", "1.25 s".
std::string durationText(int64_t ns);

}  // namespace ncclwatch::analysis
