#include "interpose/recorder.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <strings.h>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <utility>

#include "interpose/aborted_comms.h"
#include "interpose/forward.h"
#include "interpose/lifecycle.h"
#include "plugin/plugin.h"
#include "trace/clock.h"
#include "trace/fingerprint.h"
#include "trace/ring_writer.h"
#include "watchdog/agent.h"
#include "watchdog/discovery.h"
#include "watchdog/python_sites.h"

namespace ncclwatch::interpose {
namespace {

constexpr size_t kCommTableSize = 4096;  // open addressing; far above any real process's count
constexpr uint32_t kDefaultRingRecords = 32768;  // 4 MiB of records
constexpr int kDefaultPollMs = 100;
constexpr int kMaxBatchCalls = 512;   // records of one ncclGroupStart/End with events
constexpr int kMaxBatchStreams = 32;  // distinct streams of one group with events

// Calls whose "after" events wait for one moment: the outermost ncclGroupEnd, or a non-blocking
// communicator's ncclCommGetAsyncError reporting the enqueue done.
struct BatchCall {
  uint64_t index;
  uint64_t stream;
  uint64_t commHash;
  bool failed;
};
struct StreamTicket {
  uint64_t stream;
  watchdog::Ticket ticket;
  bool shed;  // no ticket because the event pool was empty
};
struct Batch {
  BatchCall calls[kMaxBatchCalls];
  StreamTicket streams[kMaxBatchStreams];
  int callCount = 0;
  int streamCount = 0;
  ncclComm_t comm = nullptr;  // the communicator to wait on while deferred
};
// Per application thread, allocated at its first group or deferred call (never on later calls).
struct ThreadBatches {
  Batch group;
  Batch deferred;
  bool haveDeferred = false;
};

}  // namespace

// The process's recorder and everything it owns.
struct RecorderState final : Recorder {
  trace::RingWriter writer;
  CommEntry comms[kCommTableSize];
  std::mutex addMutex;  // serializes adds (init/split paths only, never the hot path)
  watchdog::AgentOptions agentOptions;
  // Set once the watchdog thread runs with completion tracking; read on every call.
  std::atomic<watchdog::CompletionTracker*> completion{nullptr};
};

__thread int detail::t_callDepth __attribute__((tls_model("initial-exec"))) = 0;
__thread uint64_t detail::t_lifecycleSite __attribute__((tls_model("initial-exec"))) = 0;
__thread const IssuedCall* detail::t_callInProgress __attribute__((tls_model("initial-exec"))) =
    nullptr;
__thread ncclComm_t detail::t_lastComm __attribute__((tls_model("initial-exec"))) = nullptr;
__thread CommEntry* detail::t_lastEntry __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

using State = RecorderState;

std::atomic<bool> g_disabled{false};
std::once_flag g_atforkOnce;
std::mutex g_initMutex;

// initial-exec: a preloaded library's thread-locals live in the static TLS block, so reading them
// on the hot path is one instruction instead of a __tls_get_addr call.
#define NCCLWATCH_TLS thread_local __attribute__((tls_model("initial-exec")))
NCCLWATCH_TLS int t_groupDepth = 0;
// The serial of the thread's outermost group (CallRecord::groupSerial), 1 to 255.
NCCLWATCH_TLS uint8_t t_groupSerial = 0;
NCCLWATCH_TLS int t_threadId = 0;
NCCLWATCH_TLS bool t_haveNestedId = false;
NCCLWATCH_TLS ncclUniqueId t_nestedId;
NCCLWATCH_TLS ThreadBatches* t_batches = nullptr;
pthread_key_t g_batchesKey;
std::once_flag g_batchesKeyOnce;

ThreadBatches* threadBatches() {
  if (t_batches != nullptr) return t_batches;
  std::call_once(g_batchesKeyOnce, [] {
    pthread_key_create(&g_batchesKey,
                       [](void* batches) { delete static_cast<ThreadBatches*>(batches); });
  });
  t_batches = new (std::nothrow) ThreadBatches();
  if (t_batches != nullptr) pthread_setspecific(g_batchesKey, t_batches);
  return t_batches;
}

int threadId() {
  if (t_threadId == 0) t_threadId = static_cast<int>(syscall(SYS_gettid));
  return t_threadId;
}

const char* envText(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// The first of `names` set, as a number; -1 when none is.
int envRank(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (const char* text = envText(name)) return std::atoi(text);
  }
  return -1;
}

// False with errno set when `path` is not, and cannot be made, a folder (ENOTDIR when a file
// stands where it should be).
bool makeDirectories(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    std::string prefix = path.substr(0, slash);
    if (mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) return false;
    if (slash == std::string::npos) break;
  }
  struct stat folder {};
  if (stat(path.c_str(), &folder) != 0) return false;
  if (!S_ISDIR(folder.st_mode)) {
    errno = ENOTDIR;
    return false;
  }
  return true;
}

// The job, and under torchrun the attempt: an elastic restart's processes form a job of their
// own (".attempt1", ...), so that its traces and verdicts stay apart from the failed attempt's.
std::string jobId() {
  const char* explicitJob = envText("NCCLWATCH_JOB");
  if (explicitJob != nullptr) return explicitJob;
  if (const char* run = envText("TORCHELASTIC_RUN_ID")) {
    std::string job = run;
    // torchrun's static rendezvous (--master-addr/--master-port without --rdzv-backend) names
    // every run "none": every such job on a machine would be one job. Its store's address is the
    // same on every node of the job and differs between jobs running at once.
    const char* masterPort = envText("MASTER_PORT");
    if (job == "none" && masterPort != nullptr) {
      const char* masterAddr = envText("MASTER_ADDR");
      job = std::string("torchrun-") + (masterAddr ? masterAddr : "localhost") + "-" + masterPort;
    }
    const char* restart = envText("TORCHELASTIC_RESTART_COUNT");
    bool restarted = restart != nullptr && std::strcmp(restart, "0") != 0;
    return restarted ? job + ".attempt" + restart : job;
  }
  if (const char* slurm = envText("SLURM_JOB_ID")) return slurm;
  // OpenMPI (4.x) and other PMIx launchers: one namespace per job.
  if (const char* mpi = envText("OMPI_MCA_ess_base_jobid")) return std::string("mpi-") + mpi;
  if (const char* pmix = envText("PMIX_NAMESPACE")) return std::string("pmix-") + pmix;
  return "job-" + std::to_string(getpid());
}

// A whole number in [low, high] from the environment; a bad value is said once and replaced.
unsigned long envCount(const char* name, unsigned long low, unsigned long high,
                       unsigned long fallback) {
  const char* text = envText(name);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  errno = 0;
  unsigned long value = std::strtoul(text, &end, 10);
  if (*end != '\0' || errno != 0 || *text == '-' || value < low || value > high) {
    std::fprintf(stderr, "[ncclwatch] %s=%s is not a whole number in [%lu, %lu]; using %lu\n", name,
                 text, low, high, fallback);
    return fallback;
  }
  return value;
}

// An on/off word: 1/on/yes/true or 0/off/no/false; false when `text` is neither.
bool parseSwitch(const char* text, bool* on) {
  for (const char* word : {"1", "on", "yes", "true"}) {
    if (strcasecmp(text, word) == 0) {
      *on = true;
      return true;
    }
  }
  for (const char* word : {"0", "off", "no", "false"}) {
    if (strcasecmp(text, word) == 0) {
      *on = false;
      return true;
    }
  }
  return false;
}

bool envSwitch(const char* name, bool fallback) {
  const char* text = envText(name);
  if (text == nullptr) return fallback;
  if (bool on; parseSwitch(text, &on)) return on;
  std::fprintf(stderr, "[ncclwatch] %s=%s is not on or off; using %s\n", name, text,
               fallback ? "on" : "off");
  return fallback;
}

// NCCLWATCH_EVENTS: on (one event per call, the default), full (a start event too), off.
watchdog::EventMode eventMode() {
  const char* text = envText("NCCLWATCH_EVENTS");
  if (text == nullptr) return watchdog::EventMode::kEnd;
  if (strcasecmp(text, "full") == 0) return watchdog::EventMode::kFull;
  if (strcasecmp(text, "end") == 0) return watchdog::EventMode::kEnd;
  if (bool on; parseSwitch(text, &on))
    return on ? watchdog::EventMode::kEnd : watchdog::EventMode::kOff;
  std::fprintf(stderr, "[ncclwatch] NCCLWATCH_EVENTS=%s is not on, full or off; using on\n", text);
  return watchdog::EventMode::kEnd;
}

trace::TraceMode traceMode() {
  const char* text = envText("NCCLWATCH_TRACE");
  if (text == nullptr || std::strcmp(text, "ring") == 0) return trace::TraceMode::kRing;
  if (std::strcmp(text, "full") == 0) return trace::TraceMode::kFull;
  std::fprintf(stderr, "[ncclwatch] NCCLWATCH_TRACE=%s is not ring or full; using ring\n", text);
  return trace::TraceMode::kRing;
}

// The file the real NCCL was loaded from: the one holding NCCL's own pncclGetVersion.
std::string realNcclPath() {
  Dl_info info{};
  void* function = resolveReal("pncclGetVersion");
  if (function == nullptr || dladdr(function, &info) == 0 || info.dli_fname == nullptr) return "";
  char resolved[PATH_MAX];
  return realpath(info.dli_fname, resolved) != nullptr ? resolved : info.dli_fname;
}

watchdog::HangAction hangAction() {
  const char* text = envText("NCCLWATCH_ON_HANG");
  if (text == nullptr || std::strcmp(text, "warn") == 0) return watchdog::HangAction::kWarn;
  if (std::strcmp(text, "dump") == 0) return watchdog::HangAction::kDump;
  if (std::strcmp(text, "abort") == 0) return watchdog::HangAction::kAbort;
  std::fprintf(stderr, "[ncclwatch] NCCLWATCH_ON_HANG=%s is not warn, dump or abort; using warn\n",
               text);
  return watchdog::HangAction::kWarn;
}

watchdog::StackRoute stackRoute() {
  const char* text = envText("NCCLWATCH_STACK_ROUTE");
  watchdog::StackRoute route = watchdog::StackRoute::kAuto;
  if (text != nullptr && !watchdog::parseStackRoute(text, &route)) {
    std::fprintf(stderr,
                 "[ncclwatch] NCCLWATCH_STACK_ROUTE=%s is not auto, ptrace or signal; using auto\n",
                 text);
  }
  return route;
}

// A signal by number or name (SIGUSR1, USR1, SIGRTMIN+5); 0 when unset or unknown (said once).
int dumpSignal() {
  const char* text = envText("NCCLWATCH_DUMP_SIGNAL");
  if (text == nullptr) return 0;
  std::string name = text;
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  char* end = nullptr;
  long number = std::strtol(name.c_str(), &end, 10);
  if (*end == '\0' && number > 0 && number < SIGRTMAX) return static_cast<int>(number);
  if (name.rfind("RTMIN+", 0) == 0) {
    long offset = std::strtol(name.c_str() + 6, &end, 10);
    if (*end == '\0' && offset >= 0 && SIGRTMIN + offset <= SIGRTMAX) {
      return SIGRTMIN + static_cast<int>(offset);
    }
  }
  for (auto [known, number] : {std::pair{"USR1", SIGUSR1}, std::pair{"USR2", SIGUSR2},
                               std::pair{"HUP", SIGHUP}, std::pair{"QUIT", SIGQUIT}}) {
    if (name == known) return number;
  }
  std::fprintf(stderr, "[ncclwatch] NCCLWATCH_DUMP_SIGNAL=%s is not a signal; no dump signal\n",
               text);
  return 0;
}

watchdog::AgentOptions agentOptionsFromEnvironment(const trace::ProcessInfo& process) {
  watchdog::AgentOptions options;
  options.rank = process.rank;
  options.world = process.world;
  options.localRank = process.localRank;
  options.events = eventMode();
  options.pollMs = static_cast<int>(envCount("NCCLWATCH_POLL_MS", 1, 60000, kDefaultPollMs));
  options.thresholds.softFloorMs = static_cast<int64_t>(
      envCount("NCCLWATCH_WARN_MS", 1, 86'400'000, options.thresholds.softFloorMs));
  options.thresholds.hardFloorMs = static_cast<int64_t>(
      envCount("NCCLWATCH_HANG_MS", 1, 86'400'000, options.thresholds.hardFloorMs));
  options.onHang = hangAction();
  options.triggers.dumpSignal = dumpSignal();
  options.triggers.waitMs =
      static_cast<int>(envCount("NCCLWATCH_DUMP_WAIT_MS", 0, 600'000, options.triggers.waitMs));
  options.triggers.sigterm = envSwitch("NCCLWATCH_DUMP_ON_SIGTERM", true);
  options.triggers.fatalSignals = envSwitch("NCCLWATCH_DUMP_ON_CRASH", true);
  options.stackSignalOffset = static_cast<int>(
      envCount("NCCLWATCH_STACK_SIGNAL", 0, SIGRTMAX - SIGRTMIN, options.stackSignalOffset));
  options.stackRoute = stackRoute();
  options.dumpAtExit = envSwitch("NCCLWATCH_DUMP_AT_EXIT", false);
  std::string note;
  options.hasCollector = watchdog::collectorFromEnvironment(&options.collector, &note);
  if (!note.empty()) std::fprintf(stderr, "[ncclwatch] %s\n", note.c_str());
  // Without a collector set up for the job (NCCLWATCH_COLLECTOR), global rank 0 hosts one.
  if (options.hasCollector && options.collector.fromMasterAddr && process.rank == 0) {
    options.sidecar = true;
    options.sidecarOptions = watchdog::sidecarFromEnvironment(options.collector);
  }
  options.abortComm = [](uint64_t commHash) {
    Recorder* recorder = Recorder::existing();
    return recorder != nullptr ? recorder->abortByHash(commHash) : 0;
  };
  return options;
}

size_t slotFor(ncclComm_t comm) {
  auto value = reinterpret_cast<uintptr_t>(comm);
  value ^= value >> 17;
  value *= 0x9e3779b97f4a7c15ull;
  return static_cast<size_t>(value >> 32) & (kCommTableSize - 1);
}

void resetAfterFork() {
  // The child must never write into its parent's ring; it starts over lazily with its own file.
  Recorder::forgetAfterFork();
  // The forking thread is the child's only thread, with a thread id of its own.
  t_threadId = 0;
  detail::t_lastComm = nullptr;  // find()'s cache pointed into the parent's recorder
  detail::t_lastEntry = nullptr;
  new (&g_initMutex) std::mutex();
}

// At normal exit the trace says so: a reader then tells a finished process from a killed one.
// What the trace file missed is said once, here.
__attribute__((destructor)) void markCleanShutdown() {
  auto* state = static_cast<State*>(Recorder::existing());
  if (state == nullptr || !state->writer.isOpen()) return;
  state->writer.markCleanShutdown();
  trace::RingWriter::Losses lost = state->writer.losses();
  if (lost.unwrittenBlocks + lost.failedSegmentWrites + lost.mappingFaults == 0) return;
  std::fprintf(stderr,
               "[ncclwatch] trace file %s missed %" PRIu64 " dump blocks, %" PRIu64
               " segment writes (%" PRIu64 " records dropped), %u pages faulted%s\n",
               state->writer.path().empty() ? "(none: memory only)" : state->writer.path().c_str(),
               lost.unwrittenBlocks, lost.failedSegmentWrites, lost.droppedRecords,
               lost.mappingFaults, state->writer.memoryOnly() ? "; recorded in memory only" : "");
}

}  // namespace

int groupDepth() {
  return t_groupDepth;
}
void enterGroup() {
  if (t_groupDepth++ == 0) t_groupSerial = static_cast<uint8_t>(t_groupSerial % 255 + 1);
}
void leaveGroup() {
  if (t_groupDepth > 0) --t_groupDepth;
}

void rememberNestedUniqueId(const ncclUniqueId& id) {
  t_nestedId = id;
  t_haveNestedId = true;
}

bool takeNestedUniqueId(ncclUniqueId* id) {
  if (!t_haveNestedId) return false;
  *id = t_nestedId;
  t_haveNestedId = false;
  return true;
}

void Recorder::forgetAfterFork() {
  if (auto* state = static_cast<State*>(instance_.load())) state->writer.forgetAfterFork();
  instance_.store(nullptr);
}

Recorder* Recorder::start() {
  if (g_disabled.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(g_initMutex);
  if (Recorder* existing = instance_.load()) return existing;
  if (!envSwitch("NCCLWATCH_ENABLE", true)) {
    g_disabled.store(true);
    return nullptr;
  }
  std::call_once(g_atforkOnce, [] { pthread_atfork(nullptr, nullptr, resetAfterFork); });
  std::string directory =
      envText("NCCLWATCH_DIR") ? envText("NCCLWATCH_DIR") : "./ncclwatch-logs/" + jobId();
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  std::string path = directory + "/" + host + "-" + std::to_string(getpid()) + ".ncclwatch";
  auto* state = new State();
  std::string error;
  // Launchers' variables: torchrun and most Python launchers, Open MPI, PMIx (Open MPI 5,
  // PRRTE), MPICH and Intel MPI (Hydra's PMI), MVAPICH2, Slurm's srun.
  trace::ProcessInfo info{envRank({"RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                   "MV2_COMM_WORLD_RANK", "SLURM_PROCID"}),
                          envRank({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                   "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS"}),
                          envRank({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                   "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}),
                          host, jobId()};
  trace::RingOptions options;
  options.capacity =
      static_cast<uint32_t>(envCount("NCCLWATCH_RING_RECORDS", trace::kMinRingCapacity,
                                     trace::kMaxRingCapacity, kDefaultRingRecords));
  options.mode = traceMode();
  if (!makeDirectories(directory)) {
    error = "cannot create it: " + std::string(std::strerror(errno));
  } else {
    state->writer.open(path, options, info, &error);
  }
  if (!state->writer.isOpen()) {
    // Only the file is lost: the same ring in memory keeps everything else working.
    state->writer.openInMemory(options, info);
    if (!state->writer.isOpen()) {
      std::fprintf(stderr,
                   "[ncclwatch] recording off: log folder %s unusable (%s) and no memory "
                   "for a ring\n",
                   directory.c_str(), error.c_str());
      delete state;
      g_disabled.store(true);
      return nullptr;
    }
    std::fprintf(stderr,
                 "[ncclwatch] log folder %s unusable (%s): recording in memory only; the "
                 "watchdog, stderr dumps and live verdicts go on, no trace file is kept\n",
                 directory.c_str(), error.c_str());
  }
  state->agentOptions = agentOptionsFromEnvironment(info);
  // Memory only: the sidecar collector still writes its verdicts to the folder asked for, never
  // to the working directory (a trace-less writer has no path to take the folder from).
  if (state->writer.path().empty() && state->agentOptions.sidecarOptions.directory.empty()) {
    state->agentOptions.sidecarOptions.directory = directory;
  }
  // NCCL's own pncclGetVersion: a statically linked NCCL (plugin-only mode) has none to find.
  int version = 0;
  if (auto* getVersion =
          reinterpret_cast<decltype(&::pncclGetVersion)>(resolveReal("pncclGetVersion"))) {
    getVersion(&version);
  }
  state->writer.setNcclLibrary(version, realNcclPath());
  watchdog::preparePythonSites();
  std::string pluginNote = plugin::takeStartupNote();
  if (!pluginNote.empty()) std::fprintf(stderr, "[ncclwatch] %s\n", pluginNote.c_str());
  instance_.store(state, std::memory_order_release);
  return state;
}

CommEntry* Recorder::findAndRemember(ncclComm_t comm) {
  CommEntry* entry = findInTable(comm);
  if (entry != nullptr) {
    detail::t_lastComm = comm;
    detail::t_lastEntry = entry;
  }
  return entry;
}

CommEntry* Recorder::findInTable(ncclComm_t comm) {
  auto* state = static_cast<State*>(this);
  size_t start = slotFor(comm);
  for (size_t probe = 0; probe < kCommTableSize; ++probe) {
    CommEntry& entry = state->comms[(start + probe) & (kCommTableSize - 1)];
    ncclComm_t key = entry.key.load(std::memory_order_acquire);
    if (key == comm) return &entry;
    // Never used: the end of the chain. (add() may be turning a tombstone into an entry.)
    if (key == nullptr && std::atomic_ref(entry.hash).load(std::memory_order_relaxed) == 0) {
      return nullptr;
    }
  }
  return nullptr;
}

namespace {

// A destroyed communicator's slot, made ready for a new one: a process that creates and
// destroys communicators all its life (10,000 in issue 13's test) never fills the table. Its
// per-peer counters are kept for a communicator they fit (zeroed), never freed: a thread still
// inside a call on the destroyed one may hold them.
void resetTombstone(CommEntry& entry, int nranks) {
  if (nranks > entry.peerCapacity) {
    entry.sendSeq = nullptr;
    entry.recvSeq = nullptr;
    entry.peerCapacity = 0;
  }
  for (int peer = 0; peer < entry.peerCapacity; ++peer) {
    entry.sendSeq[peer].store(0);
    entry.recvSeq[peer].store(0);
  }
  entry.seq.store(0);
  entry.collectives.store(0);
  entry.pointToPoint.store(0);
  entry.splitCount.store(0);
  entry.shrinkCount.store(0);
}

}  // namespace

CommEntry* Recorder::add(const CommCreation& creation) {
  auto* state = static_cast<State*>(this);
  std::lock_guard<std::mutex> lock(state->addMutex);
  if (CommEntry* existing = find(creation.comm)) return existing;
  size_t start = slotFor(creation.comm);
  for (size_t probe = 0; probe < kCommTableSize; ++probe) {
    CommEntry& entry = state->comms[(start + probe) & (kCommTableSize - 1)];
    if (entry.key.load() != nullptr) continue;  // used; a tombstone is taken again
    if (entry.hash != 0) resetTombstone(entry, creation.nranks);
    std::atomic_ref(entry.hash).store(creation.hash, std::memory_order_relaxed);
    entry.abortable = creation.abortable;
    entry.closing.store(false);
    entry.parentHash = creation.parentHash;
    entry.magic = creation.magic;
    entry.nranks = creation.nranks;
    entry.rank = creation.rank;
    entry.rollingHash.store(trace::kRollingSeed);
    if (creation.nranks > entry.peerCapacity) {
      entry.sendSeq = new std::atomic<uint64_t>[creation.nranks]();
      entry.recvSeq = new std::atomic<uint64_t>[creation.nranks]();
      entry.peerCapacity = creation.nranks;
    }
    entry.key.store(creation.comm, std::memory_order_release);
    trace::CommInfo info{};
    info.commHash = creation.hash;
    info.parentHash = creation.parentHash;
    info.commPointer = reinterpret_cast<uint64_t>(creation.comm);
    info.createdNs = trace::FastClock::nowNs();
    info.nranks = creation.nranks;
    info.rank = creation.rank;
    info.device = creation.device;
    info.color = creation.color;
    info.splitIndex = creation.splitIndex;
    info.shrinkIndex = creation.shrinkIndex;
    info.kind = static_cast<uint8_t>(creation.kind);
    state->writer.addComm(info);
    return &entry;
  }
  // Table full of live communicators: calls on this one are recorded without its sequence
  // numbers. The trace's header table lists or counts it (droppedComms); said once.
  trace::CommInfo info{};
  info.commHash = creation.hash;
  info.parentHash = creation.parentHash;
  info.nranks = creation.nranks;
  info.rank = creation.rank;
  state->writer.addComm(info);
  static bool said = false;
  if (!std::exchange(said, true)) {
    std::fprintf(stderr,
                 "[ncclwatch] more than %zu communicators alive at once: calls on the newer ones "
                 "are recorded without their sequence numbers\n",
                 kCommTableSize);
  }
  return nullptr;
}

CommEntry* Recorder::findByHash(uint64_t hash) {
  auto* state = static_cast<State*>(this);
  for (CommEntry& entry : state->comms) {
    if (entry.key.load(std::memory_order_acquire) != nullptr &&
        std::atomic_ref(entry.hash).load(std::memory_order_relaxed) == hash) {
      return &entry;
    }
  }
  return nullptr;
}

void Recorder::forget(ncclComm_t comm) {
  if (CommEntry* entry = find(comm)) {
    // A tombstone: hash stays non-zero so that probe chains stay intact; add() reuses it.
    entry->key.store(nullptr, std::memory_order_release);
  }
}

namespace {

// The result lands before the state: continuous mode persists a record once its state is final.
// The time it failed is its completion time: a split that fails because its parent was aborted
// under it then reads as one unfinished until that abort (analysis/before_aborts.h).
// NCCL's own words for it go to the header: on this thread, right after the call, its
// thread-local last error is this call's ("Duplicate GPU detected : rank 1 and rank 2 ...",
// which PyTorch does not show without NCCL_DEBUG).
void markFailed(trace::RingWriter& writer, uint64_t index, ncclResult_t result) {
  writer.updateResult(index, static_cast<int32_t>(result));
  // The message before the state: a collector that sees the failed state reads it from the
  // header of this host's trace file.
  using LastError = const char* (*)(ncclComm_t);
  static std::atomic<LastError> lastError{nullptr};
  LastError real = lastError.load(std::memory_order_relaxed);
  if (real == nullptr) {
    real = reinterpret_cast<LastError>(resolveReal("pncclGetLastError"));
    lastError.store(real, std::memory_order_relaxed);
  }
  if (real != nullptr) writer.noteLastError(index, real(nullptr));
  writer.updateState(index, trace::RecordState::kFailed, 0, trace::FastClock::nowNs());
}

bool tracksCompletion(trace::OpKind op) {
  return trace::isCollective(op) || trace::isPointToPoint(op) || trace::isOneSided(op);
}

bool batchHasRoom(const Batch& batch, uint64_t stream) {
  if (batch.callCount == kMaxBatchCalls) return false;
  for (int i = 0; i < batch.streamCount; ++i) {
    if (batch.streams[i].stream == stream) return true;
  }
  return batch.streamCount < kMaxBatchStreams;
}

// Adds a call to a batch; false when the batch is full (the call then goes untracked).
bool addToBatch(Batch& batch, const IssuedCall& issued) {
  if (!batchHasRoom(batch, issued.stream)) return false;
  bool knownStream = false;
  for (int i = 0; i < batch.streamCount; ++i)
    knownStream |= batch.streams[i].stream == issued.stream;
  if (!knownStream) {
    batch.streams[batch.streamCount++] = {issued.stream, watchdog::kNoTicket, false};
  }
  batch.calls[batch.callCount++] = {issued.index, issued.stream, issued.commHash, false};
  return true;
}

// Records the "after" event of each stream of the batch and hands its calls to the poller.
// A call that was to be tracked but got no events after all: its record says so, or it would
// stay "issued" for ever and read as pending.
void markUntracked(trace::RingWriter& writer, uint64_t index, bool shed) {
  writer.updateFlags(index, trace::kRecordNoEvents | (shed ? trace::kRecordShed : 0), 0);
}

void submitBatch(watchdog::CompletionTracker& completion, trace::RingWriter& writer, Batch& batch) {
  for (int s = 0; s < batch.streamCount; ++s) {
    StreamTicket& stream = batch.streams[s];
    uint64_t indices[kMaxBatchCalls];
    size_t count = 0;
    uint64_t commHash = 0;
    for (int c = 0; c < batch.callCount; ++c) {
      const BatchCall& call = batch.calls[c];
      if (call.stream != stream.stream || call.failed) continue;
      indices[count++] = call.index;
      commHash = call.commHash;
    }
    if (stream.ticket == watchdog::kNoTicket) {
      for (size_t i = 0; i < count; ++i) markUntracked(writer, indices[i], stream.shed);
      continue;
    }
    if (count == 0 || !completion.recordAfter(stream.ticket, stream.stream)) {
      if (count == 0) completion.abandon(stream.ticket);
      for (size_t i = 0; i < count; ++i) markUntracked(writer, indices[i], false);
      continue;
    }
    completion.submit(stream.ticket, std::span<const uint64_t>(indices, count), commHash,
                      stream.stream, true);
  }
  batch.callCount = 0;
  batch.streamCount = 0;
  batch.comm = nullptr;
}

// Single calls are deferred as a batch of one, with the ticket already taken.
void deferCall(watchdog::CompletionTracker& completion, trace::RingWriter& writer,
               const IssuedCall& issued, ncclComm_t comm) {
  ThreadBatches* batches = threadBatches();
  if (batches == nullptr) {
    completion.abandon(issued.ticket);
    markUntracked(writer, issued.index, false);
    return;
  }
  if (batches->haveDeferred && batches->deferred.comm != comm) {
    submitBatch(completion, writer, batches->deferred);  // best effort: one deferral at a time
  }
  Batch& batch = batches->deferred;
  batches->haveDeferred = true;
  batch.comm = comm;
  if (!addToBatch(batch, issued)) {
    completion.abandon(issued.ticket);
    markUntracked(writer, issued.index, false);
    return;
  }
  for (int s = 0; s < batch.streamCount; ++s) {
    if (batch.streams[s].stream != issued.stream) continue;
    if (batch.streams[s].ticket != watchdog::kNoTicket) {
      completion.abandon(issued.ticket);  // the stream's first deferred call holds the pair
    } else {
      batch.streams[s].ticket = issued.ticket;
    }
  }
}

}  // namespace

void Recorder::issueInto(CommEntry* comm, const CallDescription& call, IssuedCall* out) {
  auto* state = static_cast<State*>(this);
  IssuedCall& issued = *out;  // default-constructed by the caller
  issued.op = call.op;
  issued.stream = call.stream;
  // Every field is set below (no zeroing of the whole record first: the hot path writes each
  // word once here and once into the ring slot).
  trace::CallRecord record;
  record.seq = 0;
  record.p2pSeq = 0;
  record.ncclSeqNumber = 0;
  record.fingerprint = 0;
  record.rollingHash = 0;
  record.startNs = 0;
  record.completeNs = 0;
  record.result = 0;
  record.slotVersion = 0;
  record.ringIndex = 0;
  record.op = call.op;
  record.count = call.count;
  record.dtype = static_cast<uint8_t>(call.dtype);
  record.redop = static_cast<uint8_t>(call.redop < 0 ? 0 : call.redop);
  record.rootOrPeer = call.rootOrPeer;
  record.stream = call.stream;
  // In a Python process, the Python line of the call (watchdog/python_sites.h).
  record.callSite =
      call.callSite != 0 && !trace::isPythonSite(call.callSite) && watchdog::pythonSitesOn()
          ? watchdog::pythonCallSite(call.callSite)
          : call.callSite;
  record.issueNs = call.issueNs != 0 ? call.issueNs : trace::FastClock::nowNs();
  record.threadId = call.threadId != 0 ? call.threadId : threadId();
  int depth = call.groupDepth >= 0 ? call.groupDepth : t_groupDepth;
  record.groupDepth = static_cast<uint16_t>(depth);
  record.state = trace::RecordState::kIssued;
  record.flags = static_cast<uint8_t>((depth > 0 ? trace::kRecordInGroup : 0) | call.extraFlags);
  // A depth the caller gives (the plugin's events) is not this thread's group: serial unknown.
  record.groupSerial = depth > 0 && call.groupDepth < 0 ? t_groupSerial : 0;
  record.commHash = call.commHash;
  if (comm != nullptr) {
    record.commHash = comm->hash;
    // NCCL requires the calls on one communicator to be serialized, so the per-comm counters
    // need no read-modify-write: a relaxed load and store keep them cheap and untorn.
    if (call.countsInSequence) {
      record.seq = comm->seq.load(std::memory_order_relaxed) + 1;
      comm->seq.store(record.seq, std::memory_order_relaxed);
    }
    bool p2p = trace::isPointToPoint(call.op);
    if (trace::isCollective(call.op)) {
      record.ncclSeqNumber = comm->collectives.load(std::memory_order_relaxed);
      comm->collectives.store(record.ncclSeqNumber + 1, std::memory_order_relaxed);
    } else if (p2p) {
      record.ncclSeqNumber = comm->pointToPoint.load(std::memory_order_relaxed);
      comm->pointToPoint.store(record.ncclSeqNumber + 1, std::memory_order_relaxed);
    }
    if (p2p && call.rootOrPeer >= 0 && call.rootOrPeer < comm->nranks) {
      auto& perPeer =
          (call.op == trace::OpKind::kSend ? comm->sendSeq : comm->recvSeq)[call.rootOrPeer];
      record.p2pSeq = perPeer.load(std::memory_order_relaxed) + 1;
      perPeer.store(record.p2pSeq, std::memory_order_relaxed);
    }
    if (trace::isCollective(call.op) || p2p) {
      record.fingerprint =
          trace::fingerprint({call.op, call.count, record.dtype, record.redop, call.rootOrPeer});
      uint64_t rolling =
          trace::rollingHash(comm->rollingHash.load(std::memory_order_relaxed), record.fingerprint);
      comm->rollingHash.store(rolling, std::memory_order_relaxed);
      record.rollingHash = rolling;
    }
  }
  issued.commHash = record.commHash;
  issued.seq = record.seq;

  // Completion: events around the call, or at the outermost GroupEnd for grouped calls.
  watchdog::CompletionTracker* completion = state->completion.load(std::memory_order_acquire);
  bool tracked = false;
  const bool trackable = tracksCompletion(call.op);
  if (completion != nullptr && call.eventsAllowed && trackable) {
    watchdog::StreamCheck check = completion->checkStream(call.stream);
    if (check == watchdog::StreamCheck::kCaptured) {
      record.flags |= trace::kRecordCaptured;
    } else if (check == watchdog::StreamCheck::kTrackable) {
      if (t_groupDepth > 0) {
        ThreadBatches* batches = threadBatches();
        tracked = issued.inGroupBatch =
            batches != nullptr && batchHasRoom(batches->group, call.stream);
      } else {
        bool shed = false;
        issued.ticket = completion->recordBefore(call.stream, &shed);
        issued.completion = completion;
        tracked = issued.ticket != watchdog::kNoTicket;
        if (shed) record.flags |= trace::kRecordShed;
      }
    }
  }
  if (!tracked && (call.extraFlags & trace::kRecordKernelTracked) == 0) {
    record.flags |= trace::kRecordNoEvents;
  }
  issued.tracked = tracked;
  issued.finishOnlyOnFailure =
      trackable && issued.ticket == watchdog::kNoTicket && !issued.inGroupBatch;
  issued.index = state->writer.append(record);
  if (issued.inGroupBatch) addToBatch(t_batches->group, issued);
}

void Recorder::finish(const IssuedCall& issued, ncclComm_t comm, ncclResult_t result) {
  auto* state = static_cast<State*>(this);
  watchdog::CompletionTracker* completion = state->completion.load(std::memory_order_acquire);
  bool failed = result != ncclSuccess && result != ncclInProgress;
  if (failed) {
    markFailed(state->writer, issued.index, result);
  }
  if (issued.ticket != watchdog::kNoTicket && completion != nullptr) {
    if (failed) {
      completion->abandon(issued.ticket);
    } else if (result == ncclInProgress) {
      deferCall(*completion, state->writer, issued, comm);
    } else {
      completion->finishCall(issued.ticket, issued.stream, issued.index, issued.commHash);
    }
  } else if (issued.inGroupBatch && failed) {
    Batch& batch = t_batches->group;
    for (int c = batch.callCount - 1; c >= 0; --c) {
      if (batch.calls[c].index == issued.index) batch.calls[c].failed = true;
    }
  } else if (issued.inGroupBatch) {
    t_batches->group.comm = comm;
  } else if (!failed && !tracksCompletion(issued.op) && result == ncclSuccess) {
    // Lifecycle calls are host-synchronous: done when they return.
    int64_t now = trace::FastClock::nowNs();
    state->writer.updateState(issued.index, trace::RecordState::kCompleted, now, now);
  }
}

void Recorder::startWatchdog() {
  auto* state = static_cast<State*>(this);
  watchdog::Agent::start(state->writer, state->agentOptions);
}

void Recorder::communicatorCreated() {
  auto* state = static_cast<State*>(this);
  watchdog::Agent* agent = watchdog::Agent::start(state->writer, state->agentOptions);
  if (watchdog::CompletionTracker* completion = agent->completion()) {
    completion->prepareCurrentContext();
    state->completion.store(completion, std::memory_order_release);
  }
}

void Recorder::beforeGroupEnd() {
  auto* state = static_cast<State*>(this);
  watchdog::CompletionTracker* completion = state->completion.load(std::memory_order_acquire);
  if (completion == nullptr || t_batches == nullptr) return;
  Batch& batch = t_batches->group;
  for (int s = 0; s < batch.streamCount; ++s) {
    batch.streams[s].ticket =
        completion->recordBefore(batch.streams[s].stream, &batch.streams[s].shed);
  }
}

void Recorder::afterGroupEnd(ncclResult_t result) {
  auto* state = static_cast<State*>(this);
  watchdog::CompletionTracker* completion = state->completion.load(std::memory_order_acquire);
  if (completion == nullptr || t_batches == nullptr) return;
  Batch& batch = t_batches->group;
  if (result == ncclInProgress) {
    // A non-blocking group enqueues later: its after events wait for ncclCommGetAsyncError.
    if (t_batches->haveDeferred) submitBatch(*completion, state->writer, t_batches->deferred);
    std::swap(t_batches->group, t_batches->deferred);
    t_batches->haveDeferred = true;
    t_batches->group.callCount = t_batches->group.streamCount = 0;
    return;
  }
  if (result != ncclSuccess) {
    for (int s = 0; s < batch.streamCount; ++s) {
      if (batch.streams[s].ticket != watchdog::kNoTicket)
        completion->abandon(batch.streams[s].ticket);
    }
    for (int c = 0; c < batch.callCount; ++c) {
      markFailed(state->writer, batch.calls[c].index, result);
    }
    batch.callCount = batch.streamCount = 0;
    return;
  }
  submitBatch(*completion, state->writer, batch);
}

void Recorder::asyncErrorPolled(ncclComm_t comm, ncclResult_t asyncError) {
  if (t_batches == nullptr || !t_batches->haveDeferred || t_batches->deferred.comm != comm) return;
  if (asyncError == ncclInProgress) return;
  auto* state = static_cast<State*>(this);
  watchdog::CompletionTracker* completion = state->completion.load(std::memory_order_acquire);
  Batch& batch = t_batches->deferred;
  if (asyncError != ncclSuccess) {
    for (int c = 0; c < batch.callCount; ++c) {
      batch.calls[c].failed = true;
      markFailed(state->writer, batch.calls[c].index, asyncError);
    }
  }
  if (completion != nullptr) submitBatch(*completion, state->writer, batch);
  t_batches->haveDeferred = false;
}

int Recorder::abortByHash(uint64_t commHash) {
  auto* state = static_cast<State*>(this);
  int found = 0;
  auto real = reinterpret_cast<decltype(&::pncclCommAbort)>(resolveReal("pncclCommAbort"));
  if (real == nullptr) return 0;
  for (CommEntry& entry : state->comms) {
    ncclComm_t comm = entry.key.load(std::memory_order_acquire);
    if (comm == nullptr || entry.hash != commHash || !entry.abortable) continue;
    ++found;
    // A split or shrink of it in flight here reads it until it returns, and one that waits for
    // a rank that never comes (the hang being aborted) never does: freeing the parent under it
    // crashed the process (the sim's split read freed memory). Left as it would be without
    // ncclwatch; the other ranks' aborts still end the job. A short one is waited for.
    auto leftInSplit = [&](const char* inside) {
      std::fprintf(stderr,
                   "[ncclwatch] comm %016" PRIx64
                   " not aborted by ncclwatch: this process %s a split or shrink of it (aborting "
                   "would free it under that call)\n",
                   commHash, inside);
    };
    if (!waitUntilNoneInside(entry.childrenInFlight, 100)) {
      leftInSplit("is inside");
      continue;
    }
    if (entry.closing.exchange(true)) {
      std::fprintf(stderr,
                   "[ncclwatch] comm %016" PRIx64
                   " not aborted by ncclwatch: the application is already aborting or destroying "
                   "it (a second abort would free it twice)\n",
                   commHash);
      continue;
    }
    // The application keeps its handle, which NCCL frees now: from here on its calls on it are
    // answered by the wrappers (aborted_comms.h), never NCCL's. Remembered first, so that a
    // call racing the abort is answered too, and one already inside NCCL (PyTorch's watchdog
    // polling ncclCommGetAsyncError) is waited for.
    rememberAbortedByUs(comm);
    waitForColdCallsToLeave(100);
    if (entry.childrenInFlight.load(std::memory_order_seq_cst) > 0) {
      // A split began between the check above and the handle's remembering: not aborted either.
      forgetAbortedByUs(comm);
      entry.closing.store(false);
      leftInSplit("entered");
      continue;
    }
    CallScope scope;
    // Recorded like the application's own abort (the comm's pending calls end aborted), and
    // flagged as ours: the analysis must not take it for the application's.
    abortAndRecord(real, comm, true);
  }
  if (found > 0) return found;
  // None with that hash: a process whose wrappers hold communicators (preloaded) has this one
  // destroyed or finalized already; one that holds none runs as NCCL's profiler plugin only.
  for (CommEntry& entry : state->comms) {
    if (entry.abortable && std::atomic_ref(entry.hash).load(std::memory_order_relaxed) != 0) {
      return -1;
    }
  }
  return 0;
}

void Recorder::communicatorAborted(uint64_t commHash) {
  auto* state = static_cast<State*>(this);
  if (watchdog::CompletionTracker* completion = state->completion.load()) {
    completion->markAborted(commHash);
  }
}

trace::RingWriter& Recorder::writer() {
  return static_cast<State*>(this)->writer;
}

const char* Recorder::tracePath() const {
  return static_cast<const State*>(this)->writer.path().c_str();
}

}  // namespace ncclwatch::interpose
