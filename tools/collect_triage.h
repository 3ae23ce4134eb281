// The collector's triage (docs/protocol.md, "The collector"): who each agent is, each rank's
// bounded window of calls as a TraceFile, the incremental triage that says when the full
// analysis must run, the analysis passes paced by their cost, when a verdict is said, and what
// it sets off (stderr, verdicts.jsonl, DUMP and ABORT requests). The bytes on the wire are
// collect_connections.h's.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/incremental.h"
#include "analysis/live_triage.h"
#include "collect.h"
#include "collect_connections.h"
#include "trace/ring_reader.h"

namespace ncclwatch::collect {

// Each rank's window of calls: its share of Options::maxRecords, within these bounds.
//
// The floor is what a verdict needs from a window in the usual case: the divergent call on every
// member until the pass that says it. The live triage flags a divergence as records arrive (its
// own per-comm fingerprints, not the windows), and a pass over that communicator runs when its
// last member reports, or once members stop reporting it for settleMs (150 ms), 8 settles (1.2 s)
// after the divergence at the latest (Triage::maybeAnalyze). With 128 calls a rank may be about
// 110 calls ahead of the slowest member at 100 calls a second when the wait is one settle. Past
// that (ranks far apart, or a collector that fell behind and reads a call's records over more
// than a window's time), a window is not trimmed past a call a verdict still needs, up to
// heldWindowCap. The floor binds from 4096 ranks on (512 Ki / 4096 = 128). It was 256: a
// 4096-rank collector then took 160 MiB of windows alone (docs/scale.md).
constexpr size_t kMinWindow = 128;
constexpr size_t kMaxWindow = 65536;
// What a window may grow past its size before it is trimmed back to it (Triage::store). A trim
// moves no record (the window is a ring, trace/record_window.h); what it costs is the progress's
// own trim (ProcessProgress::droppingFront) and the held check, per trim. A quarter window: the
// slack's memory is a sixth of the windows' (it was half a window while each trim moved the
// window, each record twice; docs/scale.md, session 19).
constexpr size_t trimSlack(size_t window) {
  return window / 4;
}
// How far a window may grow while it keeps a call that a verdict still needs (Triage::store): a
// collective that not every member has reported yet, or a divergence until its verdict is said.
// A collector that fell behind gets a call's records over more than a window's time, and without
// the hold the first members' copies were trimmed before the last one's came: the verdict was
// lost (docs/scale.md). Three windows is one doubling of the window's reserve, and 2.5 s of calls
// at 100 a second with 128-call windows; past it the window is trimmed all the same, counted.
constexpr size_t heldWindowCap(size_t window) {
  return 3 * window;
}
// What the held windows may take together beyond their reserves (window and slack), in records:
// twice the job's window budget (128 MiB by default). Holding is per process, and a collector
// that falls behind makes every member of a big communicator hold at once: at 32,768 ranks the
// held windows took 2.7 GB instead of 1.1 GB (docs/scale.md). A window held to its cap grows by
// about 1.6 windows, so the budget binds only where the window floor gives the job more than
// maxRecords (past 4096 ranks by default). Past it a hold is broken, counted.
constexpr size_t heldRecordBudget(size_t maxRecords) {
  return 2 * maxRecords;
}
// The largest communicator whose open collectives the windows hold (Triage::droppable): one
// whose members could all hold to the cap within heldRecordBudget. Past it (the world of a job
// of more than 4096 ranks by default) a collector that falls behind would make every member hold
// at once, far past the budget: at 32,768 ranks the holds took turns at the budget, and the
// churn of their windows cost 400-500 MiB of fragmented heap and a later verdict
// (docs/scale.md). A divergence already seen is held whatever the size.
constexpr size_t largestHeldComm(size_t maxRecords, size_t window) {
  return heldRecordBudget(maxRecords) / (heldWindowCap(window) - window);
}
// The window of a process whose relay folded `folded` of its calls, `stored` reaching the
// collector: the stored share of the full window, a quarter of the floor at least.
inline size_t foldedWindow(size_t fullWindow, uint64_t stored, uint64_t folded) {
  if (folded == 0) return fullWindow;
  size_t share = static_cast<size_t>(static_cast<double>(fullWindow) * static_cast<double>(stored) /
                                     static_cast<double>(stored + folded));
  return std::clamp(share, std::min(fullWindow, kMinWindow / 4), fullWindow);
}
// What tells one verdict from another while it settles and once it is said: its job, kind,
// communicator and call, and for a deadlock its ranks too (two pairs that each send first on
// one communicator deadlock apart, at one call: as one key, they took turns as the candidate and
// only one was said).
std::string verdictKey(const analysis::JobReport& job, const analysis::Verdict& verdict);
// A rank's window in a job of `world` ranks.
inline size_t windowFor(size_t maxRecords, int world) {
  size_t share = maxRecords / static_cast<size_t>(world > 1 ? world : 1);
  return share < kMinWindow ? kMinWindow : share > kMaxWindow ? kMaxWindow : share;
}

// What the collector knows of one process (one rank of one job attempt). Its calls are
// Triage::files_[i]: the newest `window` of them, in ring-index order, as the analysis reads
// them.
struct Process {
  size_t window = 0;
  // Behind a relay that folds (FOLDED notes), the window is the newest `fullWindow` calls of
  // the process, folded ones counted: the records it holds shrink by the share its relay folds
  // (foldedWindow). Otherwise a window of the calls the collector sees spans twice the time
  // where half are folded, and a divergence's pass aligned twice the records (at 32,768 ranks
  // 188-263 ms instead of 103-109: docs/scale.md, session 20).
  size_t fullWindow = 0;
  uint64_t callsStored = 0;    // records seen for the first time
  uint64_t callsFolded = 0;    // calls its relay's notes counted
  uint64_t firstNewIndex = 0;  // ring indices below it arrived before: later copies are updates
  int64_t toWall = 0;          // add to a record time for the wall clock
  // The size at which the window is trimmed next: its size and slack, or more while the trim is
  // held back by a call a verdict needs (tried again each quarter slack).
  size_t trimAt = 0;
  // The window's capacity beyond its reserve while held (Triage::heldCapacity_ has them all).
  size_t heldCapacity = 0;
  bool connected = false;
  bool saidBye = false;
  int64_t connection = -1;  // Connections::send's, while connected
  // A connection that ended without BYE: when, and whether the process is certainly gone (it ran
  // on this host and no longer maps its trace). Otherwise it counts as alive for a grace period,
  // long enough for an agent to reconnect after a network hiccup.
  int64_t goneNs = 0;
  bool goneForSure = false;
  // Known only from its trace file in the collector's folder (it never connected: it ended, or
  // crashed, before it reached the collector); read again while it runs.
  bool adopted = false;
  bool adoptedAlive = false;
  // Its window holds records read from its trace file (adopted before it connected), which may
  // be calls its relay folded (FOLDED says so; dropFolded).
  bool readFromFile = false;
  // Nothing it could still send changes what it did: it said BYE or is gone for sure.
  bool ended() const { return saidBye || goneForSure || (adopted && !adoptedAlive); }
};

class Triage : public FrameSink {
 public:
  // `out` receives the verdicts' text; `startedRealtimeNs` tells a newer job's agents.
  Triage(const Options& options, Counters& counters, std::ostream& out, int64_t startedRealtimeNs)
      : options_(options), counters_(counters), out_(out), startedRealtimeNs_(startedRealtimeNs) {}
  // Where DUMP and ABORT requests go; set before the first frame.
  void setConnections(Connections* connections) { connections_ = connections; }

  int hello(size_t connection, const trace::wire::Hello& hello) override;
  bool frame(int process, trace::wire::Frame& frame) override;
  void closed(int process) override;

  // Housekeeping of one loop round: due aborts, the folder's trace files.
  void housekeeping(int64_t now);
  // An analysis pass when one is due. The loop hands over what the readers decoded during the
  // housekeeping first: reading a folder's trace files can take tens of ms, and a pass that
  // judged a rank by its file while its HELLO waited in a queue would see it as never connected.
  void maybeAnalyze(int64_t now);
  // At the end, once the in-flight frames are read: when every rank ended normally, one last
  // pass that says whatever it finds.
  void finish();

 private:
  // Appends a process's file (files_ parallel to processes_), its header's ring tables cleared
  // and their pages returned (they are never used here); `world`: its job's size.
  void addFile(trace::TraceFile file, int world);
  void store(size_t process, const trace::CallRecord& record);
  // Calls a FOLDED note says its relay folded that the window holds all the same, read from
  // the process's trace file before it connected: they leave the window, as the other members'
  // copies never came (a member holding calls the others lack would read as the others behind).
  void dropFolded(size_t process, const std::vector<trace::wire::FoldedNote>& notes);
  void reloadFromFile(size_t process);
  void readLastNcclError(trace::TraceFile& file);
  // `final`: the job is over (every rank said BYE): every verdict is said, none waits to settle.
  // `first`: communicators where the triage saw a divergence, redone before the others.
  void analyze(int64_t now, bool final = false, const std::set<uint64_t>* first = nullptr);
  // Reads the trace files in the collector's folder of ranks that never connected (or that
  // ended while it thought them alive): a rank that crashed before its first exchange is still
  // evidence, as `ncclwatch inspect` sees it.
  void adoptTraceFiles(int64_t now);
  // Adds or rereads one trace file as an adopted process; false when the process bound is met.
  bool adoptFile(trace::TraceFile file, const std::string& path);
  // A sidecar (`collect --until-idle`) that no agent reached within kOrphanWaitNs, its job most
  // likely over before it listened (a short job, a loaded machine): the trace files in its
  // folder of ended processes whose communicators derive its secret are its job's, adopted as if
  // their ranks had connected and left. Every round until an agent connects: ranks end one by
  // one.
  void adoptOrphanedJob(int64_t now);
  bool jobMissesRanks() const;
  bool sameAttempt(const trace::RingHeader& header) const;
  void report(analysis::Verdict verdict, const analysis::JobReport& job);
  // One line at the end of verdicts.jsonl in the folder (none without a folder).
  void appendVerdictLine(const std::string& json);
  bool culpritsEnded(const analysis::Verdict& verdict, const analysis::JobReport& job) const;
  void sendDueAborts(int64_t now);
  // Under --abort: the aborts a verdict calls for, on every rank of its job that has them.
  void scheduleAborts(const analysis::Verdict& verdict, const std::string& jobId);
  // Verdicts on ranks alive but silent: withdrawn when one issues a call again (a checkpoint or
  // data loading that outlasted the quiet time), and under --abort their held aborts sent when
  // due or the rank is gone.
  void checkSilentRanks(int64_t now);

  const Options& options_;
  Counters& counters_;
  std::ostream& out_;
  int64_t startedRealtimeNs_ = 0;  // a HELLO from a process started later is a newer job's
  Connections* connections_ = nullptr;
  std::vector<Process> processes_;
  std::vector<trace::TraceFile> files_;                            // parallel to processes_
  std::map<std::tuple<std::string, int, int>, int> processIndex_;  // (job, rank, pid)
  // Per job: its largest world size and the ranks it has files of, kept as files are added
  // (jobMissesRanks ran every half second over every file, ~700 instructions a process).
  struct JobRanks {
    int world = 0;
    std::set<int> ranks;
  };
  std::map<std::string, JobRanks, std::less<>> jobRanks_;
  analysis::LiveTriage triage_;
  analysis::IncrementalAnalysis analysis_;
  std::set<std::string> reported_;  // verdict keys already said
  struct Candidate {
    std::string culprits;
    int64_t sinceNs;
    uint64_t commHash;
  };
  std::map<std::string, Candidate> candidates_;  // verdicts seen, not yet settled
  // What asks for an analysis pass: a divergence the triage saw or a member joining or leaving
  // (`wanted_`), or any new record (`activity_`). Passes are paced by their own cost.
  bool wanted_ = false;
  bool activity_ = false;
  int64_t nextCheckNs_ = 0;
  int64_t lastAnalysisNs_ = 0;
  int64_t lastCostNs_ = 0;
  std::set<uint64_t> divergent_;  // comms where the triage saw a divergence since the last pass
  // Comms where a divergence was seen while members were still to report: since when, and when
  // a member last joined the diverged ordinal. A pass waits for the last member's record (the
  // mismatch complete: one partial pass says it), or until members stop coming for settleMs, or
  // kDivergenceWaitSettles settles in all.
  struct Diverging {
    int64_t sinceNs = 0;
    int64_t lastJoinNs = 0;
  };
  std::map<uint64_t, Diverging> divergingSince_;
  // Divergences whose verdict is not said yet: the communicator and the earliest diverged
  // ordinal, which the windows keep (store) until a pass over the communicator leaves no verdict
  // on it waiting to be said.
  std::map<uint64_t, uint64_t> heldDivergences_;
  // How many of the `drop` oldest records of a window may go: those before the first call a
  // verdict still needs (heldWindowCap).
  size_t droppable(const trace::RecordWindow& records, size_t drop, size_t window);
  // Whether a held window has room for the appends until its next trim, grown (explicitly, not
  // by the vector's doubling) within heldRecordBudget; false when the budget is spent.
  bool roomToHold(Process& process, trace::RecordWindow& records, size_t appends);
  size_t heldCapacity_ = 0;      // records of capacity beyond the reserves, all windows together
  int64_t lastFirstCostNs_ = 0;  // the cost of the last pass over those alone
  int64_t nextAdoptNs_ = 0;
  int64_t firstHousekeepingNs_ = 0;     // steady clock: when the collector began its rounds
  std::set<std::string> orphanFiles_;   // trace files adopted by adoptOrphanedJob
  std::set<std::string> foreignFiles_;  // trace files in the folder that are not this job's
  struct PendingAbort {
    size_t process;
    uint64_t commHash;
    int64_t dueNs;
  };
  std::vector<PendingAbort> pendingAborts_;
  // A dead_rank verdict on ranks alive but silent, under --abort: its aborts wait until
  // `dueNs`, and are called off if a culprit issues another call first (its process's
  // firstNewIndex moves on).
  struct SilentRank {
    analysis::Verdict verdict;
    std::string jobId;
    int attempt = 0;
    std::vector<std::pair<size_t, uint64_t>> culprits;  // (process, firstNewIndex at the verdict)
    int64_t saidNs = 0;
    int64_t dueNs = 0;  // under --abort: when the job is aborted for it; 0 without
  };
  std::vector<SilentRank> silentRanks_;
  // Learned from withdrawn verdicts: twice the longest silence a rank came back from, capped at
  // kLongestLearnedQuietNs; verdicts on timing alone wait this long, not the quiet time, once a
  // job has shown host steps that long (a rank 4 s slower each step said DEAD_RANK and withdrew
  // it every step: exp26's straggler_long). 0 until then.
  int64_t learnedQuietNs_ = 0;
  int64_t quietNs() const;
  std::set<std::pair<size_t, uint64_t>> abortsAsked_;  // (process, comm) aborts already asked
  // Jobs aborted under --abort: the verdict it was for ("MISMATCH on comm … at call #3") and
  // when its aborts go out. Verdicts of the job said from then on are said as its consequences
  // (report).
  struct AbortedJob {
    std::string verdict;
    int64_t dueNs = 0;
  };
  std::map<std::string, AbortedJob, std::less<>> abortedFor_;
  // Processes of a job aborted whole (a dead rank under --abort): communicators they report
  // later are aborted as they arrive.
  std::set<size_t> abortingProcesses_;
  // Per job, the communicators its verdicts had aborted: a rank of the job that reports one of
  // them later (its agent connected after the verdict, or again after a lost connection: every
  // connection starts with COMMS) is aborted there too, or it would wait in it for ever.
  std::map<std::string, std::set<uint64_t>, std::less<>> abortedComms_;
};

}  // namespace ncclwatch::collect
