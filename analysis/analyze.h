// Cross-rank analysis of the ring files of one job: aligns the ranks of every communicator on
// their calls, builds a wait-for graph from each stream's issue order, and turns what it finds
// into verdicts (docs/verdicts.md) and a per-communicator summary. The offline `inspect` and
// the live collector run this same code; it only reads the TraceFiles it is given.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trace/ring_reader.h"

namespace ncclwatch::analysis {

enum class VerdictKind {
  kMismatch,
  kMissing,
  kUnmatchedP2p,
  kStuck,
  kDeadlock,
  kDeadRank,
  kInitHang,
  kStraggler,
  kError,  // an NCCL call returned an error, and the others are left waiting
};
const char* kindName(VerdictKind kind);  // "mismatch", "missing", ... as in verdicts.jsonl

// What a verdict's bug does to the job.
enum class Effect {
  kHang,                  // ranks wait for ever (or until a timeout kills the job)
  kSilentDataCorruption,  // NCCL completes the calls with wrong results: nothing hangs
  kError,                 // a call failed; what waits on it is a consequence
  kInformation,           // stragglers
};
const char* effectName(Effect effect);  // "hang", "silent_data_corruption", "error", ...

// One call as a class of ranks made it.
struct CallDesc {
  trace::OpKind op = trace::OpKind::kUnknown;
  uint64_t seq = 0;  // the call's seq on its communicator (0: not issued)
  uint64_t count = 0;
  int dtype = -1;
  int redop = -1;
  int rootOrPeer = -1;
  // A split's class whose ranks passed different colours (a group's members and the others'
  // NCCL_SPLIT_NOCOLOR, as PyTorch's new_group does): each colour, ascending. Empty otherwise:
  // rootOrPeer is the class's colour.
  std::vector<int> colours;
  uint64_t p2pSeq = 0;
  trace::RecordState state = trace::RecordState::kEmpty;
  // Started as inferred from stream order (one completion event per call, kRecordStartInferred):
  // said "reached", since work queued on the stream outside NCCL may still be ahead of it.
  bool startInferred = false;
  uint64_t callSite = 0;  // a return address, or a Python site (trace::isPythonSite)
  // The global rank whose record this is: callSite means something in its process only (a
  // return address, a site number), and a class's call may come from any of its ranks.
  int callRank = -1;
  std::string issuedAt;  // the Python line that issued it ("train.py:88 step"), when known
  // The torch.distributed function that line called ("barrier"), set only where the classes of
  // one verdict called different ones: a barrier reads as an AllReduce of one element.
  std::string pythonApi;
  int threadId = 0;  // the thread that issued it
  uint64_t commHash =
      0;             // where the class is when it is elsewhere (another comm); else the verdict's
  std::string note;  // "never issued", "process ended", ... when there is no call
};

// Ranks (global ranks) that did the same thing, like STAT's equivalence classes.
struct RankClass {
  std::vector<int> ranks;
  CallDesc call;
  // Where the class's first rank was, from its newest dump when it has one: the innermost frames
  // of the thread that issued the call outside NCCL, CUDA, libc and ncclwatch ("step ← train ←
  // main"), and its innermost Python frame; empty when unknown.
  std::string stackTop;
};

struct CommDesc {
  uint64_t hash = 0;
  int size = 0;
  uint64_t parent = 0;  // 0: a root communicator
  int color = -1;       // split colour, -1 unless split
  std::string name;     // commName or "world" for a root comm spanning the whole job
};

struct Verdict {
  VerdictKind kind = VerdictKind::kMismatch;
  CommDesc comm;
  uint64_t seq = 0;  // the call (seq on comm) the verdict is about
  std::vector<std::string>
      fields;  // mismatch / unmatched_p2p: op, count, dtype, redop, root, color
  std::vector<RankClass> classes;
  std::vector<int> culprits;
  int64_t divergenceNs = 0;  // wall clock (CLOCK_REALTIME ns) when it went wrong, 0 if unknown
  int64_t detectionNs = 0;   // wall clock when the analysis saw it
  std::string explanation;   // one line a user can act on
  bool primary = true;       // false: a consequence of another verdict (see explanation)
  Effect effect = Effect::kHang;
  // dead_rank only: the culprit's process is still running, silent (its headline says so: the
  // kind's name alone reads as a crash).
  bool culpritAlive = false;
  // ... and stopped (state T on the analysing host: SIGSTOP, a debugger): nothing in it runs.
  bool culpritStopped = false;
  // How sure the analysis is (1: the records show it; lower when records were lost, ranks have
  // no trace, the verdict rests on timing alone, or completion was not tracked for its calls),
  // and each reason it is less sure, in words.
  double confidence = 1.0;
  std::vector<std::string> doubts;
  // Where the ranks wait inside NCCL, from the profiler plugin (analysis/in_nccl.h); empty
  // without the plugin.
  std::vector<std::string> inNccl;
};

// The state of one communicator at the end of the traces.
struct CommSummary {
  CommDesc comm;
  std::vector<int> ranks;  // members found (global ranks)
  uint64_t calls = 0;      // the most calls any member issued on it (its highest seq)
  struct Progress {
    std::vector<int> ranks;
    uint64_t issuedSeq = 0;
    uint64_t completedSeq = 0;  // last seq of an unbroken prefix of completed calls
    uint64_t pending = 0;       // issued, not completed (tracked calls only)
  };
  std::vector<Progress> progress;  // ranks grouped by (issued, completed, pending)
};

struct ProcessSummary {
  std::string path;
  int rank = -1;
  int world = -1;
  std::string host;
  int pid = 0;
  bool cleanShutdown = false;
  std::optional<int> exitStatus;  // what it passed to exit(), when known
  bool alive = false;             // still running (same host, the process still maps its file)
  uint64_t records = 0;
  int64_t lastActivityNs = 0;  // wall clock
};

struct JobReport {
  std::string jobId;
  int attempt = 0;  // 0-based: the k-th process of a rank within one job id belongs to attempt k
  int world = 0;
  std::vector<ProcessSummary> processes;
  bool stalled = false;  // no progress: the analysis judged pending calls as hung
  bool ended = false;    // every process has ended
  // Where the evidence is incomplete (ranks without a trace, lost records, untracked
  // completion), one sentence each; empty when every rank's calls are all there.
  std::vector<std::string> evidenceGaps;
  std::string summary;  // the "what happened" paragraph
  // What it is written with once the verdicts' texts are final (after the Python lines): the
  // analysis's "now" and the job's last activity, both wall clock.
  int64_t readAtNs = 0;
  int64_t lastActivityNs = 0;
  std::vector<Verdict> verdicts;
  std::vector<CommSummary> comms;
};

struct Report {
  std::vector<JobReport> jobs;
  // Exit code a CLI should use: 0 nothing but information, 1 findings.
  bool hasFindings() const;
};

// The communicators whose members' progress keeps their aligned calls on arrival (comm_progress.h,
// alignedPlain): those of at least this many ranks. A pass over a small communicator reads few
// records; the kept calls (12 bytes a call) pay where members are many (a divergence's pass over
// a 32,768-rank world read 2 M records), and for every communicator they took a 4096-rank
// collector 8-11 MiB over its 150 MiB (docs/scale.md, session 11).
constexpr int kKeptAlignmentMinRanks = 64;

struct Options {
  // Wall-clock "now" for detection times and silence; 0: the real clock.
  int64_t nowNs = 0;
  // A job with a running process counts as hung after this long without any recorded
  // activity (issue, start or completion) on any rank.
  int64_t quietNs = 10'000'000'000;
  // Ranks of a running job waiting inside a root init (the others not there) are read as hung
  // only this long after the last of them arrived: a launch's ranks reach the init seconds
  // apart (imports, data set-up), and a late one is no hang yet.
  int64_t initPatienceNs = 30'000'000'000;
  // Whether to look for running processes on this host (/proc). Tests of synthetic traces
  // set it false and say which processes are alive through `aliveRanks`.
  bool probeProcesses = true;
  std::vector<int> aliveRanks;  // used when probeProcesses is false
  // Straggler: the last rank to arrive by at least this much, in at least `stragglerShare` of the
  // collectives it joined (at least `stragglerMinCalls` of them, on comms of 3 ranks or more).
  int64_t stragglerLagNs = 2'000'000;
  double stragglerShare = 0.6;
  int stragglerMinCalls = 5;
  // Threads a pass may use for its per-process and per-member work (alignment, the mismatch
  // scan, the straggler tally, the scan of each process's records), for jobs of 512 processes
  // or more; 1: the calling thread alone. The verdicts do not depend on it.
  int threads = 1;
  // Whether a member whose progress kept its aligned calls (comm_progress.h, alignedPlain) takes
  // them from there; false: every member is aligned from its window's records. The verdicts do
  // not depend on it (the tests compare both).
  bool keptAlignment = true;
  // The communicators whose members' progress keeps their aligned calls: those of at least this
  // many ranks (ProcessProgress::keepAlignedFrom). The tests lower it to see small jobs take them.
  int keptAlignmentMinRanks = kKeptAlignmentMinRanks;
};

// The threads the CLI and the collector give a pass (Options::threads): half the machine's, 8 at
// most. A collector beside a rank (the sidecar) then leaves the job most cores even during a
// pass, which for a job this large lasts tens of ms.
int defaultAnalysisThreads();

// Analyses every job (job id, attempt) in `files`; files that are not usable are skipped.
Report analyze(std::span<const trace::TraceFile> files, const Options& options = {});

// One record as the verdicts describe a call (redop -1 where the op has no reduction).
CallDesc describeCall(const trace::CallRecord& record);

// A call NCCL refused or reported failed (not "in progress"): what the error verdicts read.
inline bool isFailedCall(const trace::CallRecord& record) {
  return record.state == trace::RecordState::kFailed && record.result != 0 && record.result != 7;
}

// Whether the file's process runs on this host and still maps its trace file (pids are reused;
// the mapping is not); onThisHost: whether it was written on this host at all.
bool runningHere(const trace::TraceFile& file);
bool onThisHost(const trace::TraceFile& file);
// Whether the file's process runs on this host and is stopped (state T or t in /proc: SIGSTOP,
// SIGTSTP, a debugger): alive, and nothing in it runs, its watchdog included.
bool stoppedHere(const trace::TraceFile& file);

// "0-4,6-7" from ranks in any order.
std::string formatRanks(std::vector<int> ranks);
// "rank 3" or "ranks 0-2,5": the ranks as a verdict's text names them.
std::string namedRanks(const std::vector<int>& ranks);

// "high", "medium" or "low" for a verdict's confidence.
const char* confidenceLevel(double confidence);

// ncclInvalidArgument → "ncclInvalidArgument", and NCCL's own text for it ("invalid argument").
const char* ncclResultName(int result);
const char* ncclResultText(int result);

}  // namespace ncclwatch::analysis
