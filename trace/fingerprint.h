// Fingerprints: what two ranks must agree on for the same (comm, seq). A mismatch at the same
// position is a mismatched collective; the rolling hash compares long histories cheaply.
#pragma once
#include <cstdint>

#include "record.h"

namespace ncclwatch::trace {

struct CallShape {
  OpKind op = OpKind::kUnknown;
  uint64_t count = 0;
  uint8_t dtype = 0;
  uint8_t redop = 0;        // ignored where the op has no reduction
  int32_t rootOrPeer = -1;  // root for rooted collectives, peer for p2p
};

// 64-bit hash of (op, count, dtype, redop, root) for collectives and (op, peer, count, dtype)
// for send/recv. Fields an op does not use do not enter the hash, so e.g. an AllGather's redop
// argument (unused by NCCL) never causes a false mismatch.
uint64_t fingerprint(const CallShape& shape);

// Rolling hash over a communicator's fingerprints in sequence order: h(n) = mix(h(n-1), f(n)),
// starting from kRollingSeed. Two ranks agree on h(n) iff (almost surely) they agree on every
// fingerprint up to n.
inline constexpr uint64_t kRollingSeed = 0x6e63636c77617463ull;  // "ncclwatc"
uint64_t rollingHash(uint64_t previous, uint64_t fingerprint);

// Whether the op's fingerprint includes a reduction operator / a root.
inline constexpr bool hasReduction(OpKind op) {
  return op == OpKind::kAllReduce || op == OpKind::kReduce || op == OpKind::kReduceScatter;
}
inline constexpr bool hasRoot(OpKind op) {
  return op == OpKind::kBroadcast || op == OpKind::kReduce || op == OpKind::kGather ||
         op == OpKind::kScatter;
}

}  // namespace ncclwatch::trace
