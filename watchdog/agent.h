// The watchdog thread of one process. It starts lazily at the first communicator init (never in
// a constructor), runs with every signal blocked, polls completion events every poll interval,
// persists the ring to the file's segments in continuous mode, watches every communicator's
// oldest pending call against two thresholds, takes dumps (on a hang, SIGTERM, a fatal signal,
// a dump signal, a request, or at exit), and is stopped with a bound at exit. A fork() child
// has no watchdog thread until it starts its own.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trace/ring_writer.h"
#include "watchdog/completion.h"
#include "watchdog/dumper.h"
#include "watchdog/exchange.h"
#include "watchdog/native_sites.h"
#include "watchdog/progress_source.h"
#include "watchdog/relay_host.h"
#include "watchdog/sidecar.h"
#include "watchdog/triggers.h"

namespace ncclwatch::watchdog {

// What happens when a call stays pending past the hard threshold (NCCLWATCH_ON_HANG).
enum class HangAction {
  kWarn,   // the stderr block and the finding in the trace file; stacks only on request
  kDump,   // also every thread's native and Python stacks, in the file and (top frames) stderr
  kAbort,  // dump, then ncclCommAbort on the hung communicators: the job fails fast
};

struct HangThresholds {
  // A call pending longer than max(floor, factor x the communicator's recent slowest call) is
  // reported: soft (a one-line warning) and hard (a local hang). The factor keeps healthy jobs
  // with long steps (a rank checkpointing while others wait in an allreduce) from firing once
  // such waits have been seen; the floors keep a job that has not yet seen them quiet for long
  // enough that a real hang is the likelier cause.
  int64_t softFloorMs = 60'000;
  int64_t hardFloorMs = 300'000;
  int softFactor = 4;
  int hardFactor = 10;
};

struct AgentOptions {
  int pollMs = 100;
  EventMode events = EventMode::kEnd;  // GPU completion events (NCCLWATCH_EVENTS)
  HangThresholds thresholds;
  HangAction onHang = HangAction::kWarn;
  int stackSignalOffset = 3;                  // SIGRTMIN + this captures native stacks
  StackRoute stackRoute = StackRoute::kAuto;  // NCCLWATCH_STACK_ROUTE
  TriggerOptions triggers;
  bool dumpAtExit = false;
  int rank = -1;
  int world = -1;
  int localRank = -1;
  // The job's collector (watchdog/discovery.h); without one, detection stays local.
  bool hasCollector = false;
  CollectorAddress collector;
  // Rank 0 with the default address hosts the collector itself (watchdog/sidecar.h). An empty
  // directory means the trace folder.
  bool sidecar = false;
  SidecarOptions sidecarOptions;
  // Aborts the communicators with this hash (set by the interposer: it knows the ncclComm_t).
  // Returns how many communicators it aborted; 0 where the process holds no handle to any
  // communicator (ncclwatch loaded as NCCL's profiler plugin only); -1 where it holds others but
  // none with that hash (the application destroyed or finalized it already).
  std::function<int(uint64_t commHash)> abortComm;
};

class Agent {
 public:
  // The process's agent, started on first use with `writer`'s trace. Never null after a
  // successful start; the agent lives until the process ends.
  static Agent* start(trace::RingWriter& writer, const AgentOptions& options);
  // The running agent, or null before start (and in a fork child until it starts its own).
  static Agent* current();

  // Null when events are off or the process has no CUDA driver.
  CompletionTracker* completion() { return completion_.get(); }
  int pollMs() const { return options_.pollMs; }

  // Stops the thread: one last poll (and the exit dump when asked for), then join within
  // `boundMs`; a thread that does not finish in time is left behind (the agent is never
  // freed, so it stays safe to run).
  void stop(int boundMs);
  // The status the process passed to exit() (its exit handler, before stop): kept in the trace
  // header and sent with BYE, so that a rank that failed by exiting non-zero (Python after an
  // uncaught exception) is not taken for one that ended normally.
  void noteExitStatus(int status);

 private:
  Agent(trace::RingWriter& writer, const AgentOptions& options);
  void run();
  void checkHangs(int64_t now);
  void publishWaits(ProgressSource& source);
  void publishPythonSites();
  // Every communicator's progress (the events' and the plugin's), in progress_: the watchdog
  // thread polls it every interval and must not allocate each time (a fork that catches a thread
  // inside an allocator without fork handlers leaves the child a lock no thread will release).
  const std::vector<CommProgress>& allProgress();
  std::string waitText(uint64_t commHash, uint64_t seq, int64_t now) const;
  void exchange(bool last);
  const char* jobSecret();
  // Aborts the communicators with this hash (options_.abortComm), saying so; `why` ends the line.
  void abortComm(uint64_t commHash, const char* why);
  void dump(const std::string& trigger, const std::string& reason,
            std::vector<trace::DumpFinding> findings, bool withStacks);
  bool waitForWork(int waitMs);

  struct Alarm {
    uint64_t warnedSeq = 0;
    uint64_t declaredSeq = 0;
  };

  trace::RingWriter& writer_;
  AgentOptions options_;
  std::unique_ptr<CompletionTracker> completion_;
  std::unique_ptr<CollectorLink> link_;
  std::unique_ptr<Sidecar> sidecar_;
  std::unique_ptr<RelayHost> relayHost_;  // this rank may run its host's relay
  bool relayWanted_ = false;              // the link goes through the host's relay
  std::string secret_;                    // the job's secret once known (watchdog thread only)
  std::map<uint64_t, Alarm> alarms_;      // watchdog thread only
  std::vector<trace::WaitNote> publishedWaits_;  // watchdog thread only
  std::vector<CommProgress> progress_;           // watchdog thread only (allProgress)
  NativeSites nativeSites_;                      // watchdog thread only
  std::atomic<bool> stopping_{false};
  std::atomic<int> exitStatus_{0};
  std::atomic<bool> exitStatusKnown_{false};
  std::atomic<bool> finished_{false};
  std::thread thread_;
  std::mutex stopMutex_;
};

}  // namespace ncclwatch::watchdog
