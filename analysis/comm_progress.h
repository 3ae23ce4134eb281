// Per-communicator progress, kept up to date as records arrive: for each process (one rank's
// window of records) and each communicator in its table, what the hang checks need to know
// without aligning the communicator again: how far the member issued (maxSeq), how far it
// completed (completedSeq: the call before its first pending one), how many calls are pending and
// the head of its stream (the oldest pending call), its last collective ordinal, the highest
// ordinal it completed, and when it was last active. Plus the process's own facts (a pending
// call, a failed call, calls made, shed and tracked completions, its latest record time).
//
// The values are those the alignment (analysis/align.cc) derives from the same window, computed
// by the same rules record by record: a record appended at the window's end costs a lookup of its
// communicator among the process's few and a few compares (no allocation once the vectors have
// their size); a record whose state changed (the collector receives a record again when it
// completes) moves it out of the pending list; records leaving the window's front (the
// collector's trim, every half window) are subtracted from it (droppingFront) at a cost of the
// records dropped plus the few after them up to each affected member's first remaining call,
// when the values the new window gives are certain without a rescan (see droppingFront);
// anything else (a trim that is not, a record inserted in the middle, a changed communicator
// table) rebuilds the process's state from its window.
//
// analysis::analyze builds it from each file's records (rebuild) and IncrementalAnalysis keeps it
// between passes, fed by the collector (incremental.h): the offline and live verdicts use the
// same state and the same code. What it is for (job_state.h): whether the job stalled (the
// members' issued counts), and which communicators are "done" (no member pending, every member at
// the same issued count and last ordinal): those the hang checks need not align again.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/recent_two.h"
#include "trace/ring_reader.h"

namespace ncclwatch::analysis {

// One process's membership of one communicator.
struct MemberProgress {
  uint64_t commHash = 0;
  int commRank = -1;
  uint64_t maxSeq = 0;               // the highest seq it issued on the communicator
  uint64_t completedSeq = 0;         // the seq of its last call before its first pending one
  uint64_t pendingCount = 0;         // calls issued and not finished (isPending)
  uint64_t headRingIndex = 0;        // the ring index of its oldest pending call (pendingCount>0)
  uint64_t lastOrdinal = 0;          // its last collective ordinal, as aligned (0: none)
  uint64_t maxCompletedOrdinal = 0;  // the highest collective ordinal it completed (0: none)
  int64_t lastActivityNs = 0;        // the latest time of its calls (CLOCK_MONOTONIC), 0 if none
  // A record the alignment places by the window's size at the pass (a seq far ahead: a damaged
  // record): its communicator is never "done", so that a pass aligns it.
  bool irregular = false;

  // Internal: what the next record's alignment needs.
  struct Pending {
    uint64_t ringIndex;
    uint64_t seqBefore;  // the seq of the member's call before it in the window, 0 if none
    uint64_t ordinal;    // its collective ordinal, 0 for a send, receive or skipped record
    bool finished;       // no longer pending: left in place until the list is compacted
  };
  // The pending calls in window order from `pendingFront` (the head) on; finished ones stay in
  // place until they outnumber the others, so that a completion costs a binary search, not a
  // move of the list (a window holds up to 65,536 calls).
  std::vector<Pending> pending;
  size_t pendingFront = 0;
  struct P2pMax {
    int64_t peerAndDirection;
    uint64_t p2pSeq;
  };
  std::vector<P2pMax> p2pMax;  // the highest p2pSeq per (peer, direction)
  // Where each (peer, direction) is in p2pMax, once there are more than a few (an all-to-all
  // has two per peer).
  std::unordered_map<int64_t, uint32_t> p2pIndex;
  uint64_t p2pSum = 0;  // their sum: what a seq counts of sends and receives
  uint64_t base = 0;    // the first collective ordinal in the window
  bool anyCollective = false;
  uint64_t lastSeq = 0;  // the seq of its last call in window order
  // What a trim of the window's front needs to know it can drop records without a rescan: the
  // last collective candidate (seq - p2pSum) in window order, whether every candidate exceeded
  // the one before it (then each got its candidate as ordinal, and the first remaining one is
  // the new base), and whether one ever exceeded lastOrdinal + 1 by more than 4096 (the least
  // distance at which the alignment drops a record as far ahead, whatever the window's size:
  // without such a jump no subset of the window has an irregular record).
  uint64_t lastCandidate = 0;
  bool candidatesAscend = true;
  bool farJump = false;
  // The member's aligned calls, kept while they are plain: no send or receive in the window, and
  // each of its other sequenced calls, in window order, at the ordinal after the one before (no
  // gap, no repeat). Then they are the alignment's coll and keys for this member (job_state.h,
  // Member): the window positions of its calls by ordinal from `base`, and their alignKey. A pass
  // views these 12 bytes a call instead of reading every record of the window (128 bytes each):
  // at 32,768 ranks, 4 M records and 512 MB a pass (align.cc, takeKeptAlignment).
  bool keepsAligned = true;  // its communicator is large enough (ProcessProgress::keepAlignedFrom)
  bool alignedPlain = true;
  std::vector<uint32_t> alignedPositions;
  std::vector<uint64_t> alignedKeys;
  uint32_t splits = 0;  // splits among them (Member::madeSplit)
  // Not plain: the window position from which its calls are plain (they were not because of a
  // send or receive there, or of a call there followed by one at an ordinal not the next); plain
  // again once the call there left the window.
  uint32_t notPlainAt = 0;
  uint32_t lastCollectivePosition = 0;  // the window position of its last call but sends/receives
};

// One process's progress: its memberships (its communicator table's order, each hash once: the
// alignment's order) and the facts of its window.
class ProcessProgress {
 public:
  // From scratch: `file`'s communicator table and window.
  void rebuild(const trace::TraceFile& file);
  // Members of communicators of at least `ranks` ranks keep their aligned calls (the next
  // rebuild on).
  void keepAlignedFrom(int ranks) { keepAlignedFrom_ = ranks; }
  int keepsAlignedFrom() const { return keepAlignedFrom_; }
  // `file.records.back()` was just appended to the window this state follows.
  void appended(const trace::TraceFile& file);
  // A record of the window was replaced in place by a newer copy of it (`before` -> `after`, the
  // same ring index): its state or times changed. `file` is the window after the change.
  void replaced(const trace::TraceFile& file, const trace::CallRecord& before,
                const trace::CallRecord& after);
  // The first `count` records of `file`, the window this state follows, are about to leave it
  // (the caller erases them next): afterwards this state follows the window without them, as a
  // rebuild from it would. Exact and O(count + a few) when no dropped record is pending or a
  // send or receive, none holds a member's highest seq, ordinal or completed ordinal (then its
  // member keeps a call in the window), the members' candidates ascend without a far jump and
  // the window's ring indices ascend; otherwise a rebuild from the remaining records. True when
  // no rebuild was needed.
  bool droppingFront(const trace::TraceFile& file, size_t count);
  // Whether this state follows `file`: the same communicator table and window bounds (a window
  // changed without this state being told needs a rebuild).
  bool follows(const trace::TraceFile& file) const;

  std::span<const MemberProgress> members() const { return {members_.data(), memberCount_}; }
  const MemberProgress* member(uint64_t commHash) const;

  uint64_t pendingCalls() const { return pendingCalls_; }  // isPending, any record
  // The window position of the first pending record (pendingCalls() > 0): every record before
  // it is finished, so the hang checks look for pending calls from there on.
  uint32_t firstPendingPosition() const { return pendingAll_[pendingAllFront_].position; }
  uint64_t failedCalls() const { return failedCalls_; }       // isFailedCall
  uint64_t calls() const { return calls_; }                   // collectives, sends and receives
  uint64_t shed() const { return shed_; }                     // ... left untracked (kRecordShed)
  uint64_t trackedCalls() const { return tracked_; }          // ... whose completion was tracked
  int64_t latestRecordNs() const { return latestRecordNs_; }  // CLOCK_MONOTONIC, 0 if none
  uint64_t rebuilds() const { return rebuilds_; }             // rebuilds, for tests
  uint64_t trims() const { return trims_; }  // droppingFront calls done without a rebuild

 private:
  void rebuildFrom(std::span<const trace::CommInfo> comms, trace::RecordRange records);
  // droppingFront without a rebuild; false (nothing changed) when that would not be exact.
  bool trimFront(trace::RecordRange dropped, trace::RecordRange kept);
  void countFacts(const trace::CallRecord& record, bool pending, int sign);
  void add(const trace::CallRecord& record, uint32_t position, size_t windowSize);
  // Marks the pending record at `ringIndex` finished; false if it is not in the list.
  bool finishPending(uint64_t ringIndex);
  int slotOf(uint64_t commHash);
  static uint64_t tableSignature(std::span<const trace::CommInfo> comms);

  std::vector<MemberProgress> members_;  // the first memberCount_ are in use (capacity kept)
  size_t memberCount_ = 0;
  RecentTwo<int> recentSlots_;  // slotOf's last two communicators
  int keepAlignedFrom_ = kKeptAlignmentMinRanks;
  uint64_t pendingCalls_ = 0, failedCalls_ = 0, calls_ = 0, shed_ = 0, tracked_ = 0;
  // Every pending record, in window order from pendingAllFront_ on (finished ones left in
  // place until compacted, as MemberProgress::pending).
  struct PendingCall {
    uint64_t ringIndex;
    uint32_t position;
    bool finished;
  };
  std::vector<PendingCall> pendingAll_;
  size_t pendingAllFront_ = 0;
  bool ascending_ = true;  // the window's ring indices ascend (a binary search finds a record)
  int64_t latestRecordNs_ = 0;
  // The window this state follows.
  uint64_t table_ = 0;
  size_t records_ = 0;
  uint64_t firstRing_ = 0, lastRing_ = 0;
  bool built_ = false;
  uint64_t rebuilds_ = 0;
  uint64_t trims_ = 0;
  // trimFront's scratch, per member slot (kept to spare an allocation per trim).
  struct TrimMember {
    bool dropped;    // it has records among those dropped
    bool found;      // its first remaining call was found
    bool activity;   // a dropped record may hold its lastActivityNs
    bool headFirst;  // its first remaining call is its pending head
    uint64_t base;   // the ordinal of its first remaining collective
  };
  std::vector<TrimMember> trimScratch_;
};

// What a communicator's members' progress says of it (job_state.h reads it per pass).
struct CommProgress {
  // No member has a pending call, and every member issued as many calls and reached the same
  // last collective ordinal, by regular records: nothing on it waits, and no member is behind.
  bool done = true;
  bool countsDiffer = false;         // the members' issued counts (maxSeq) differ
  uint64_t maxCompletedOrdinal = 0;  // a collective at or below it finished on some member
  uint64_t completedByAll = 0;       // the lowest of the members' maxCompletedOrdinal
  // Adds a member (`first`: the first, which starts over).
  void add(const MemberProgress& member, bool first);

 private:
  uint64_t firstMaxSeq_ = 0;
  uint64_t firstLastOrdinal_ = 0;
};

}  // namespace ncclwatch::analysis
