// The shared-memory segment through which the ranks of one communicator meet: one POSIX shm
// object per communicator, holding a slot per rank (collective descriptors, split posts) and a
// mailbox per ordered pair of ranks (point-to-point). Everything in it is plain data and atomics
// that work across processes.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "datatypes.h"

namespace ncclsim {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");

// Where a buffer lives, in its owner's memfd heap (see cudasim_ext.h). pid 0 means "no buffer".
struct HeapRef {
  int32_t pid = 0;
  int32_t fd = -1;
  uint64_t offset = 0;
  uint64_t bytesToEnd = 0;
};

enum class CollKind : uint32_t {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAlltoAll,
  kGather,
  kScatter,
};
const char* collKindName(CollKind kind);
bool collKindHasRoot(CollKind kind);
bool collKindReduces(CollKind kind);

// What one rank posts for one collective. redop holds the ncclRedOp_t for built-in ops and
// ncclNumOps for any PreMulSum, because user op handles are per rank and may differ.
struct CollDescriptor {
  uint32_t kind = 0;
  int32_t dtype = 0;
  int32_t redop = 0;
  int32_t root = 0;
  uint64_t count = 0;
  uint64_t bytes = 0;  // count * element size: what corrupt mode compares
  uint64_t issueSeq = 0;
  HeapRef send;
  Scalar scalar;  // this rank's PreMulSum factor, in the element type
};

struct SplitPost {
  std::atomic<uint64_t> splitNumber;  // which ncclCommSplit call of this rank the colour is for
  int32_t color;
  int32_t key;
};

struct alignas(64) RankSlot {
  std::atomic<uint32_t> claimed;
  int32_t pid;
  // Written before the rank counts itself attached: NCCL's peer info, which refuses two ranks of
  // one communicator on one GPU of one host.
  uint64_t hostHash;
  int32_t device;
  std::atomic<uint64_t> postedColl;  // barrier 1: descriptor of this collective number is posted
  std::atomic<uint64_t> doneColl;    // barrier 2: finished reading peers' buffers
  CollDescriptor descriptor;
  SplitPost split[2];  // double-buffered by split number parity
};

constexpr int kMailboxDepth = 16;

struct P2pPost {
  uint64_t bytes;
  uint64_t count;
  int32_t dtype;
  int32_t pad;
  uint64_t issueSeq;
  HeapRef source;
};

// Sends from `src` to `dst`: the k-th post pairs with the receiver's k-th receive.
struct alignas(64) Mailbox {
  std::atomic<uint64_t> posted;
  std::atomic<uint64_t> acked;
  P2pPost ring[kMailboxDepth];
};

constexpr uint32_t kSegmentReadyMagic = 0x6e63736d;  // "ncsm"

struct SegmentHeader {
  std::atomic<uint32_t> ready;
  int32_t nranks;
  uint64_t size;
  std::atomic<uint32_t> attached;
  std::atomic<uint32_t> wakeWord;  // event count: bumped on every post; futex waits on it
  std::atomic<uint32_t> sleepers;
};

// A mapped segment. Not copyable; unmapped by the destructor.
class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  static size_t sizeFor(int nranks);

  SegmentHeader* header() const {
    return static_cast<SegmentHeader*>(base_.load(std::memory_order_acquire));
  }
  RankSlot* slot(int rank) const;
  Mailbox* mailbox(int src, int dst) const;

  // Creates the named segment or opens the one a peer created (whoever wins O_EXCL initializes
  // it). Returns an empty string on success, else a message.
  std::string attach(const std::string& name, int nranks);
  void unlinkName();
  // Once the communicator's init completed: a later init from the same id in this process fails.
  void markUsedUp() const;
  const std::string& name() const { return name_; }

  // Event count: posters bump and wake; waiters sleep on the word with a timeout.
  void notifyAll();
  uint32_t wakeValue() const { return header()->wakeWord.load(std::memory_order_acquire); }
  void sleep(uint32_t seenValue, int timeoutMs);

 private:
  // Atomic: ncclCommAbort on another thread reads it while a non-blocking init's thread maps
  // the segment (it wakes that init's wait through it).
  std::atomic<void*> base_{nullptr};
  size_t size_ = 0;
  int nranks_ = 0;
  std::string name_;
};

// Futex on a word that other processes also use (no FUTEX_PRIVATE_FLAG).
void futexWaitShared(std::atomic<uint32_t>* word, uint32_t expected, int timeoutMs);
void futexWakeShared(std::atomic<uint32_t>* word);

// Maps the memfd heap described by ref (cached per (pid, fd)); returns the address of ref's
// offset, or nullptr with *error set when the owner's heap cannot be mapped.
const void* mapHeapRef(const HeapRef& ref, std::string* error);
void forgetHeapMappingsAfterFork();

// Removes /dev/shm/ncclsim-<pid>-* objects whose creating process is gone.
void removeStaleSegments();

}  // namespace ncclsim
