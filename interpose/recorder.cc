#include "interpose/recorder.h"

#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "trace/fingerprint.h"
#include "trace/ring_writer.h"

namespace ncclwatch::interpose {
namespace {

constexpr size_t kCommTableSize = 4096;  // open addressing; far above any real process's count
constexpr uint32_t kDefaultRingRecords = 32768;  // 4 MiB of records

}  // namespace

// The process's recorder and everything it owns.
struct RecorderState final : Recorder {
  trace::RingWriter writer;
  CommEntry comms[kCommTableSize];
  std::mutex addMutex;  // serializes adds (init/split paths only, never the hot path)
};

namespace {

using State = RecorderState;

std::atomic<State*> g_state{nullptr};
std::atomic<bool> g_disabled{false};
std::once_flag g_atforkOnce;
std::mutex g_initMutex;

// initial-exec: a preloaded library's thread-locals live in the static TLS block, so reading them
// on the hot path is one instruction instead of a __tls_get_addr call.
#define NCCLWATCH_TLS thread_local __attribute__((tls_model("initial-exec")))
NCCLWATCH_TLS int t_callDepth = 0;
NCCLWATCH_TLS int t_groupDepth = 0;
NCCLWATCH_TLS int t_threadId = 0;
NCCLWATCH_TLS bool t_haveNestedId = false;
NCCLWATCH_TLS ncclUniqueId t_nestedId;

int64_t monotonicNs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

int threadId() {
  if (t_threadId == 0) t_threadId = static_cast<int>(syscall(SYS_gettid));
  return t_threadId;
}

const char* envText(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

int envRank(const char* first, const char* second, const char* third) {
  for (const char* name : {first, second, third}) {
    if (const char* text = envText(name)) return std::atoi(text);
  }
  return -1;
}

bool makeDirectories(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    std::string prefix = path.substr(0, slash);
    if (mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) return false;
    if (slash == std::string::npos) return true;
  }
}

std::string jobId() {
  for (const char* name : {"NCCLWATCH_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}) {
    if (const char* value = envText(name)) return value;
  }
  return "job-" + std::to_string(getpid());
}

uint32_t ringRecords() {
  const char* text = envText("NCCLWATCH_RING_RECORDS");
  if (text == nullptr) return kDefaultRingRecords;
  char* end = nullptr;
  unsigned long value = std::strtoul(text, &end, 10);
  if (*end != '\0' || value < trace::kMinRingCapacity || value > trace::kMaxRingCapacity) {
    std::fprintf(stderr,
                 "[ncclwatch] NCCLWATCH_RING_RECORDS=%s is not a count in [%u, %u]; using %u\n",
                 text, trace::kMinRingCapacity, trace::kMaxRingCapacity, kDefaultRingRecords);
    return kDefaultRingRecords;
  }
  return static_cast<uint32_t>(value);
}

size_t slotFor(ncclComm_t comm) {
  auto value = reinterpret_cast<uintptr_t>(comm);
  value ^= value >> 17;
  value *= 0x9e3779b97f4a7c15ull;
  return static_cast<size_t>(value >> 32) & (kCommTableSize - 1);
}

void forgetAfterFork() {
  // The child must never write into its parent's ring; it starts over lazily with its own file.
  if (State* state = g_state.load()) state->writer.forgetAfterFork();
  g_state.store(nullptr);  // the old state is leaked: its locks may be held by parent threads
  new (&g_initMutex) std::mutex();
}

// At normal exit the trace says so: a reader then tells a finished process from a killed one.
__attribute__((destructor)) void markCleanShutdown() {
  State* state = g_state.load(std::memory_order_acquire);
  if (state != nullptr && state->writer.isOpen()) state->writer.markCleanShutdown();
}

}  // namespace

CallScope::CallScope() : outermost_(t_callDepth++ == 0) {}
CallScope::~CallScope() {
  --t_callDepth;
}

int groupDepth() {
  return t_groupDepth;
}
void enterGroup() {
  ++t_groupDepth;
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

Recorder* Recorder::get() {
  if (State* state = g_state.load(std::memory_order_acquire)) {
    return state;
  }
  if (g_disabled.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(g_initMutex);
  if (State* state = g_state.load()) return state;
  const char* enable = envText("NCCLWATCH_ENABLE");
  if (enable != nullptr && (std::strcmp(enable, "0") == 0 || std::strcmp(enable, "off") == 0)) {
    g_disabled.store(true);
    return nullptr;
  }
  std::call_once(g_atforkOnce, [] { pthread_atfork(nullptr, nullptr, forgetAfterFork); });
  std::string directory =
      envText("NCCLWATCH_DIR") ? envText("NCCLWATCH_DIR") : "./ncclwatch-logs/" + jobId();
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  std::string path = directory + "/" + host + "-" + std::to_string(getpid()) + ".ncclwatch";
  auto* state = new State();
  std::string error;
  trace::ProcessInfo info{envRank("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"),
                          envRank("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"),
                          envRank("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"),
                          host, jobId()};
  if (!makeDirectories(directory)) {
    error = directory + ": cannot create the log folder: " + std::strerror(errno);
  } else {
    state->writer.open(path, ringRecords(), info, &error);
  }
  if (!state->writer.isOpen()) {
    std::fprintf(stderr, "[ncclwatch] recording off: %s\n", error.c_str());
    delete state;
    g_disabled.store(true);
    return nullptr;
  }
  int version = 0;
  ncclGetVersion(&version);  // through our own forwarding wrapper
  state->writer.setNcclLibrary(version, "");
  g_state.store(state, std::memory_order_release);
  return state;
}

CommEntry* Recorder::find(ncclComm_t comm) {
  auto* state = static_cast<State*>(this);
  size_t start = slotFor(comm);
  for (size_t probe = 0; probe < kCommTableSize; ++probe) {
    CommEntry& entry = state->comms[(start + probe) & (kCommTableSize - 1)];
    ncclComm_t key = entry.key.load(std::memory_order_acquire);
    if (key == comm) return &entry;
    if (key == nullptr && entry.hash == 0) return nullptr;  // never used: end of the chain
  }
  return nullptr;
}

CommEntry* Recorder::add(const CommCreation& creation) {
  auto* state = static_cast<State*>(this);
  std::lock_guard<std::mutex> lock(state->addMutex);
  if (CommEntry* existing = find(creation.comm)) return existing;
  size_t start = slotFor(creation.comm);
  for (size_t probe = 0; probe < kCommTableSize; ++probe) {
    CommEntry& entry = state->comms[(start + probe) & (kCommTableSize - 1)];
    if (entry.key.load() != nullptr || entry.hash != 0) continue;  // used, or a tombstone
    entry.hash = creation.hash;
    entry.parentHash = creation.parentHash;
    entry.nranks = creation.nranks;
    entry.rank = creation.rank;
    entry.rollingHash.store(trace::kRollingSeed);
    if (creation.nranks > 0) {
      entry.sendSeq = new std::atomic<uint64_t>[creation.nranks]();
      entry.recvSeq = new std::atomic<uint64_t>[creation.nranks]();
    }
    entry.key.store(creation.comm, std::memory_order_release);
    trace::CommInfo info{};
    info.commHash = creation.hash;
    info.parentHash = creation.parentHash;
    info.commPointer = reinterpret_cast<uint64_t>(creation.comm);
    info.createdNs = monotonicNs();
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
  return nullptr;  // table full: calls on it are recorded without a communicator
}

void Recorder::forget(ncclComm_t comm) {
  if (CommEntry* entry = find(comm)) {
    // A tombstone: hash stays non-zero so that probe chains stay intact.
    entry->key.store(nullptr, std::memory_order_release);
  }
}

uint64_t Recorder::issue(CommEntry* comm, const CallDescription& call) {
  auto* state = static_cast<State*>(this);
  trace::CallRecord record{};
  record.op = call.op;
  record.count = call.count;
  record.dtype = static_cast<uint8_t>(call.dtype);
  record.redop = static_cast<uint8_t>(call.redop < 0 ? 0 : call.redop);
  record.rootOrPeer = call.rootOrPeer;
  record.stream = call.stream;
  record.callSite = call.callSite;
  record.issueNs = monotonicNs();
  record.threadId = threadId();
  record.groupDepth = static_cast<uint16_t>(t_groupDepth);
  record.state = trace::RecordState::kIssued;
  record.flags = trace::kRecordNoEvents | (t_groupDepth > 0 ? trace::kRecordInGroup : 0);
  record.commHash = call.commHash;
  if (comm != nullptr) {
    record.commHash = comm->hash;
    if (call.countsInSequence) record.seq = comm->seq.fetch_add(1, std::memory_order_relaxed) + 1;
    bool p2p = trace::isPointToPoint(call.op);
    if (trace::isCollective(call.op)) {
      record.ncclSeqNumber = comm->collectives.fetch_add(1, std::memory_order_relaxed);
    } else if (p2p) {
      record.ncclSeqNumber = comm->pointToPoint.fetch_add(1, std::memory_order_relaxed);
    }
    if (p2p && call.rootOrPeer >= 0 && call.rootOrPeer < comm->nranks) {
      auto* perPeer = call.op == trace::OpKind::kSend ? comm->sendSeq : comm->recvSeq;
      record.p2pSeq = perPeer[call.rootOrPeer].fetch_add(1, std::memory_order_relaxed) + 1;
    }
    if (trace::isCollective(call.op) || p2p) {
      record.fingerprint =
          trace::fingerprint({call.op, call.count, record.dtype, record.redop, call.rootOrPeer});
      // One thread issues a comm's calls in order (NCCL requires it), so load-then-store is
      // enough; the atomic only keeps concurrent misuse from tearing the value.
      uint64_t rolling =
          trace::rollingHash(comm->rollingHash.load(std::memory_order_relaxed), record.fingerprint);
      comm->rollingHash.store(rolling, std::memory_order_relaxed);
      record.rollingHash = rolling;
    }
  }
  return state->writer.append(record);
}

void Recorder::finish(uint64_t index, ncclResult_t result) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  auto* state = static_cast<State*>(this);
  state->writer.updateState(index, trace::RecordState::kFailed, 0, 0);
  state->writer.updateResult(index, static_cast<int32_t>(result));
}

const char* Recorder::tracePath() const {
  return static_cast<const State*>(this)->writer.path().c_str();
}

}  // namespace ncclwatch::interpose
