// Incremental alignment for the live collector: keeps, per communicator, the fingerprint of every
// collective ordinal that some but not all members have reported, and the job's last activity.
// It costs one small map lookup per arriving record, so that a collector of thousands of ranks
// runs the full analysis (analysis::analyze) only when the stream shows a reason to: two
// fingerprints at one (comm, ordinal), a member joining or leaving, or the job going quiet.
// The full analysis stays the judge; triage only says when to ask it.
#pragma once
#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>

#include "analysis/recent_two.h"
#include "trace/ring_format.h"

namespace ncclwatch::analysis {

class LiveTriage {
 public:
  // At most `maxOpenPerComm` ordinals are tracked per communicator; past that the oldest are
  // forgotten (counted in `forgotten()`), which only costs the triage its view of them.
  explicit LiveTriage(size_t maxOpenPerComm = 4096) : maxOpen_(maxOpenPerComm) {}
  // It points into itself (recentComms_): not copied.
  LiveTriage(const LiveTriage&) = delete;
  LiveTriage& operator=(const LiveTriage&) = delete;

  // A communicator of the job and its size (from an agent's COMMS frame).
  void addComm(const trace::CommInfo& comm);

  // A record seen for the first time. `wallNs`: the record's latest time (issue, start or
  // completion) on the wall clock, 0 if none. Returns true when the record's collective has a
  // fingerprint other than the one another member reported at the same (comm, ordinal), and
  // when it is the last member's record at an ordinal where members diverged (every member has
  // spoken: the mismatch can be said at once).
  bool observe(const trace::CallRecord& record, int64_t wallNs);
  // Whether the last observe() that returned true completed its ordinal (every member spoke), as
  // opposed to a divergence seen while members are still to report.
  bool lastCompletedOrdinal() const { return lastCompleted_; }
  // Whether the last observe() added a member's record to an ordinal where members already
  // diverged, without completing it (its own fingerprint may match): the mismatch's classes are
  // still filling, and a collector that waits for them says it whole.
  bool lastJoinedDivergence() const { return lastJoinedDivergence_; }
  // A record seen again with a newer state: only its times count, as activity.
  void observeUpdate(int64_t wallNs);
  // Every member completed `commHash`'s collectives through `ordinal` alike (a relay folded
  // them: tools/relay_fold.h): an ordinal still open there from records read elsewhere (a trace
  // file read before its rank connected) will never get the other members' records, and is
  // closed unless its members already diverged.
  void settled(uint64_t commHash, uint64_t ordinal);

  // The oldest collective ordinal on `commHash` that some but not all members have reported, once
  // every member has been seen (an ordinal of the communicator was complete): the collector's
  // windows keep that call (Triage::store), since the ordinal's verdict, a mismatch above all,
  // needs every member's record of it, and a collector that has fallen behind may get the last
  // member's a window's time after the first. UINT64_MAX when there is none. (A communicator
  // whose members were never all seen would keep its calls for ever: a member that never
  // reports.) Also UINT64_MAX for a communicator of more than `largestHeld` members, whose
  // members' windows cannot all be held (Triage::droppable).
  uint64_t oldestOpenOrdinal(uint64_t commHash, int largestHeld = INT_MAX);

  int64_t lastActivityNs() const { return lastActivityNs_; }
  size_t openOrdinals() const;  // (comm, ordinal) pairs some but not all members reported
  uint64_t forgotten() const { return forgotten_; }

 private:
  bool lastCompleted_ = false;
  bool lastJoinedDivergence_ = false;
  struct Open {
    uint64_t fingerprint = 0;
    int reported = 0;
    bool diverged = false;
  };
  struct Comm {
    int size = 0;
    bool completedOne = false;      // an ordinal was reported by every member
    std::map<uint64_t, Open> open;  // by collective ordinal (NCCL's per-comm counter)
  };
  size_t maxOpen_;
  std::unordered_map<uint64_t, Comm> comms_;  // never erased: pointers to its values hold
  // The last two communicators looked up: the map's lookup was 7% of a 32,768-rank collector's
  // time.
  RecentTwo<Comm*> recentComms_;
  Comm* find(uint64_t commHash);
  int64_t lastActivityNs_ = 0;
  uint64_t forgotten_ = 0;
};

// The latest time of a record (issue, start or completion), CLOCK_MONOTONIC; 0 if none.
int64_t latestTime(const trace::CallRecord& record);

}  // namespace ncclwatch::analysis
