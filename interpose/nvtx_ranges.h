// NVTX ranges for recorded NCCL calls: one range per call in the domain "ncclwatch", carrying
// comm, seq, op and bytes, so that Nsight Systems (or any NVTX tool) shows ncclwatch's view of
// each call on the CPU timeline. Nothing is formatted unless a tool is attached.
#pragma once
#include <atomic>
#include <cstdint>

#include "trace/record.h"

namespace ncclwatch::interpose {

// True when ranges are emitted: NCCLWATCH_NVTX is not 0/off AND an NVTX tool is attached
// (NVTX_INJECTION64_PATH is set in the environment: NVTX loads a tool only then for a
// preloaded library). Decided once, lazily, thread-safe; cheap after: one load, inline, on the
// hot path.
namespace detail {
enum : uint8_t { kNvtxUndecided = 0, kNvtxOn = 1, kNvtxOff = 2 };
// kNvtxOn is published (release) only after the domain is set, so a reader that sees it
// (acquire) sees the domain. Once decided, the state never changes: pushes and pops stay paired.
inline std::atomic<uint8_t> g_nvtxState{kNvtxUndecided};
bool decideNvtxRanges();
}  // namespace detail
inline bool nvtxRangesEnabled() {
  uint8_t state = detail::g_nvtxState.load(std::memory_order_acquire);
  if (state != detail::kNvtxUndecided) return state == detail::kNvtxOn;
  return detail::decideNvtxRanges();
}

// Pushes a range in domain "ncclwatch" for a recorded call, with a message like
// "AllReduce comm=9f3a0c1d22e4b7a0 seq=42 bytes=16384" (bytes = count * size of the
// ncclDataType_t, only for collectives and point-to-point calls), the seq as a uint64 payload
// and a category per kind of operation. Formats into a stack buffer; never allocates or throws.
// Does nothing unless nvtxRangesEnabled().
void nvtxPushCall(trace::OpKind op, uint64_t commHash, uint64_t seq, uint64_t count, int dtype);
// Pops the range of nvtxPushCall. Does nothing unless nvtxRangesEnabled().
void nvtxPopCall();

}  // namespace ncclwatch::interpose
