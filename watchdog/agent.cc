#include "watchdog/agent.h"

#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "trace/clock.h"
#include "trace/record.h"
#include "watchdog/discovery.h"
#include "watchdog/poll_beat.h"
#include "watchdog/progress_source.h"
#include "watchdog/python_sites.h"

extern char** environ;

namespace ncclwatch::watchdog {
namespace {

std::atomic<Agent*> g_agent{nullptr};
std::mutex g_startMutex;
std::once_flag g_atforkOnce;

void forgetAfterFork() {
  // The parent's thread does not exist in the child; its agent (and any lock it held) is left.
  g_agent.store(nullptr);
  Triggers::forgetAfterFork();
  forgetUnfinishedSecretAfterFork();
  new (&g_startMutex) std::mutex();
}

// glibc's on_exit (not atexit): it passes the status given to exit().
void stopAtExit(int status, void*) {
  Agent* agent = g_agent.load();
  if (agent == nullptr) return;
  agent->noteExitStatus(status);
  agent->stop(2000);
  if (const CompletionTracker* completion = agent->completion()) {
    const CompletionCounters& counters = completion->counters();
    uint64_t shed = counters.noPair.load() + counters.queueFull.load();
    if (shed > 0) {
      std::fprintf(stderr,
                   "[ncclwatch] %" PRIu64 " of %" PRIu64
                   " calls were not tracked to GPU completion: no free CUDA event (calls "
                   "outran the watchdog); their records say so (untracked)\n",
                   shed, shed + counters.tracked.load());
    }
  }
}

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "%016" PRIx64, value);
  return text;
}

// "AllReduce 4096 x float" with the root or peer where the op has one.
std::string callText(const trace::CallRecord& call) {
  std::string text = trace::opName(call.op);
  text += " " + std::to_string(call.count) + " x " + trace::dtypeName(call.dtype);
  if (trace::isPointToPoint(call.op)) text += " peer " + std::to_string(call.rootOrPeer);
  if (call.op == trace::OpKind::kBroadcast || call.op == trace::OpKind::kReduce) {
    text += " root " + std::to_string(call.rootOrPeer);
  }
  return text;
}

// The folder of the trace file, absolute: the sidecar collector writes verdicts.jsonl there,
// and it may start in another working directory than the one the path is relative to.
std::string traceFolder(const std::string& tracePath) {
  size_t slash = tracePath.rfind('/');
  std::string folder = slash == std::string::npos ? "." : tracePath.substr(0, slash);
  char resolved[PATH_MAX];
  return realpath(folder.c_str(), resolved) != nullptr ? resolved : folder;
}

}  // namespace

Agent::Agent(trace::RingWriter& writer, const AgentOptions& options)
    : writer_(writer), options_(options) {}

Agent* Agent::current() {
  return g_agent.load(std::memory_order_acquire);
}

Agent* Agent::start(trace::RingWriter& writer, const AgentOptions& options) {
  if (Agent* agent = current()) return agent;
  std::lock_guard<std::mutex> lock(g_startMutex);
  if (Agent* agent = current()) return agent;
  std::call_once(g_atforkOnce, [] { pthread_atfork(nullptr, nullptr, forgetAfterFork); });
  auto* agent = new Agent(writer, options);
  if (options.events != EventMode::kOff) {
    const char* why = nullptr;
    if (const DriverApi* driver = loadDriverApi(&why)) {
      agent->completion_ = std::make_unique<CompletionTracker>(*driver, writer, options.events);
    } else {
      std::fprintf(stderr, "[ncclwatch] GPU completion tracking off: %s\n", why);
    }
  }
  if (options.hasCollector) {
    agent->link_ = std::make_unique<CollectorLink>(options.collector, writer, options.rank,
                                                   options.world, options.localRank);
  }
  if (options.hasCollector && relayWanted(options.collector.relay, options.world)) {
    agent->relayWanted_ = true;
    // LOCAL_RANK 0 runs the host's relay; without LOCAL_RANK every rank offers to, and the
    // first to bind the host's relay name does (relay_host.h).
    if (options.localRank <= 0) {
      RelayHostOptions relay;
      relay.collectorHost = options.collector.host;
      relay.collectorPort = options.collector.port;
      if (const char* cli = std::getenv("NCCLWATCH_CLI"); cli != nullptr && *cli != '\0') {
        relay.cli = cli;
      }
      for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
        relay.environment.emplace_back(*entry);
      }
      agent->relayHost_ = std::make_unique<RelayHost>(std::move(relay));
    }
  }
  if (options.sidecar) {
    SidecarOptions sidecar = options.sidecarOptions;
    if (sidecar.directory.empty()) sidecar.directory = traceFolder(writer.path());
    agent->sidecar_ = std::make_unique<Sidecar>(std::move(sidecar));
  }
  // On this (application) thread: the stack signal, the Python route, the dump triggers.
  std::string error;
  if (!prepareDumps(options.stackSignalOffset, &error, options.stackRoute)) {
    std::fprintf(stderr, "[ncclwatch] native stacks of other threads unavailable: %s\n",
                 error.c_str());
  }
  if (!Triggers::install(&writer, options.triggers)) {
    std::fprintf(stderr, "[ncclwatch] some dump triggers (SIGTERM, fatal signals) not installed\n");
  }
  // The thread inherits a full signal mask: no signal meant for the application lands on it.
  // Fault signals stay open: only the faulting thread gets them, and a blocked one kills the
  // process outright (a trace page that faulted under this thread must reach recoverFault()).
  sigset_t all, previous;
  sigfillset(&all);
  for (int fault : {SIGBUS, SIGSEGV, SIGFPE, SIGILL}) sigdelset(&all, fault);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  agent->thread_ = std::thread([agent] { agent->run(); });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  g_agent.store(agent, std::memory_order_release);
  // Exit handlers run in reverse order of registration: this one runs before the CUDA
  // runtime's (registered at its first call, earlier), so the driver is still there.
  on_exit(stopAtExit, nullptr);
  return agent;
}

bool Agent::waitForWork(int waitMs) {
  pollfd wake{Triggers::wakeFd(), POLLIN, 0};
  int ready = poll(&wake, wake.fd >= 0 ? 1 : 0, waitMs);
  if (ready > 0) Triggers::drainWake();
  return ready > 0;
}

void Agent::run() {
  pthread_setname_np(pthread_self(), "ncclwatch");
  Triggers::setWatchdogThread(static_cast<int>(syscall(SYS_gettid)));
  if (completion_) completion_->enterPollingThread();
  for (;;) {
    bool last = stopping_.load(std::memory_order_acquire);
    trace::FastClock::calibrate();
    if (completion_) completion_->poll();
    ProgressSource* source = progressSource();
    if (source != nullptr) publishWaits(*source);
    publishPythonSites();
    // Continuous mode: the ring's records go to the file's segments after their states settle.
    if (writer_.continuous()) writer_.persistSegments();
    int signal = 0;
    uint64_t generation = 0;
    DumpTrigger trigger = Triggers::pending(&signal, &generation);
    if (trigger != DumpTrigger::kNone) {
      std::string reason = trigger == DumpTrigger::kRequest
                               ? "requested through ncclwatchDump()"
                               : std::string("signal ") + strsignal(signal);
      dump(triggerName(trigger), reason, {}, true);
      Triggers::done(generation);
    }
    if (completion_ || source != nullptr) checkHangs(trace::FastClock::nowNs());
    // Rank 0 starts the sidecar before its own link's first attempt to reach it.
    if (sidecar_ && !last) sidecar_->step(jobSecret());
    // The relay rank binds the host's relay before its own link's first attempt to reach it.
    if (relayHost_ && !last) relayHost_->step(jobSecret());
    if (link_) exchange(last);
    // A sidecar that no agent reached (the job ended before it listened) reads the job's trace
    // files and ends by itself (Triage::adoptOrphanedJob): it is left to say its verdicts.
    if (last) break;
    // Until the fast clock has its first line, poll often enough to publish it within ~25 ms.
    // Continuous mode polls and persists at least every 10 ms, so that a burst of calls rarely
    // laps the ring before its records reach the file with their settled states.
    bool eager = !trace::FastClock::calibrated() || writer_.continuous();
    int waitMs = eager ? std::min(options_.pollMs, 10) : options_.pollMs;
    // Calls faster than the pool recycles at this interval: come back within a millisecond, so
    // that back-to-back collectives stay tracked instead of being shed.
    if (completion_ && completion_->underPressure()) waitMs = std::min(waitMs, 1);
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    waitForWork(msToNextBeat(now.tv_sec * 1'000'000'000ll + now.tv_nsec, waitMs));
  }
  if (options_.dumpAtExit)
    dump("exit", "the process is exiting (NCCLWATCH_DUMP_AT_EXIT)", {}, true);
  finished_.store(true, std::memory_order_release);
}

const char* Agent::jobSecret() {
  if (!secret_.empty()) return secret_.c_str();
  DerivedSecretText derived;
  if (!options_.collector.secret.empty()) {
    secret_ = options_.collector.secret;
  } else if (options_.collector.secretFromUniqueId && derivedSecret(derived)) {
    secret_ = derived;
  } else {
    return nullptr;  // no root communicator seen yet: nothing to present
  }
  if (link_) link_->setSecret(secret_.c_str());
  if (link_ && relayWanted_) {
    link_->useRelay(relaySocketName(secret_, options_.collector.host, options_.collector.port));
  }
  return secret_.c_str();
}

void Agent::exchange(bool last) {
  jobSecret();
  if (last) {
    link_->finish(300, exitStatusKnown_.load(std::memory_order_acquire)
                           ? std::optional<int32_t>(exitStatus_.load(std::memory_order_relaxed))
                           : std::nullopt);
    return;
  }
  std::vector<CollectorRequest> requests;
  link_->step(trace::FastClock::nowNs(), &requests);
  // Aborts of the communicators this process has calls pending on go first: an abort can wait
  // for work queued on the device (the sim's does, and a real NCCL's may), and the call this
  // rank is blocked in must fail before that, or the aborts after it never run.
  const std::vector<CommProgress>& progress = allProgress();  // events and the plugin's
  auto pendingHere = [&progress](uint64_t commHash) {
    for (const CommProgress& comm : progress) {
      if (comm.commHash == commHash && comm.pending > 0) return true;
    }
    return false;
  };
  std::stable_partition(requests.begin(), requests.end(), [&](const CollectorRequest& request) {
    return request.kind == CollectorRequest::Kind::kDump || pendingHere(request.commHash);
  });
  for (const CollectorRequest& request : requests) {
    if (request.kind == CollectorRequest::Kind::kDump) {
      dump("collector", request.reason, {}, true);
    } else {
      abortComm(request.commHash, "as the collector asks");
    }
  }
}

void Agent::publishWaits(ProgressSource& source) {
  source.poll(trace::FastClock::nowNs());
  const std::vector<trace::WaitNote>& waits = source.waits();
  bool changed = waits.size() != publishedWaits_.size();
  for (size_t i = 0; !changed && i < waits.size(); ++i) {
    changed = std::memcmp(&waits[i], &publishedWaits_[i], sizeof(trace::WaitNote)) != 0;
  }
  if (!changed) return;
  publishedWaits_ = waits;
  writer_.writeWaits(waits);
  if (link_) link_->publishWaits(waits);
}

// Python call sites first seen since the last pass: into the trace file and to the collector.
void Agent::publishPythonSites() {
  std::vector<trace::PythonSite> sites = resolveNewPythonSites();
  std::vector<trace::PythonSite> native = nativeSites_.scan(writer_);
  sites.insert(sites.end(), std::make_move_iterator(native.begin()),
               std::make_move_iterator(native.end()));
  if (sites.empty()) return;
  std::string text = trace::formatPythonSites(sites);
  writer_.appendSites(text);
  if (link_) link_->publishSites(text);
}

// Every communicator's progress: the CUDA-event tracker's and the plugin's.
const std::vector<CommProgress>& Agent::allProgress() {
  progress_.clear();  // keeps its capacity: no allocation once it held every communicator
  if (completion_) {
    const std::vector<CommProgress>& tracked = completion_->progress();
    progress_.insert(progress_.end(), tracked.begin(), tracked.end());
  }
  if (ProgressSource* source = progressSource()) {
    const std::vector<CommProgress>& more = source->progress();
    progress_.insert(progress_.end(), more.begin(), more.end());
  }
  return progress_;
}

// " In NCCL: kernel running ..." for the call, when the plugin saw where it waits.
std::string Agent::waitText(uint64_t commHash, uint64_t seq, int64_t now) const {
  for (const trace::WaitNote& note : publishedWaits_) {
    if (note.commHash == commHash && note.seq == seq)
      return "; in NCCL: " + trace::describeWait(note, now);
  }
  return "";
}

void Agent::checkHangs(int64_t now) {
  std::vector<trace::DumpFinding> hung;
  std::vector<uint64_t> hungComms;
  const HangThresholds& limits = options_.thresholds;
  const std::vector<CommProgress>& progress = allProgress();
  for (const CommProgress& comm : progress) {
    if (comm.pending == 0 || comm.oldest.issueNs == 0) continue;
    const trace::CallRecord& call = comm.oldest;
    int64_t ageMs = (now - call.issueNs) / 1'000'000;
    int64_t latencyMs = comm.recentLatencyNs / 1'000'000;
    int64_t softMs = std::max(limits.softFloorMs, limits.softFactor * latencyMs);
    int64_t hardMs = std::max(limits.hardFloorMs, limits.hardFactor * latencyMs);
    Alarm& alarm = alarms_[comm.commHash];
    // One event per call: a start inferred from stream order is "reached", not "started".
    const char* state = !comm.oldestStarted                               ? "issued"
                        : (call.flags & trace::kRecordStartInferred) != 0 ? "reached"
                                                                          : "started";
    if (ageMs >= softMs && alarm.warnedSeq != call.seq) {
      alarm.warnedSeq = call.seq;
      std::fprintf(stderr,
                   "[ncclwatch] rank %d: comm %s seq %" PRIu64
                   " %s pending %.1f s (%s), "
                   "past the %.1f s warning threshold%s\n",
                   options_.rank, hex(comm.commHash).c_str(), call.seq, callText(call).c_str(),
                   static_cast<double>(ageMs) / 1000.0, state, static_cast<double>(softMs) / 1000.0,
                   waitText(comm.commHash, call.seq, now).c_str());
    }
    if (ageMs >= hardMs && alarm.declaredSeq != call.seq) {
      alarm.declaredSeq = call.seq;
      trace::DumpFinding finding;
      finding.commHash = comm.commHash;
      finding.seq = call.seq;
      finding.op = trace::opName(call.op);
      finding.state = state;
      finding.ageMs = ageMs;
      finding.threadId = call.threadId;
      char explanation[512];
      std::snprintf(explanation, sizeof explanation,
                    "%s pending %.1f s, past the %.1f s hang threshold; last completed seq on "
                    "this comm: %" PRIu64 "; %zu calls pending",
                    callText(call).c_str(), static_cast<double>(ageMs) / 1000.0,
                    static_cast<double>(hardMs) / 1000.0, comm.completedSeq, comm.pending);
      finding.explanation = explanation + waitText(comm.commHash, call.seq, now);
      hung.push_back(std::move(finding));
      hungComms.push_back(comm.commHash);
    }
  }
  if (hung.empty()) return;
  // What the other communicators are doing tells "not issued: the thread is elsewhere".
  for (const CommProgress& comm : progress) {
    if (comm.pending != 0) continue;
    trace::DumpFinding idle;
    idle.commHash = comm.commHash;
    idle.seq = comm.completedSeq;
    idle.op = "-";
    idle.state = "idle";
    idle.ageMs = comm.lastCompletionNs ? (now - comm.lastCompletionNs) / 1'000'000 : 0;
    idle.explanation =
        "nothing pending: its next call is not issued; the issuing thread is "
        "elsewhere (last completed seq " +
        std::to_string(comm.completedSeq) + ")";
    hung.push_back(std::move(idle));
  }
  bool stacks = options_.onHang != HangAction::kWarn;
  dump("hang", "calls pending past the hang threshold", std::move(hung), stacks);
  if (options_.onHang == HangAction::kAbort) {
    for (uint64_t hash : hungComms) {
      abortComm(hash, "(NCCLWATCH_ON_HANG=abort) so that the job fails now instead of hanging");
    }
  }
}

void Agent::abortComm(uint64_t commHash, const char* why) {
  if (!options_.abortComm) return;
  // Said before the abort, which may wait for GPU work queued ahead of the hung call.
  std::fprintf(stderr, "[ncclwatch] rank %d: aborting comm %s %s\n", options_.rank,
               hex(commHash).c_str(), why);
  int aborted = options_.abortComm(commHash);
  if (aborted == 0) {
    std::fprintf(stderr,
                 "[ncclwatch] rank %d: comm %s not aborted: this process holds no handle to it "
                 "(ncclwatch runs as NCCL's profiler plugin only, and NCCL hands a plugin no "
                 "communicator; preload libncclwatch.so to abort)\n",
                 options_.rank, hex(commHash).c_str());
  } else if (aborted < 0) {
    std::fprintf(stderr,
                 "[ncclwatch] rank %d: comm %s not aborted: the application destroyed or "
                 "finalized it already (nothing of it is left to abort)\n",
                 options_.rank, hex(commHash).c_str());
  }
}

void Agent::dump(const std::string& trigger, const std::string& reason,
                 std::vector<trace::DumpFinding> findings, bool withStacks) {
  trace::Dump taken;
  if (withStacks) {
    DumpBounds bounds;
    // A SIGTERM handler waits NCCLWATCH_DUMP_WAIT_MS (3 s) in all: leave the signal route
    // room to answer when the helper cannot.
    if (trigger == "sigterm") bounds.helper = std::chrono::milliseconds(1500);
    taken = takeDump(trigger, reason, std::move(findings), bounds);
  } else {
    taken.trigger = trigger;
    taken.reason = reason;
    taken.timeNs = trace::FastClock::nowNs();
    taken.findings = std::move(findings);
    taken.pythonNote = "not taken (NCCLWATCH_ON_HANG=warn)";
  }
  bool written = writer_.appendDump(trace::formatDump(taken));
  ProcessLabel label{options_.rank, static_cast<int>(getpid()), writer_.path()};
  std::string block = describeDump(taken, label, written);
  // One write, so that ranks sharing a terminal do not interleave within a block.
  ssize_t ignored = write(STDERR_FILENO, block.data(), block.size());
  (void)ignored;
}

void Agent::noteExitStatus(int status) {
  exitStatus_.store(status, std::memory_order_relaxed);
  exitStatusKnown_.store(true, std::memory_order_release);
  writer_.setExitStatus(status);
}

void Agent::stop(int boundMs) {
  std::lock_guard<std::mutex> lock(stopMutex_);
  if (!thread_.joinable()) return;
  stopping_.store(true, std::memory_order_release);
  Triggers::wake();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(boundMs);
  while (!finished_.load(std::memory_order_acquire) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (finished_.load(std::memory_order_acquire)) {
    thread_.join();
  } else {
    thread_.detach();
  }
}

}  // namespace ncclwatch::watchdog
