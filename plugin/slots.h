// The plugin's fixed pools. Every handle NCCL holds is a pointer into one of them (or a static
// sentinel), so a handle is recognised by an address-range check and never needs a map. Slots
// are claimed lock-free on NCCL's threads; a pool that is full answers with a null handle,
// which NCCL accepts as "dropped" (children of it arrive with a null parent), and the drop is
// counted. Pools are allocated at the first communicator init, never on an event.
#pragma once
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "plugin/event_model.h"
#include "trace/record.h"

namespace ncclwatch::interpose {
struct CommEntry;
}

namespace ncclwatch::plugin {

// One communicator as NCCL's init announced it.
struct Context {
  std::atomic<uint32_t> live{0};        // 0 free, 1 being filled, 2 published
  std::atomic<uint32_t> generation{0};  // bumped at finalize: slots of the old comm see it
  bool identified = false;              // v3: not until an event carries the commHash
  uint64_t commHash = 0;
  int nranks = 0;
  int rank = -1;
  int abiVersion = 0;
  // The recorder's entry: the interposer's own (combined mode) or one this plugin added.
  std::atomic<interpose::CommEntry*> entry{nullptr};
  bool ownEntry = false;
  // The interposer records this communicator's calls (combined mode: its init went through our
  // wrappers): an operation event the plugin cannot join to a wrapper's record is still that
  // record's call, and must not get a second record of its own.
  bool interposerRecords = false;
  char name[64] = {};
};

// A collective or point-to-point call: its API event (CollApi/P2pApi, the user's view) or its
// operation event (Coll/P2p, the launched task that KernelCh events belong to).
struct alignas(64) CallSlot {
  std::atomic<uint32_t> live{0};
  std::atomic<uint32_t> generation{0};
  // Atomic: the watchdog's sweep reads it of every published slot while the calling thread may
  // give an API slot back and claim it again for the next call (back-to-back calls reuse it).
  std::atomic<EventKind> kind{EventKind::kOther};
  Context* context = nullptr;
  uint32_t contextGeneration = 0;
  // What the user called (from the API event when there is one).
  trace::OpKind op = trace::OpKind::kUnknown;
  uint64_t count = 0;
  int dtype = 0;
  int root = -1;
  int peer = -1;
  uint64_t stream = 0;
  int64_t apiNs = 0;
  int threadId = 0;
  int groupDepth = 0;
  bool captured = false;
  uint64_t callSite = 0;  // the calling thread's Python site, when it runs Python
  // The record this call is (the interposer's in combined mode, else one built here).
  bool hasRecord = false;
  bool joined = false;           // the interposer's record
  bool completesRecord = false;  // KernelCh completes the record (no CUDA events track it)
  uint64_t ringIndex = 0;
  uint64_t commHash = 0;
  uint64_t seq = 0;
  // NCCL's own view of the operation.
  uint64_t ncclSeqNumber = 0;
  int nChannels = 0;
  std::atomic<bool> apiStopped{false};       // API slots: the API call returned
  std::atomic<bool> enqueued{false};         // operation slots: NCCL's stopEvent (enqueued)
  std::atomic<uint64_t> startedChannels{0};  // KernelCh starts (bit per channel < 64)
  std::atomic<uint32_t> stoppedChannels{0};
  std::atomic<int64_t> kernelStartNs{0};
  std::atomic<int64_t> kernelStopNs{0};
  // Written by the watchdog thread; reset by the thread that claims the slot for an API event.
  std::atomic<int64_t> stoppedApiSeenNs{0};
};

// A KernelCh, ProxyOp or ProxyStep event: a child of an operation (or of a ProxyOp).
struct alignas(64) ChildSlot {
  std::atomic<uint32_t> live{0};
  std::atomic<uint32_t> generation{0};
  EventKind kind = EventKind::kOther;
  CallSlot* call = nullptr;  // the operation (null for another process's PXN proxy op)
  uint32_t callGeneration = 0;
  ChildSlot* op = nullptr;  // ProxyStep: its ProxyOp
  uint32_t opGeneration = 0;
  int channel = -1;
  int peer = -1;
  bool isSend = false;
  int step = -1;
  bool stopCounted = false;         // KernelCh: its stop was counted on the call
  std::atomic<uint8_t> state{0};    // ProxyStep: NCCL's state number
  std::atomic<int64_t> sinceNs{0};  // when it entered that state
};

inline constexpr uint32_t kPublished = 2;

template <typename Slot>
bool isPublished(const Slot& slot) {
  return slot.live.load(std::memory_order_acquire) == kPublished;
}

template <typename Slot, size_t Capacity>
class SlotPool {
 public:
  static constexpr size_t kCapacity = Capacity;

  // Allocates the slots once (at the first communicator init).
  void allocate() {
    if (slots_.load(std::memory_order_acquire) != nullptr) return;
    slots_.store(new Slot[Capacity], std::memory_order_release);
  }
  // A free slot claimed for its owner to fill (live 1), or null when the pool is full
  // (counted). Other threads act on it only once published (live 2). The slots near the cursor
  // come first (the usual case: back-to-back calls give slots back in order); past them the
  // whole pool is searched while the free count says a slot is left, so thousands of operations
  // in flight do not drop a call while slots elsewhere are free.
  Slot* claim() {
    Slot* slots = slots_.load(std::memory_order_acquire);
    if (slots == nullptr) return nullptr;
    size_t start = cursor_.fetch_add(1, std::memory_order_relaxed);
    for (size_t probe = 0; probe < Capacity; ++probe) {
      if (probe % kProbes == 0 && probe > 0 && free_.load(std::memory_order_relaxed) <= 0) break;
      Slot& slot = slots[(start + probe) % Capacity];
      uint32_t expected = 0;
      if (slot.live.load(std::memory_order_relaxed) == 0 &&
          slot.live.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
        free_.fetch_sub(1, std::memory_order_relaxed);
        return &slot;
      }
    }
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  // The owner filled the slot: from now on other threads may read it.
  static void publish(Slot* slot) { slot->live.store(kPublished, std::memory_order_release); }
  // Gives a slot back; its generation changes first, so holders of a stale pointer can tell.
  void release(Slot* slot) {
    slot->generation.fetch_add(1, std::memory_order_release);
    slot->live.store(0, std::memory_order_release);
    free_.fetch_add(1, std::memory_order_relaxed);
  }
  // The slot `handle` points at, or null when it is not one of ours.
  Slot* find(const void* handle) const {
    Slot* slots = slots_.load(std::memory_order_acquire);
    auto address = reinterpret_cast<uintptr_t>(handle);
    auto first = reinterpret_cast<uintptr_t>(slots);
    if (slots == nullptr || address < first || address >= first + Capacity * sizeof(Slot) ||
        (address - first) % sizeof(Slot) != 0) {
      return nullptr;
    }
    return reinterpret_cast<Slot*>(handle == nullptr ? nullptr : const_cast<void*>(handle));
  }
  Slot* begin() const { return slots_.load(std::memory_order_acquire); }
  size_t indexOf(const Slot* slot) const { return static_cast<size_t>(slot - begin()); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  // Slots tried before the free count is consulted (and between consultations).
  static constexpr size_t kProbes = 64;
  std::atomic<Slot*> slots_{nullptr};  // never freed: handles may outlive every comm
  // Free slots, approximately while claims and releases race (a hint when to stop searching;
  // the slots' own `live` decides).
  std::atomic<ptrdiff_t> free_{static_cast<ptrdiff_t>(Capacity)};
  std::atomic<size_t> cursor_{0};
  std::atomic<uint64_t> dropped_{0};
};

inline constexpr size_t kMaxContexts = 4096;
inline constexpr size_t kCallSlots = 8192;
inline constexpr size_t kChildSlots = 16384;

struct Pools {
  SlotPool<Context, kMaxContexts> contexts;
  SlotPool<CallSlot, kCallSlots> calls;
  SlotPool<ChildSlot, kChildSlots> children;
};
// The process's pools (static storage: the pointers inside are allocated at the first init).
Pools& pools();

}  // namespace ncclwatch::plugin
