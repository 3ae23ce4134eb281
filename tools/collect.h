// The collector (`ncclwatch collect`, hosted by `ncclwatch run`): one per job. Agents connect
// over TCP (docs/protocol.md), prove they know the job's secret, and stream their communicator
// tables and call records; the collector keeps each rank's calls as a TraceFile and runs the
// same analysis as `ncclwatch inspect` every few tens of ms. Each new verdict is printed on
// stderr, appended to verdicts.jsonl in the log folder, and answered by asking every involved
// rank to dump (and, with --abort, to abort the communicator).
#pragma once
#include <atomic>
#include <cstdint>
#include <iterator>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

namespace ncclwatch::collect {

struct Options {
  std::string listen = "127.0.0.1:0";  // host:port; port 0 picks a free one
  std::string secret;                  // the job's secret agents must present
  std::string directory;               // where verdicts.jsonl goes ("" : nowhere)
  int analyzeEveryMs = 50;
  int settleMs = 150;      // a verdict must hold this long, culprits unchanged, before it is said
  int64_t quietMs = 3000;  // a job whose ranks wait this long without progress is hung
  bool abortOnVerdict = false;
  // Under --abort, how much longer a rank that is alive but issues no NCCL call while the others
  // wait must stay silent before the job is aborted for it: one rank saving a checkpoint or
  // loading data looks the same for a while (a dead_rank verdict rests on timing alone there).
  // Five minutes: a large model's checkpoint to network storage takes minutes (exp25's 75 s
  // checkpoint was aborted at the 60 s of before), and PyTorch's own timeout is ten.
  int64_t silentRankAbortMs = 300'000;
  bool colour = false;
  size_t maxAgents = 8192;
  // Call records kept for analysis, shared by the job's ranks: each keeps the newest
  // maxRecords / world of its calls, between kMinWindow and kMaxWindow (collect_triage.h; 128
  // bytes each, plus trimSlack). 512 Ki records (64 MiB, 80 MiB with the slack) keep a
  // 4096-rank collector within 150 MiB (docs/scale.md); a job of up to 1024 ranks keeps 512
  // calls or more a rank.
  size_t maxRecords = 1u << 19;
  // Threads an analysis pass may use (analysis::Options::threads): a pass over a 32k-rank job
  // stores nothing while it runs, so its wall time is the verdict's latency. 0: the default
  // (analysis::defaultAnalysisThreads).
  int analysisThreads = 0;
  // Threads that read and decode the agents' frames beside the one that stores and analyses them
  // (collect_connections.h). One decodes a 32,768-rank job's 3.3 M records a second in about
  // half a core; a second one cost the host more CPU, not less (docs/scale.md, "Session 15").
  int readerThreads = 1;
  // `collect --until-idle`: end once agents came and none has been connected for 1 s, or
  // when none came within 60 s (the sidecar a rank starts must not outlive its job), or at
  // once when none is connected and agents of a newer job knock (an elastic restart's).
  bool untilIdle = false;
  // How long to keep trying a port that is in use: an elastic restart's sidecar finds the failed
  // attempt's one still there for a moment, ending (--until-idle) once its agents are gone.
  int listenWaitMs = 0;
};

struct Counters {
  std::atomic<uint64_t> agents{0};      // authenticated connections so far
  std::atomic<uint64_t> connected{0};   // authenticated connections open now
  std::atomic<uint64_t> relayLinks{0};  // relay links so far (each one host's agents)
  std::atomic<uint64_t> rejected{0};    // connections dropped: bad secret or malformed frames
  // HELLOs with another secret from processes started after this collector (a newer job's).
  std::atomic<uint64_t> newerJobKnocks{0};
  std::atomic<uint64_t> frames{0};  // frames accepted
  // Reads of a connection that got bytes: frames / reads is how many frames a wake-up, a recv
  // and (mostly) a TCP segment carried, the collector's cost per frame beside its decoding.
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> records{0};  // records received
  // Calls relays folded (FOLDED notes, tools/relay_fold.h): matched on their host, never sent.
  std::atomic<uint64_t> foldedCalls{0};
  std::atomic<uint64_t> recordsHeld{0};  // records kept for analysis now (bounded)
  std::atomic<uint64_t> verdicts{0};     // verdicts reported
  // Of which said after --abort aborted their job: what the abort set off (Triage::report).
  std::atomic<uint64_t> verdictsAfterAbort{0};
  // Of which withdrawn: a rank alive but silent issued calls again (Triage::checkSilentRanks).
  std::atomic<uint64_t> verdictsWithdrawn{0};
  std::atomic<uint64_t> abortsSent{0};  // --abort: ABORT frames sent (one per rank and comm)
  // Trace files of a job that ended before this sidecar listened, read from its folder instead
  // (Triage::adoptOrphanedJob).
  std::atomic<uint64_t> orphansAdopted{0};
  std::atomic<uint64_t> analyses{0};         // analysis passes run
  std::atomic<uint64_t> partialAnalyses{0};  // of which redid only the touched communicators
  std::atomic<uint64_t> hangAnalyses{0};     // ... of which ran the hang checks (Stats::hangPasses)
  // Why the other passes were full (analysis::IncrementalAnalysis::Stats::fullBecause), by
  // kFullReasons' order. (A quiet job, a process gone, a failed call or a process without a
  // communicator make a partial pass with the hang checks now: hangAnalyses.)
  static constexpr const char* kFullReasons[] = {"first", "changed", "shrink", "absent"};
  std::atomic<uint64_t> fullBecause[std::size(kFullReasons)] = {};
  std::atomic<uint64_t> analysisNs{0};     // wall time spent in them
  std::atomic<uint64_t> analysisCpuNs{0};  // CPU time (every thread's) spent in them
  // The passes over a divergence's communicator alone (Triage::maybeAnalyze), and their wall
  // time: what a mismatch verdict waits for once its members are in.
  std::atomic<uint64_t> divergencePasses{0};
  std::atomic<uint64_t> divergencePassNs{0};
  // Trims of a window that dropped the records from the progress kept on arrival, and those that
  // rebuilt it instead: IncrementalAnalysis::Stats's, copied at each trim (Triage::store).
  std::atomic<uint64_t> progressTrims{0};
  std::atomic<uint64_t> progressTrimRebuilds{0};
  // Trims of a window held back, whole or in part, to keep a call a verdict still needs (a
  // collective not every member has reported, a divergence not said yet), and trims that
  // dropped one all the same, at the cap (collect_triage.h, heldWindowCap) or because the held
  // windows together had spent their budget (heldRecordBudget); and the most records of capacity
  // the held windows took beyond their reserves at once.
  std::atomic<uint64_t> windowHolds{0};
  std::atomic<uint64_t> windowHoldsBroken{0};
  std::atomic<uint64_t> windowHoldsOverBudget{0};
  std::atomic<uint64_t> heldRecordsPeak{0};
};

class Collector {
 public:
  Collector();
  ~Collector();
  // Binds and starts the collector's thread; false with a one-line `error`.
  bool start(const Options& options, std::ostream& out, std::string* error);
  int port() const;
  // Stops after one last analysis; idempotent.
  void stop();
  const Counters& counters() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A random secret for a job: 32 hex digits from getrandom().
std::string makeSecret();

// `ncclwatch collect --listen H:P --secret-file F [--dir D]`: runs until SIGINT/SIGTERM.
int runCollect(const Options& options, std::ostream& out, std::ostream& err);

// `ncclwatch run [--dir D] [--abort] -- PROGRAM ARGS...`: hosts a collector on 127.0.0.1, runs
// the program with libncclwatch.so preloaded (found beside the CLI) and the collector's address
// and secret in its environment, forwards SIGINT/SIGTERM, and returns the program's exit code,
// except that a program that exits 0 after --abort aborted communicators under it gets
// kAbortedJobStatus: its aborted collectives returned without their results.
constexpr int kAbortedJobStatus = 1;
struct RunOptions {
  std::string directory;  // NCCLWATCH_DIR for the job; default ./ncclwatch-logs/run-<pid>
  bool abortOnVerdict = false;
  int64_t quietMs = 3000;               // the collector's quietMs
  int64_t silentRankAbortMs = 300'000;  // the collector's silentRankAbortMs
  std::string preload;  // libncclwatch.so; default: ../lib/libncclwatch.so beside the CLI
  // Load the library only as NCCL's profiler plugin (NCCL_PROFILER_PLUGIN), not LD_PRELOAD: for
  // programs whose NCCL is linked statically.
  bool pluginOnly = false;
  std::vector<std::string> command;
};
int runJob(const RunOptions& options, std::ostream& out, std::ostream& err);

}  // namespace ncclwatch::collect
