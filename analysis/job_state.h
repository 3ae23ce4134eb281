// Internal to analysis/ (never included from outside it): the state one job's analysis builds
// from its ring files, and the entry point of every check family. analyze.cc drives them in the
// order of JobAnalysis::run; each family lives in its own file:
//   align.cc                 aligning members on (comm, ordinal), p2p pairing keys, wait points
//   check_mismatches.cc      fingerprint mismatches and wrong split colours
//   check_p2p.cc             sends and receives that do not pair up
//   check_hangs.cc           whether the job stalled; dead and missing ranks; missing-rank cycles
//   check_wait_for_graph.cc  the wait-for graph: deadlocks, stuck collectives, stuck p2p pairs
//   check_init.cc            init and split hangs
//   check_errors.cc          failed NCCL calls and what they leave waiting
//   check_stragglers.cc      ranks that arrive last again and again (information)
//   finish_verdicts.cc       consequences, order, confidence, evidence gaps, stack tops, summary
//
// State comes in two kinds, so that a later pass can redo only what changed:
//  - per communicator (`Comm`): its members' aligned calls and its completed-ordinal watermark.
//    The structural checks with a per-comm entry point (checkMismatches(Comm&),
//    checkColours(Comm&, ...), checkP2p(Comm&), checkStuckP2p(const Comm&, ...)) read only their
//    comm's state and the records of its members.
//  - per job: the processes, the comm index, pending ordinals per process, the pending and
//    completed p2p transfer keys, whether the job stalled, and the verdicts. The hang checks
//    (dead/missing, the wait-for graph, init) and stragglers look across communicators.
//  - kept as records arrive (comm_progress.h), per process and membership: issued and completed
//    counts, pending calls, last ordinal. Whether the job stalled comes from it, and so does
//    which communicators are "done" (nothing pending, no member behind): the hang checks read
//    only the alignment of the others, so a pass that runs them need not align the done ones
//    (JobAnalysis::chooseRedo says why no verdict changes).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/comm_progress.h"
#include "analysis/incremental.h"
#include "trace/fingerprint.h"
#include "trace/ring_reader.h"

namespace ncclwatch::analysis::internal {

using trace::CallRecord;
using trace::OpKind;
using trace::RecordState;

inline constexpr uint32_t kNone = UINT32_MAX;

inline bool isTeardown(OpKind op) {
  return op == OpKind::kDestroy || op == OpKind::kFinalize || op == OpKind::kAbort ||
         op == OpKind::kRevoke;
}
inline bool isTracked(const CallRecord& r) {
  return (r.flags & (trace::kRecordCaptured | trace::kRecordNoEvents)) == 0;
}
// Issued (or started) and not finished. Lifecycle calls are host-synchronous: one still
// "issued" never returned. Untracked collectives never leave "issued": they are not pending.
inline bool isPending(const CallRecord& r) {
  if (r.state != RecordState::kIssued && r.state != RecordState::kStarted) return false;
  if (trace::isLifecycle(r.op)) return r.state == RecordState::kIssued;
  return isTracked(r);
}
// Started, and the events saw it start (NCCLWATCH_EVENTS=full, the plugin's kernel events): not
// a start inferred from stream order (one event per call), behind which work queued on the
// stream outside NCCL, such as a wait on another stream's event, may still hold the call.
inline bool startSeen(const CallRecord& r) {
  return r.state == RecordState::kStarted && (r.flags & trace::kRecordStartInferred) == 0;
}
// A call NCCL refused or reported failed (not "in progress").
inline bool isFailed(const CallRecord& r) {
  return isFailedCall(r);
}
using trace::isSequenced;
// Whether two in-group calls of one process may be of one ncclGroupStart/End, as far as their
// records tell (CallRecord::groupSerial; 0 where it is not known): calls of two groups run one
// launch after the other, so the second waits for the first to finish.
inline bool sameGroup(const CallRecord& a, const CallRecord& b) {
  return a.groupSerial == 0 || b.groupSerial == 0 || a.groupSerial == b.groupSerial;
}
// What two ranks must agree on at the same ordinal. Splits agree on the op only (their colours
// legitimately differ; the colour check looks at them).
inline uint64_t alignKey(const CallRecord& r) {
  if (r.op == OpKind::kSplit || r.op == OpKind::kShrink || trace::isLifecycle(r.op)) {
    return static_cast<uint64_t>(r.op);
  }
  return r.fingerprint ^ (static_cast<uint64_t>(r.op) << 56);
}

// One process (one rank's ring file) of the job.
struct Proc {
  const trace::TraceFile* file = nullptr;
  // file->records, read through here: the window's ring (base, capacity, oldest slot) next to
  // the other facts a pass reads, instead of behind the file's pointer at every record.
  trace::RecordRange records;
  int rank = -1;
  int64_t toWall = 0;  // add to a record time (CLOCK_MONOTONIC) for CLOCK_REALTIME
  bool alive = false;
  bool clean = false;
  // What it passed to exit(), when its trace or BYE says (exitStatusKnown): a clean end with a
  // non-zero status is a failure (Python exits 1 after an uncaught exception).
  std::optional<int> exitStatus;
  int64_t lastActivity = 0;  // wall
  // Facts of its records, from one scan (analyzeJobs): the passes read them, not the records.
  bool pending = false;     // has a pending call
  bool failed = false;      // has a failed call
  uint64_t calls = 0;       // collectives and sends/receives
  uint64_t shed = 0;        // of which left untracked for want of a free CUDA event
  bool anyTracked = false;  // whether any of them had its completion tracked
  const ProcessProgress* progress = nullptr;  // kept on arrival (comm_progress.h)
  const CallRecord& rec(uint32_t i) const { return records[i]; }
  int64_t wall(int64_t t) const { return t == 0 ? 0 : t + toWall; }
};

// One process's membership of a communicator: its calls aligned on the comm's ordinals.
struct Member {
  int proc = 0;
  int commRank = -1;
  uint64_t base = 0;  // ordinal of coll[0]
  // Record index by ordinal - base, kNone for a gap: ownColl, filled from the member's records
  // (align.cc, alignProc), or the calls its progress kept (comm_progress.h, alignedPositions),
  // which outlives the pass: a view, so that a pass neither copies nor frees them (at 32,768
  // ranks the copies and their frees were a third of a divergence's pass).
  std::span<const uint32_t> coll;
  // alignKey of the record at each coll entry (0 for a gap), taken while alignment has the record
  // at hand: the divergence search reads 8 bytes a call from here instead of a 128-byte record
  // from each member's window (at 32,768 ranks, 2 M records scattered over 540 MB).
  std::span<const uint64_t> keys;
  std::vector<uint32_t> ownColl;
  std::vector<uint64_t> ownKeys;
  std::vector<uint32_t> p2p;  // record indices of sends and receives, in issue order
  uint64_t maxSeq = 0;
  uint64_t completedSeq = 0;
  uint64_t pendingCount = 0;
  bool prefixBroken = false;
  const MemberProgress* progress = nullptr;  // the same facts, kept on arrival
  // What alignment folds into its Comm (maxCompletedOrdinal, hasSplits) once every process is
  // aligned: the highest ordinal of a collective it completed, and whether it called a split.
  uint64_t completedCollective = 0;
  bool madeSplit = false;
  uint64_t lastOrdinal() const { return coll.empty() ? 0 : base + coll.size() - 1; }
  Member() = default;
  // Moved (its views stay on the same storage), never copied (they would not follow).
  Member(Member&&) = default;
  Member& operator=(Member&&) = default;
  Member(const Member&) = delete;
  Member& operator=(const Member&) = delete;
  uint32_t at(uint64_t ordinal) const {
    if (ordinal < base || ordinal >= base + coll.size()) return kNone;
    return coll[ordinal - base];
  }
};

// A communicator's members by comm rank. Ranks within the communicator's size (all of them, unless
// a table is damaged) index a vector: a hash map took one allocation per member and pass, 32,768
// of them for a divergence's pass over the world communicator of a 32k-rank job.
class MemberIndex {
 public:
  explicit MemberIndex(int size = 0) : dense_(size > 0 && size <= kMaxDense ? size : 0, -1) {}
  void set(int commRank, int member) {
    if (commRank >= 0 && static_cast<size_t>(commRank) < dense_.size()) {
      dense_[commRank] = member;
    } else {
      sparse_[commRank] = member;
    }
  }
  // The member index of `commRank`, -1 if no member has it.
  int find(int commRank) const {
    if (commRank >= 0 && static_cast<size_t>(commRank) < dense_.size()) return dense_[commRank];
    auto it = sparse_.find(commRank);
    return it == sparse_.end() ? -1 : it->second;
  }

 private:
  static constexpr int kMaxDense = 1 << 22;  // a damaged size takes no memory for it
  std::vector<int> dense_;
  std::unordered_map<int, int> sparse_;
};

// The per-communicator state.
struct Comm {
  uint64_t hash = 0;
  CommDesc desc;
  int kind = 0;
  std::vector<Member> members;
  MemberIndex byCommRank;            // comm rank -> member index
  uint64_t maxCompletedOrdinal = 0;  // a collective at or below it finished everywhere
  bool hasSplits = false;  // a member's aligned calls include ncclCommSplit (checkColours)
  CommProgress progress;   // its members' progress (comm_progress.h), aligned or not
};

// A send or receive by (comm, sender, receiver, p2pSeq) in comm ranks.
struct TransferKey {
  uint64_t comm;
  int sender;
  int receiver;
  uint64_t p2pSeq;
  bool operator==(const TransferKey&) const = default;
};
struct TransferHash {
  size_t operator()(const TransferKey& k) const {
    uint64_t ranks = static_cast<uint64_t>(static_cast<uint32_t>(k.sender)) << 32 |
                     static_cast<uint32_t>(k.receiver);
    return static_cast<size_t>(trace::mix64(k.comm ^ trace::mix64(ranks ^ trace::mix64(k.p2pSeq))));
  }
};

// One communicator's share of the straggler check: how many of its collectives every member
// joined, and per member that arrived last by stragglerLagNs, how often, by how much, when first
// and at which seq last.
struct StragglerTally {
  int joinedEach = 0;
  struct Late {
    int proc = 0;
    int count = 0;
    std::vector<int64_t> lags;
    int64_t first = 0;
    uint64_t lastSeq = 0;
  };
  std::vector<Late> late;
};

// What a pass keeps per communicator for a later partial pass (analysis/incremental.h): the
// verdicts of its structural checks, its straggler tally and its summary.
struct CommCache {
  std::vector<Verdict> structural;  // checkMismatches(comm): mismatches and split colours
  std::vector<Verdict> p2p;         // checkP2p(comm)
  StragglerTally tally;
  CommSummary summary;
  bool readsOtherComms = false;  // a verdict describes where absent members are elsewhere
  // The job's state its p2p verdicts were drawn in (JobAnalysis::jobState: whether the job
  // stalled, which ranks are dead; checkP2p reads both, for pending calls only), 0 for the state
  // of a job that runs: a later pass in another state draws them again unless the comm is done.
  uint64_t jobState = 0;
};

// What the passes over one job (job id, attempt) keep between them.
struct JobCache {
  bool valid = false;     // the last pass met the conditions of a partial pass
  uint64_t identity = 0;  // the processes, their liveness and their communicator tables
  std::unordered_map<uint64_t, CommCache> comms;
};

// The analysis of one job (job id, attempt).
class JobAnalysis {
 public:
  JobAnalysis(std::vector<Proc> procs, const Options& options, int64_t now)
      : procs_(std::move(procs)), options_(options), now_(now) {}
  // A pass that keeps its per-communicator results in `cache`, and redoes only the
  // communicators in `dirty` when the kept ones are still good (incremental.h); dirty == nullptr:
  // a full pass that refills the cache.
  JobAnalysis(std::vector<Proc> procs, const Options& options, int64_t now, JobCache* cache,
              const std::unordered_set<uint64_t>* dirty)
      : procs_(std::move(procs)), options_(options), now_(now), cache_(cache), dirty_(dirty) {}
  // A partial pass made for a divergence: the redone communicators keep their straggler tallies
  // from the last pass (the tally reads every member's whole window, 15% of such a pass at
  // 32,768 ranks, and a straggler verdict is information that can wait a pass; a mismatch
  // cannot), and their hashes go to `deferred`, for the next pass to redo.
  void deferStragglerTallies(std::vector<uint64_t>* deferred) { talliesDeferred_ = deferred; }

  JobReport run(const std::string& jobId, int attempt);  // analyze.cc
  bool partial() const { return partial_; }
  // A partial pass that ran the hang checks (over the communicators not done).
  bool hangChecks() const { return partial_ && hangChecks_; }
  const char* whyHangChecks() const { return whyHang_; }
  uint64_t progressDisagreements() const { return progressDisagreements_; }
  uint64_t membersFromKept() const { return membersFromKept_; }
  uint64_t membersFromRecords() const { return membersFromRecords_; }
  const char* whyFull() const { return whyFull_; }
  size_t commsRedone() const {
    size_t redone = 0;
    for (const Comm& comm : comms_) redone += aligned(comm) ? 1 : 0;
    return redone;
  }

 private:
  // ----- align.cc: building the state -----
  void buildComms();
  // In a partial pass, the communicators to align besides the touched ones: those not done when
  // the hang checks run (they read their alignment) or when their kept p2p verdicts were drawn in
  // another job state.
  void chooseRedo();
  // One thread's tallies for alignProc, reused from process to process; the pending transfers
  // it found, merged into pendingP2p_ after.
  struct AlignScratch {
    std::vector<std::unordered_map<int64_t, uint64_t>> p2pMax;
    std::vector<uint64_t> p2pSum;
    std::vector<TransferKey> pendingP2p;
    std::vector<char> fromRecords;  // per membership: aligned from the records (not kept)
    uint64_t fromKept = 0, fromRecordsCount = 0;  // members aligned each way
  };
  // `aligned`: per membership (procMembers_.entries), whether to align it.
  void alignAll(const std::vector<char>& aligned);
  void alignProc(int proc, std::span<const char> aligned, AlignScratch& scratch);
  // Fills `m` from its kept aligned calls when its progress has them (plain, nothing pending):
  // what alignProc would find in its records. False when it must be aligned from them.
  bool takeKeptAlignment(Member& m) const;
  // Counts aligned members whose progress (comm_progress.h) differs from their alignment.
  void compareProgress(const Comm& comm);
  void findCompletedTransfers();
  void alignSkipped();
  void excludeShrunkMembers();
  // The earliest pending call of a process (in its window's order) not done elsewhere: where it
  // waits. kNone if none.
  uint32_t waitPoint(int proc) const;
  static constexpr uint32_t kUnknownWaitPoint = kNone - 1;
  mutable std::vector<uint32_t> waitPoints_;  // per proc, once found in this pass
  // A pending collective whose ordinal finished on some rank: its state here is stale.
  bool impliedDone(int proc, uint32_t index) const;
  CallDesc whereIs(int proc) const;

  // ----- check_mismatches.cc (per comm) -----
  void checkMismatches();
  void checkMismatches(Comm& comm);
  // A split class's colours when its members passed different ones (CallDesc::colours).
  void noteColours(const Comm& comm, const std::vector<int>& members, uint64_t ordinal,
                   CallDesc& call) const;
  uint64_t firstDivergentOrdinal(const Comm& comm, uint64_t lo, uint64_t hi) const;
  // A split every member's window holds: its ordinal, the first member's seq of it, and the
  // colour each member passed (comm rank -> colour; NCCL_SPLIT_NOCOLOR left out). Read once a
  // pass for checkGroupSplits and checkColours.
  struct SplitColours {
    uint64_t ordinal = 0;
    uint64_t seq = 0;
    std::map<int, int> colourOf;
  };
  std::vector<SplitColours> splitsHeldByAll(const Comm& comm) const;
  // One class per colour of `split`, in colour order: its members' global ranks (in comm rank
  // order) and the call of the first.
  void addColourClasses(const Comm& comm, const SplitColours& split, Verdict& v) const;
  void checkColours(Comm& comm, const std::vector<SplitColours>& splits);
  // The culprits (comm ranks) of a verdict at `ordinal` as global ranks, and its divergence: the
  // earliest of their calls there.
  void nameCulpritsAt(const Comm& comm, const std::vector<int>& commRanks, uint64_t ordinal,
                      Verdict& v) const;
  // Splits issued by PyTorch's new_group() whose members passed two colours; true when it said so.
  bool checkGroupSplits(Comm& comm, const std::vector<SplitColours>& splits);
  // The torch.distributed function that issued record `index` of `proc` ("" when unknown).
  std::string pythonApiAt(const Proc& proc, uint32_t index) const;
  // The most common difference between two members' call sites over the calls before
  // `before` on which they agree: the load-address offset between their processes; 0 unknown.
  int64_t siteDelta(const Comm& comm, int a, int b, uint64_t before) const;
  // Whether the calls of two members at two ordinals came from the same line of code (true
  // when their sites cannot tell).
  bool sameSite(const Comm& comm, int a, uint64_t ka, int b, uint64_t kb, uint64_t before) const;
  // Whether any of `members` made a call of alignment key `key` at an ordinal before `before`
  // (within its window).
  bool madeBefore(const Comm& comm, uint64_t key, std::initializer_list<int> members,
                  uint64_t before) const;

  // ----- check_p2p.cc (per comm) -----
  void checkP2p();
  void checkP2p(Comm& comm);
  // A cycle of receives each waiting for a send that its peer's stream runs only after that
  // peer's own pending receive (`recv(peer); send(peer)` on both sides): a deadlock where every
  // send has its receive. Adds the verdict and returns true when it finds one.
  bool checkP2pOrderDeadlock(
      const Comm& comm, const std::vector<std::unordered_map<int, std::vector<uint32_t>>>& sendsTo);
  // What a member's first pending send or receive waits for (checkP2pOrderDeadlock): the peer's
  // matching call, held on its stream behind a pending call of its own.
  struct P2pWait {
    int peer = -1;           // member index
    uint32_t mine = 0;       // the member's receive or send
    uint32_t theirs = 0;     // the peer's matching send or receive, queued
    uint32_t ahead = 0;      // the peer's pending call ahead of it on its stream
    bool sendFirst = false;  // the member's call is a send
  };
  void sayP2pOrderDeadlock(const Comm& comm, const std::vector<int>& cycle,
                           const std::vector<P2pWait>& waitsOn);

  // ----- check_hangs.cc -----
  void decideStalled();
  void checkDeadAndMissing();
  // The first collective ordinal past `gone`'s last on `comm` in which another member waits
  // (pending, not done elsewhere); 0 when none waits for what `gone` never issued.
  uint64_t leftBehind(const Comm& comm, const Member& gone) const;
  bool heldBehindAnEarlierCall(int proc, uint32_t index) const;
  bool cycleThroughAHeldHost(const Comm& comm, const RankClass& waiting,
                             const std::vector<int>& missing);
  bool brokeItsOwnOrder(int proc) const;
  void breakMissingCycles();

  // ----- check_wait_for_graph.cc -----
  void checkGraph();
  // `heads`: per process, the record indices at the heads of its streams, ascending.
  void checkStuckP2p(const std::vector<std::vector<uint32_t>>& heads);
  void checkStuckP2p(const Comm& comm, const std::vector<std::vector<uint32_t>>& heads);

  // ----- check_init.cc -----
  void checkInit();

  // ----- check_errors.cc -----
  void checkErrors();
  // Whether some other member of `hash` waits there (a pending call not done elsewhere).
  bool othersWaitOn(uint64_t hash, int except) const;

  // ----- check_stragglers.cc -----
  void checkStragglers();
  StragglerTally tallyStragglers(const Comm& comm) const;

  // ----- analyze.cc: partial passes -----
  // Whether nothing the cross-communicator checks look at can fire in this pass: every process
  // alive, with a communicator and without a failed call, the job not quiet. Returns "" when it
  // holds, else why not (IncrementalAnalysis::Stats::hangBecause). A shrunk communicator makes
  // the pass a full one before this is asked (hasShrink).
  const char* crossCommChecksQuiet() const;
  uint64_t identity() const;
  bool hasShrink() const;
  // What the p2p check reads of the job's state (stalled, dead ranks), 0 when neither.
  uint64_t jobState() const;
  // Whether this pass runs the cross-communicator (hang) families.
  bool hangFamilies() const { return !partial_ || hangChecks_; }
  // Whether this pass aligns and checks `comm` (a full pass: all of them).
  bool redo(const Comm& comm) const { return !partial_ || redo_.count(comm.hash) != 0; }
  // Whether this pass aligns `comm`: those it redoes, and in a partial pass those not done that
  // the hang checks read (chooseRedo), whose kept structural verdicts, tallies and summaries
  // stand (they are untouched) and whose p2p verdicts are drawn again (they read the job's
  // state).
  bool aligned(const Comm& comm) const { return redo(comm) || alignOnly_.count(comm.hash) != 0; }
  CommSummary summarize(const Comm& comm) const;

  // ----- finish_verdicts.cc -----
  void finishVerdicts();
  void assessConfidence();
  void noteEvidenceGaps(JobReport& report) const;
  std::vector<int> untracedRanks(int world) const;
  bool checkRootInitWait(const std::vector<int>& none);
  const Proc* procOfRank(int rank) const;
  void restsOnTiming(Verdict& v) const;
  void addStackTops();
  void summarize(JobReport& report);

  Verdict make(VerdictKind kind, const Comm* comm, uint64_t seq) const {
    Verdict v;
    v.kind = kind;
    if (comm != nullptr) v.comm = comm->desc;
    v.seq = seq;
    v.detectionNs = now_;
    return v;
  }
  CallDesc describe(const Proc& proc, uint32_t index) const {
    CallDesc call = describeCall(proc.rec(index));
    call.callRank = proc.rank;
    return call;
  }
  int globalRank(const Comm& comm, int commRank) const {
    int member = comm.byCommRank.find(commRank);
    return member < 0 ? -1 : procs_[comm.members[member].proc].rank;
  }
  uint64_t ordinalOf(int proc, uint32_t index) const {
    auto it = pendingOrdinal_[proc].find(index);
    return it == pendingOrdinal_[proc].end() ? 0 : it->second;
  }
  // The comm rank of proc `p` on the communicator `hash`, -1 if it is not a member.
  int memberRank(int p, uint64_t hash) const {
    auto c = commIndex_.find(hash);
    if (c == commIndex_.end()) return -1;
    for (const Member& m : comms_[c->second].members) {
      if (m.proc == p) return m.commRank;
    }
    return -1;
  }

  // Per job.
  std::vector<Proc> procs_;
  const Options& options_;
  int64_t now_;
  // Per communicator, and where each is by hash.
  std::vector<Comm> comms_;
  std::unordered_map<uint64_t, int> commIndex_;
  std::vector<std::unordered_map<uint32_t, uint64_t>>
      pendingOrdinal_;                                        // per proc: pending record -> ordinal
  std::unordered_set<TransferKey, TransferHash> pendingP2p_;  // pending on some side
  std::unordered_set<TransferKey, TransferHash> completedP2p_;  // ... and completed on another
  bool stalled_ = false;
  bool stalledByQuiet_ = false;  // stalled only because nothing moved for quietNs
  bool ended_ = false;
  int64_t jobLastActivity_ = 0;
  std::vector<Verdict> verdicts_;
  std::set<int> deadRanks_;  // proc indices judged dead
  // Partial passes (incremental.h).
  JobCache* cache_ = nullptr;
  const std::unordered_set<uint64_t>* dirty_ = nullptr;
  bool partial_ = false;
  bool hangChecks_ = false;  // a partial pass that runs the hang families
  const char* whyHang_ = "";
  uint64_t progressDisagreements_ = 0;
  uint64_t membersFromKept_ = 0, membersFromRecords_ = 0;
  bool abandoned_ = false;  // a partial pass found it needs the other comms too (alignSkipped)
  const char* whyFull_ = "first";
  mutable bool readsOtherComms_ = false;    // set by whereIs
  std::unordered_set<uint64_t> redo_;       // in a partial pass: the comms aligned and checked
  std::unordered_set<uint64_t> alignOnly_;  // ... and those only aligned (chooseRedo)
  std::vector<uint64_t>* talliesDeferred_ = nullptr;  // deferStragglerTallies
  // Per process, its memberships in its comm table's order: (hash, (comm index, member index)),
  // every process's in one list: a list a process took two allocations and two frees a pass,
  // a third of a divergence's pass at 32,768 ranks.
  struct Memberships {
    using Entry = std::pair<uint64_t, std::pair<int, int>>;
    std::vector<Entry> entries;
    std::vector<size_t> starts;  // process p's: entries[starts[p], starts[p + 1])
    std::span<const Entry> of(int p) const {
      return {entries.data() + starts[static_cast<size_t>(p)],
              entries.data() + starts[static_cast<size_t>(p) + 1]};
    }
  };
  Memberships procMembers_;
};

// The state of an IncrementalAnalysis (incremental.h): per job, what the last pass kept; what
// changed since.
struct IncrementalState {
  std::map<std::string, JobCache> jobs;  // by "job/attempt"
  std::unordered_set<uint64_t> dirty;
  // Hashes certainly in `dirty`, by their low bits: the collector touches a communicator per
  // record stored, and most are the few its frames alternate between. A hash found here skips
  // the set's insert; cleared whenever `dirty` is changed other than by touch(). (Hash 0 is the
  // empty slot's value: it always goes to the set.)
  std::array<uint64_t, 1024> recentlyDirty{};
  bool all = true;
  // A divergence's own pass (IncrementalAnalysis::analyzeFirst): the communicators whose
  // straggler tallies it kept from the last pass instead of redoing them go here, to be redone
  // by the next pass.
  bool divergencePass = false;
  std::vector<uint64_t> talliesDeferred;
  IncrementalAnalysis::Stats stats;
  // Per file (its index in the span of a pass): its progress, and whether the caller says what
  // changed in its window (appended, replaced, reshaped); a file it does not is rebuilt per pass.
  std::vector<ProcessProgress> progress;
  std::vector<char> fed;
};

// analysis::analyze, and IncrementalAnalysis::analyze when `incremental` is given.
Report analyzeJobs(std::span<const trace::TraceFile> files, const Options& options,
                   IncrementalState* incremental);

}  // namespace ncclwatch::analysis::internal
