// Communicator lifecycle: unique ids, init, split, shrink, finalize, destroy, abort, revoke.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <unordered_set>

#include "comm_hash.h"
#include "internal.h"

namespace ncclsim {
namespace {

constexpr char kIdMagic[8] = {'n', 'c', 'c', 'l', 's', 'i', 'm', '1'};

struct IdLayout {
  char magic[8];
  int32_t creatorPid;
  char random[116];
};
static_assert(sizeof(IdLayout) == NCCL_UNIQUE_ID_BYTES);

std::atomic<const SimConfig*> gConfig{nullptr};
std::mutex* gConfigMutex = new std::mutex;
std::atomic<int> gCommsCreated{0};
thread_local std::string tLastError;

const char* envLookup(const char* name) {
  return std::getenv(name);
}

void resetAfterFork() {
  // The child starts over: its environment may differ (tests set NCCLSIM_* after fork), and no
  // lock held by a parent thread may stay locked.
  gConfigMutex = new std::mutex;
  gConfig.store(nullptr);
  gCommsCreated.store(0);
  forgetHeapMappingsAfterFork();
  profilerResetAfterFork();
  groupResetAfterFork();
}

void ensureProcessSetup() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, resetAfterFork); });
}

uint64_t segmentKeyForChild(uint64_t parentKey, char kind, int counter, int color) {
  CommHasher hasher;
  hasher.absorb(&parentKey, sizeof parentKey);
  hasher.absorb(&kind, sizeof kind);
  hasher.absorb(&counter, sizeof counter);
  hasher.absorb(&color, sizeof color);
  return hasher.digest();
}

std::string segmentName(int creatorPid, uint64_t key) {
  char name[64];
  std::snprintf(name, sizeof name, "/ncclsim-%d-%016" PRIx64, creatorPid, key);
  return name;
}

bool configIsValid(const ncclConfig_t* config) {
  return config == nullptr || (config->magic == 0xcafebeef && config->size >= sizeof(size_t) * 2);
}

bool blockingFrom(const ncclConfig_t* config, bool inherited) {
  if (config && config->blocking != NCCL_CONFIG_UNDEF_INT) return config->blocking != 0;
  if (const char* env = std::getenv("NCCL_COMM_BLOCKING")) return std::atoi(env) != 0;
  return inherited;
}

// Handles given back to NCCL (noteCommFreed), until an allocation reuses the address.
std::mutex gFreedCommsMutex;
std::unordered_set<const ncclComm*> gFreedComms;
std::atomic<size_t> gFreedCommCount{0};  // a collective's check is one load while none is

void forgetFreedComm(const ncclComm* comm) {
  if (gFreedCommCount.load() == 0) return;
  std::lock_guard<std::mutex> lock(gFreedCommsMutex);
  gFreedComms.erase(comm);
  gFreedCommCount.store(gFreedComms.size());
}

ncclComm* newComm(const ncclConfig_t* config, bool inheritedBlocking,
                  const std::string& inheritedName) {
  auto* comm = new ncclComm;
  forgetFreedComm(comm);
  comm->ownerPid = getpid();
  comm->blocking = blockingFrom(config, inheritedBlocking);
  comm->commName = config && config->commName ? config->commName : inheritedName;
  comm->creationIndex = gCommsCreated.fetch_add(1);
  int device = 0;
  cudaGetDevice(&device);
  comm->cudaDevice = device;
  return comm;
}

// NCCL's host identity: NCCL_HOSTID when set, else the host name (NCCL adds the boot id, the same
// for every process of a machine).
uint64_t hostHash() {
  std::string identity;
  if (const char* id = std::getenv("NCCL_HOSTID"); id != nullptr && id[0] != '\0') {
    identity = id;
  } else {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    identity = name;
  }
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : identity) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// The device's PCI bus id as NCCL prints it in "Duplicate GPU detected" (its digits read as one
// hex number): the sim's bus id of device d is 0000:dd:00.0.
unsigned busIdNumber(int device) {
  return static_cast<unsigned>(device) << 12;
}

// The collective part of every init: map the segment, claim the rank, wait for all ranks.
ncclResult_t rendezvousInit(ncclComm* comm) {
  const std::string name = segmentName(comm->creatorPid, comm->segmentKey);
  const std::string error = comm->segment.attach(name, comm->nranks);
  if (!error.empty()) return fail(ncclInvalidUsage, "init: " + error);
  RankSlot* mine = comm->segment.slot(comm->rank);
  if (mine->claimed.exchange(1) != 0) {
    return fail(ncclInvalidUsage, "init: rank " + std::to_string(comm->rank) +
                                      " was claimed twice in one communicator");
  }
  mine->pid = getpid();
  mine->hostHash = hostHash();
  mine->device = comm->cudaDevice;
  comm->sendsExecutedTo.assign(comm->nranks, 0);
  comm->recvsExecutedFrom.assign(comm->nranks, 0);
  SegmentHeader* head = comm->segment.header();
  const uint32_t attached = head->attached.fetch_add(1) + 1;
  comm->segment.notifyAll();
  // The last rank to arrive removes the name, so that a crash later leaves nothing in /dev/shm.
  if (attached == static_cast<uint32_t>(comm->nranks)) comm->segment.unlinkName();
  const bool complete = waitOnSegment(
      comm, comm->aborted,
      [&] {
        return head->attached.load(std::memory_order_acquire) >=
               static_cast<uint32_t>(comm->nranks);
      },
      [&] {
        debugLine(commLabel(comm) + " init waits: " + std::to_string(head->attached.load()) + "/" +
                  std::to_string(comm->nranks) + " ranks attached");
      });
  if (!complete) return fail(ncclInvalidUsage, "init: communicator aborted while initializing");
  comm->segment.markUsedUp();
  // NCCL's check of the peers' info: a rank that shares its host and GPU with another rank of
  // the communicator is refused; the others go on into the rest of the bootstrap, which the
  // refused ranks never join, and wait there (in init, until aborted or killed).
  int duplicateOfMine = -1;
  bool anyDuplicate = false;
  for (int a = 0; a < comm->nranks; ++a) {
    const RankSlot* first = comm->segment.slot(a);
    for (int b = a + 1; b < comm->nranks; ++b) {
      const RankSlot* second = comm->segment.slot(b);
      if (first->hostHash != second->hostHash || first->device != second->device) continue;
      anyDuplicate = true;
      if (a == comm->rank && duplicateOfMine < 0) duplicateOfMine = b;
      if (b == comm->rank && duplicateOfMine < 0) duplicateOfMine = a;
    }
  }
  if (duplicateOfMine >= 0) {
    char text[128];
    std::snprintf(text, sizeof text,
                  "Duplicate GPU detected : rank %d and rank %d both on CUDA device %x", comm->rank,
                  duplicateOfMine, busIdNumber(comm->cudaDevice));
    return fail(ncclInvalidUsage, text);
  }
  if (anyDuplicate) {
    waitOnSegment(
        comm, comm->aborted, [] { return false; },
        [&] { debugLine(commLabel(comm) + " init waits for ranks refused on a duplicate GPU"); });
    return fail(ncclInvalidUsage, "init: communicator aborted while initializing");
  }
  profilerAttach(comm);
  return ncclSuccess;
}

// Runs `work` now (blocking comms) or on the comm's background thread (non-blocking ones).
ncclResult_t runCreation(ncclComm* comm, std::function<ncclResult_t()> work) {
  if (comm->blocking) {
    const ncclResult_t result = work();
    comm->initState.store(result);
    return result;
  }
  std::lock_guard<std::mutex> lock(comm->backgroundMutex);
  comm->background = std::thread([comm, work = std::move(work)] { comm->initState.store(work()); });
  return ncclInProgress;
}

void joinBackground(ncclComm* comm) {
  std::lock_guard<std::mutex> lock(comm->backgroundMutex);
  if (comm->background.joinable()) comm->background.join();
}

}  // namespace

ncclResult_t runDeferredInits(std::vector<DeferredInit>& inits) {
  // Blocking inits of one group run concurrently (one thread each, as NCCL's group jobs do), so
  // that a single thread can create all ranks of a communicator.
  std::vector<std::thread> threads;
  for (DeferredInit& init : inits) {
    if (init.comm->blocking) {
      threads.emplace_back([&init] { init.comm->initState.store(init.work()); });
    } else {
      runCreation(init.comm, init.work);
    }
  }
  for (std::thread& thread : threads) thread.join();
  ncclResult_t result = ncclSuccess;
  for (DeferredInit& init : inits) {
    const ncclResult_t state = init.comm->initState.load();
    if (state != ncclSuccess && state != ncclInProgress) result = state;
  }
  return result;
}

namespace {

bool idIsOurs(const ncclUniqueId& id) {
  return std::memcmp(id.internal, kIdMagic, sizeof kIdMagic) == 0;
}

ncclResult_t initRoot(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                      const ncclConfig_t* config, const char* caller) {
  ensureProcessSetup();
  simConfig();
  if (out == nullptr) return fail(ncclInvalidArgument, std::string(caller) + ": comm is NULL");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return fail(ncclInvalidArgument, std::string(caller) + ": rank " + std::to_string(rank) +
                                         " is not in [0, " + std::to_string(nranks) + ")");
  }
  if (!idIsOurs(id)) {
    return fail(ncclInvalidArgument,
                std::string(caller) + ": the unique id was not made by ncclGetUniqueId");
  }
  if (!configIsValid(config)) {
    return fail(ncclInvalidArgument,
                std::string(caller) + ": config was not set with NCCL_CONFIG_INITIALIZER");
  }
  ncclComm* comm = newComm(config, true, "");
  IdLayout layout;
  std::memcpy(&layout, id.internal, sizeof layout);
  comm->rank = rank;
  comm->nranks = nranks;
  comm->commHash = rootCommHash(id.internal, NCCL_UNIQUE_ID_BYTES);
  comm->segmentKey = comm->commHash;
  comm->creatorPid = layout.creatorPid;
  *out = comm;
  if (groupDepth() > 0) {
    deferInitToGroupEnd(comm, [comm] { return rendezvousInit(comm); });
    return ncclSuccess;
  }
  const ncclResult_t result = runCreation(comm, [comm] { return rendezvousInit(comm); });
  if (result != ncclSuccess && result != ncclInProgress) {
    *out = nullptr;
    releaseComm(comm);
  }
  return result;
}

}  // namespace

const SimConfig& simConfig() {
  const SimConfig* config = gConfig.load(std::memory_order_acquire);
  if (config) return *config;
  std::lock_guard<std::mutex> lock(*gConfigMutex);
  config = gConfig.load();
  if (!config) {
    config = new SimConfig(parseSimConfig(envLookup));  // lives for the process
    gConfig.store(config, std::memory_order_release);
  }
  return *config;
}

void setLastError(const std::string& text) {
  tLastError = text;
}
const std::string& lastError() {
  return tLastError;
}

ncclResult_t fail(ncclResult_t result, const std::string& text) {
  setLastError(text);
  if (simConfig().debug) std::fprintf(stderr, "ncclsim: error: %s\n", text.c_str());
  return result;
}

void debugLine(const std::string& text) {
  if (simConfig().debug) std::fprintf(stderr, "ncclsim: %s\n", text.c_str());
}

std::string commLabel(const ncclComm* comm) {
  char text[96];
  std::snprintf(text, sizeof text, "rank %d comm %016" PRIx64, comm->rank, comm->commHash);
  return text;
}

void retainComm(ncclComm* comm) {
  comm->references.fetch_add(1);
}

void releaseComm(ncclComm* comm) {
  if (comm->references.fetch_sub(1) == 1) delete comm;
}

void noteCommFreed(const ncclComm* comm) {
  std::lock_guard<std::mutex> lock(gFreedCommsMutex);
  gFreedComms.insert(comm);
  gFreedCommCount.store(gFreedComms.size());
}

void stopOnFreedComm(const ncclComm* comm, const char* caller) {
  if (comm == nullptr || gFreedCommCount.load() == 0) return;
  std::lock_guard<std::mutex> lock(gFreedCommsMutex);
  if (gFreedComms.count(comm) == 0) return;
  std::fprintf(stderr,
               "ncclsim: %s: communicator %p was freed by an earlier ncclCommDestroy or "
               "ncclCommAbort (use after free: real NCCL reads freed memory here)\n",
               caller, static_cast<const void*>(comm));
  std::abort();
}

ncclResult_t checkCommUsable(ncclComm* comm, const char* caller) {
  if (comm == nullptr) return fail(ncclInvalidArgument, std::string(caller) + ": comm is NULL");
  stopOnFreedComm(comm, caller);
  if (comm->ownerPid != getpid()) {
    return fail(ncclInvalidUsage,
                std::string(caller) + ": communicator belongs to the parent process (fork)");
  }
  if (comm->aborted.load())
    return fail(ncclInvalidUsage, std::string(caller) + ": communicator was aborted");
  const ncclResult_t state = comm->initState.load();
  if (state == ncclInProgress) {
    return fail(ncclInvalidUsage, std::string(caller) + ": communicator is still initializing");
  }
  if (state != ncclSuccess)
    return fail(state, std::string(caller) + ": communicator failed to initialize");
  return ncclSuccess;
}

uint64_t nextIssueSeq(ncclComm* comm) {
  return comm->issuedOps.fetch_add(1) + 1;
}

namespace {
bool faultMatches(const Fault& fault, const ncclComm* comm) {
  return fault.rank == comm->rank && fault.commIndex == comm->creationIndex;
}
}  // namespace

void applyCrashFault(ncclComm* comm, uint64_t seq) {
  for (const Fault& fault : simConfig().faults) {
    if (fault.kind == FaultKind::kCrash && faultMatches(fault, comm) && fault.seq == seq) {
      std::fprintf(stderr, "ncclsim: %s crashing at seq %" PRIu64 " (NCCLSIM_FAULT)\n",
                   commLabel(comm).c_str(), seq);
      std::fflush(stderr);
      raise(SIGSEGV);
    }
  }
}

void faultsForOperation(ncclComm* comm, uint64_t seq, Operation* op) {
  for (const Fault& fault : simConfig().faults) {
    if (!faultMatches(fault, comm)) continue;
    switch (fault.kind) {
      case FaultKind::kSlow:
        if (seq >= fault.seq) op->slowUs += fault.delayUs;
        break;
      case FaultKind::kStall:
        if (seq == fault.seq) op->stall = true;
        break;
      case FaultKind::kPause:
        if (seq == fault.seq) op->slowUs += fault.delayUs;
        break;
      case FaultKind::kNetError:
        if (seq >= fault.seq) {
          op->netError = true;
          op->netErrorIsSystem = fault.systemError;
        }
        break;
      case FaultKind::kCrash:
        break;
    }
  }
}

// Stall/neterror faults on split and shrink: the call waits until the parent is aborted.
static bool hostFaultBlocks(ncclComm* parent, uint64_t seq) {
  Operation probe;
  faultsForOperation(parent, seq, &probe);
  if (probe.netError) {
    parent->asyncError.store(probe.netErrorIsSystem ? ncclSystemError : ncclRemoteError);
  }
  if (!probe.stall && !probe.netError) return false;
  waitOnSegment(
      parent, parent->aborted, [] { return false; }, [] {});
  return true;
}

// Split: every rank of the parent posts (colour, key); members of a colour are then ordered by
// (key, parent rank). Posts are double-buffered by split number: a rank can only reach split n+2
// after everyone posted n+1, i.e. after everyone finished reading split n.
static ncclResult_t splitExchange(ncclComm* parent, int splitNumber, int color, int key,
                                  int* newRank, int* newSize) {
  SplitPost& post = parent->segment.slot(parent->rank)->split[splitNumber % 2];
  post.color = color;
  post.key = key;
  post.splitNumber.store(splitNumber, std::memory_order_release);
  parent->segment.notifyAll();
  auto posted = [&](int r) {
    return parent->segment.slot(r)->split[splitNumber % 2].splitNumber.load(
               std::memory_order_acquire) >= static_cast<uint64_t>(splitNumber);
  };
  const bool complete = waitOnSegment(
      parent, parent->aborted,
      [&] {
        for (int r = 0; r < parent->nranks; ++r)
          if (!posted(r)) return false;
        return true;
      },
      [&] {
        std::string missing;
        for (int r = 0; r < parent->nranks; ++r)
          if (!posted(r)) missing += (missing.empty() ? "" : ",") + std::to_string(r);
        debugLine(commLabel(parent) + " split #" + std::to_string(splitNumber) +
                  " waits: missing ranks " + missing);
      });
  if (!complete) return fail(ncclInvalidUsage, "ncclCommSplit: parent communicator was aborted");
  std::vector<std::pair<int, int>> members;  // (key, parent rank)
  for (int r = 0; r < parent->nranks; ++r) {
    const SplitPost& theirs = parent->segment.slot(r)->split[splitNumber % 2];
    if (theirs.color == color) members.emplace_back(theirs.key, r);
  }
  std::sort(members.begin(), members.end());
  *newSize = static_cast<int>(members.size());
  *newRank = static_cast<int>(
      std::find(members.begin(), members.end(), std::make_pair(key, parent->rank)) -
      members.begin());
  return ncclSuccess;
}

static ncclResult_t makeChild(ncclComm* parent, ncclComm_t* newcomm, ncclConfig_t* config,
                              const char* caller, std::function<ncclResult_t(ncclComm*)> setup) {
  ncclComm* child = newComm(config, parent->blocking, parent->commName);
  child->rank = -1;  // known once the exchange is done
  child->creatorPid = parent->creatorPid;
  child->cudaDevice = parent->cudaDevice;
  *newcomm = child;
  retainComm(parent);  // the creation work reads the parent; it may run after the parent's Destroy
  const ncclResult_t result = runCreation(child, [parent, child, setup = std::move(setup)] {
    ncclResult_t r = setup(child);
    if (r == ncclSuccess) r = rendezvousInit(child);
    releaseComm(parent);
    return r;
  });
  if (result != ncclSuccess && result != ncclInProgress) {
    *newcomm = nullptr;
    releaseComm(child);
  }
  (void)caller;
  return result;
}

}  // namespace ncclsim

using namespace ncclsim;

// ----- exported API (api_macros.h gives each its weak ncclX + strong pncclX) -----
#include "api_macros.h"

NCCL_API(ncclResult_t, ncclGetVersion, int* version);
ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId* uniqueId);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  // Must not touch CUDA: programs fork after calling this.
  ensureProcessSetup();
  if (uniqueId == nullptr) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  removeStaleSegments();
  IdLayout layout{};
  std::memcpy(layout.magic, kIdMagic, sizeof kIdMagic);
  layout.creatorPid = getpid();
  size_t filled = 0;
  while (filled < sizeof layout.random) {
    const ssize_t got = getrandom(layout.random + filled, sizeof layout.random - filled, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return fail(ncclSystemError,
                  std::string("ncclGetUniqueId: getrandom: ") + std::strerror(errno));
    }
    filled += static_cast<size_t>(got);
  }
  std::memcpy(uniqueId->internal, &layout, sizeof layout);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t* comm, int nranks, ncclUniqueId commId,
         int rank);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return initRoot(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t* comm, int nranks, ncclUniqueId commId,
         int rank, ncclConfig_t* config);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  return initRoot(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t* newcomm, int nranks, int myrank,
         int nId, ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config) {
  if (nId < 1 || commIds == nullptr) {
    return fail(ncclInvalidArgument, "ncclCommInitRankScalable: needs at least one unique id");
  }
  // Extra ids only speed up NCCL's bootstrap; like NCCL, identity comes from commIds[0].
  return initRoot(newcomm, nranks, commIds[0], myrank, config, "ncclCommInitRankScalable");
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1)
    return fail(ncclInvalidArgument, "ncclCommInitAll: bad arguments");
  ncclUniqueId id;
  // Through the PLT, as real NCCL does, so an interposer sees this call.
  ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) return result;
  int savedDevice = 0;
  cudaGetDevice(&savedDevice);
  ncclGroupStart();
  for (int i = 0; i < ndev; ++i) {
    cudaSetDevice(devlist ? devlist[i] : i);
    const ncclResult_t one = initRoot(&comms[i], ndev, id, i, nullptr, "ncclCommInitAll");
    if (one != ncclSuccess) result = one;
  }
  const ncclResult_t ended = ncclGroupEnd();
  cudaSetDevice(savedDevice);
  return result != ncclSuccess ? result : ended;
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
         ncclConfig_t* config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  if (ncclResult_t r = checkCommUsable(comm, "ncclCommSplit"); r != ncclSuccess) return r;
  if (newcomm == nullptr) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return fail(ncclInvalidArgument, "ncclCommSplit: color must be >= 0 or NCCL_SPLIT_NOCOLOR");
  }
  if (!configIsValid(config)) return fail(ncclInvalidArgument, "ncclCommSplit: bad config");
  *newcomm = nullptr;
  const uint64_t seq = nextIssueSeq(comm);
  applyCrashFault(comm, seq);
  if (hostFaultBlocks(comm, seq)) return fail(ncclInvalidUsage, "ncclCommSplit: aborted");
  const int splitNumber = ++comm->splitCount;  // NCCL counts NOCOLOR calls too
  if (color == NCCL_SPLIT_NOCOLOR) {
    // No child, but the peers need this rank's post; a non-blocking caller does not wait for it.
    if (blockingFrom(config, comm->blocking)) {
      int ignoredRank = 0, ignoredSize = 0;
      return splitExchange(comm, splitNumber, color, key, &ignoredRank, &ignoredSize);
    }
    retainComm(comm);
    std::thread([comm, splitNumber, color, key] {
      int ignoredRank = 0, ignoredSize = 0;
      splitExchange(comm, splitNumber, color, key, &ignoredRank, &ignoredSize);
      releaseComm(comm);
    }).detach();
    return ncclSuccess;
  }
  return makeChild(
      comm, newcomm, config, "ncclCommSplit", [comm, splitNumber, color, key](ncclComm* child) {
        int newRank = 0, newSize = 0;
        const ncclResult_t r = splitExchange(comm, splitNumber, color, key, &newRank, &newSize);
        if (r != ncclSuccess) return r;
        child->rank = newRank;
        child->nranks = newSize;
        child->commHash = childCommHash(comm->commHash, splitNumber, color);
        child->segmentKey = segmentKeyForChild(comm->segmentKey, 's', splitNumber, color);
        return ncclSuccess;
      });
}

NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int* excludeRanksList,
         int excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  if (ncclResult_t r = checkCommUsable(comm, "ncclCommShrink"); r != ncclSuccess) return r;
  if (newcomm == nullptr) return fail(ncclInvalidArgument, "ncclCommShrink: newcomm is NULL");
  if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == nullptr)) {
    return fail(ncclInvalidArgument, "ncclCommShrink: bad exclude list");
  }
  if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT) {
    return fail(ncclInvalidArgument, "ncclCommShrink: unknown shrinkFlags");
  }
  if (!configIsValid(config)) return fail(ncclInvalidArgument, "ncclCommShrink: bad config");
  std::set<int> excluded;
  for (int i = 0; i < excludeRanksCount; ++i) {
    const int r = excludeRanksList[i];
    if (r < 0 || r >= comm->nranks)
      return fail(ncclInvalidArgument, "ncclCommShrink: excluded rank out of range");
    excluded.insert(r);
  }
  if (excluded.count(comm->rank)) {
    return fail(ncclInvalidArgument, "ncclCommShrink: called by an excluded rank");
  }
  if (static_cast<int>(excluded.size()) == comm->nranks) {
    return fail(ncclInvalidArgument, "ncclCommShrink: every rank is excluded");
  }
  *newcomm = nullptr;
  const uint64_t seq = nextIssueSeq(comm);
  applyCrashFault(comm, seq);
  if (hostFaultBlocks(comm, seq)) return fail(ncclInvalidUsage, "ncclCommShrink: aborted");
  if (shrinkFlags == NCCL_SHRINK_ABORT) {
    // Like NCCL: raise the abort flag, let the parent's operations drain, lower it again.
    abortQueuedAndRunning(comm, 2000);
    if (!comm->revoked.load()) comm->cancelOps.store(false);
  }
  // Survivors keep their order, closing the gaps. Shrinks have their own counter for segment
  // names, since NCCL's commHash for every shrink of one parent is the same.
  const int shrinkNumber = ++comm->shrinkCount;
  const int below =
      static_cast<int>(std::distance(excluded.begin(), excluded.lower_bound(comm->rank)));
  const int newRank = comm->rank - below;
  const int newSize = comm->nranks - static_cast<int>(excluded.size());
  return makeChild(comm, newcomm, config, "ncclCommShrink",
                   [comm, shrinkNumber, newRank, newSize](ncclComm* child) {
                     child->rank = newRank;
                     child->nranks = newSize;
                     child->commHash = childCommHash(comm->commHash, 0, 0);
                     child->segmentKey = segmentKeyForChild(comm->segmentKey, 'k', shrinkNumber, 0);
                     return ncclSuccess;
                   });
}

NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm);
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (ncclResult_t r = checkCommUsable(comm, "ncclCommFinalize"); r != ncclSuccess) return r;
  if (comm->revoked.load())
    return fail(ncclInvalidUsage, "ncclCommFinalize: invalid after ncclCommRevoke");
  if (comm->blocking) {
    waitOutstanding(comm);
    comm->finalized = true;
    return ncclSuccess;
  }
  joinBackground(comm);
  comm->finalizing.store(true);
  comm->finalized = true;
  std::lock_guard<std::mutex> lock(comm->backgroundMutex);
  comm->background = std::thread([comm] {
    waitOutstanding(comm);
    comm->finalizing.store(false);
  });
  return ncclInProgress;
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  stopOnFreedComm(comm, "ncclCommDestroy");
  if (comm->ownerPid != getpid()) {
    return fail(ncclInvalidUsage,
                "ncclCommDestroy: communicator belongs to the parent process (fork)");
  }
  joinBackground(comm);
  if (!comm->finalized) waitOutstanding(comm);  // like NCCL, a hung operation hangs Destroy
  profilerDetach(comm);
  comm->destroyed = true;
  noteCommFreed(comm);
  releaseComm(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  stopOnFreedComm(comm, "ncclCommAbort");
  if (comm->ownerPid != getpid()) {
    return fail(ncclInvalidUsage,
                "ncclCommAbort: communicator belongs to the parent process (fork)");
  }
  comm->aborted.store(true);
  abortQueuedAndRunning(comm, 1000);
  joinBackground(comm);
  profilerDetach(comm);
  comm->destroyed = true;
  noteCommFreed(comm);
  releaseComm(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (ncclResult_t r = checkCommUsable(comm, "ncclCommRevoke"); r != ncclSuccess) return r;
  if (revokeFlags != NCCL_REVOKE_DEFAULT) {
    return fail(ncclInvalidArgument, "ncclCommRevoke: revokeFlags must be NCCL_REVOKE_DEFAULT");
  }
  comm->revoked.store(true);
  abortQueuedAndRunning(comm, 1000);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr) {
    return fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
  }
  stopOnFreedComm(comm, "ncclCommGetAsyncError");
  const ncclResult_t state = comm->initState.load();
  if (state != ncclSuccess) {
    *asyncError = state;
  } else if (comm->finalizing.load()) {
    *asyncError = ncclInProgress;
  } else {
    *asyncError = comm->asyncError.load();
  }
  return ncclSuccess;
}

static ncclResult_t knownMembership(const ncclComm_t comm, const char* caller) {
  if (comm == nullptr) return fail(ncclInvalidArgument, std::string(caller) + ": comm is NULL");
  stopOnFreedComm(comm, caller);
  if (comm->rank < 0)
    return fail(ncclInvalidUsage, std::string(caller) + ": communicator is still being created");
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (ncclResult_t r = knownMembership(comm, "ncclCommCount"); r != ncclSuccess) return r;
  if (count == nullptr) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
  *count = comm->nranks;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* device);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr)
    return fail(ncclInvalidArgument, "ncclCommCuDevice: NULL argument");
  *device = comm->cudaDevice;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (ncclResult_t r = knownMembership(comm, "ncclCommUserRank"); r != ncclSuccess) return r;
  if (rank == nullptr) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  *rank = comm->rank;
  return ncclSuccess;
}

NCCL_API(const char*, ncclGetErrorString, ncclResult_t result);
const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

NCCL_API(const char*, ncclGetLastError, ncclComm_t comm);
const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;  // like NCCL, the text is not per communicator
  return lastError().c_str();
}

// Deprecated in NCCL and a no-op here: the sim re-reads nothing on demand.
extern "C" __attribute__((visibility("default"))) void ncclResetDebugInitInternal() {}
NCCL_API(void, ncclResetDebugInit);
void ncclResetDebugInit() {
  ncclResetDebugInitInternal();
}
