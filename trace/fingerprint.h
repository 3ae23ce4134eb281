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

// Whether the op's fingerprint includes a reduction operator / a root.
inline constexpr bool hasReduction(OpKind op) {
  return op == OpKind::kAllReduce || op == OpKind::kReduce || op == OpKind::kReduceScatter;
}
inline constexpr bool hasRoot(OpKind op) {
  return op == OpKind::kBroadcast || op == OpKind::kReduce || op == OpKind::kGather ||
         op == OpKind::kScatter;
}

// A strong 64-bit finalizer (the murmur3/splitmix family) so that nearby inputs spread.
inline constexpr uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// 64-bit hash of (op, count, dtype, redop, root) for collectives and (op, peer, count, dtype)
// for send/recv. Fields an op does not use do not enter the hash, so e.g. an AllGather's redop
// argument (unused by NCCL) never causes a false mismatch. Inline: it runs on every call.
inline constexpr uint64_t fingerprint(const CallShape& shape) {
  // The small fields share one word, so the whole shape costs two mixes.
  uint64_t packed = static_cast<uint64_t>(shape.op) | static_cast<uint64_t>(shape.dtype) << 8;
  if (hasReduction(shape.op)) packed |= static_cast<uint64_t>(shape.redop) << 16;
  if (hasRoot(shape.op) || isPointToPoint(shape.op)) {
    packed |= static_cast<uint64_t>(static_cast<uint32_t>(shape.rootOrPeer)) << 32;
  }
  return mix64(mix64(packed) ^ shape.count);
}

// Rolling hash over a communicator's fingerprints in sequence order: h(n) = mix(h(n-1), f(n)),
// starting from kRollingSeed. Two ranks agree on h(n) iff (almost surely) they agree on every
// fingerprint up to n.
inline constexpr uint64_t kRollingSeed = 0x6e63636c77617463ull;  // "ncclwatc"
inline constexpr uint64_t rollingHash(uint64_t previous, uint64_t fingerprintValue) {
  return mix64(previous ^ (fingerprintValue + 0x9e3779b97f4a7c15ull));
}

}  // namespace ncclwatch::trace
