#include "fingerprint.h"

namespace ncclwatch::trace {
namespace {

// A strong 64-bit finalizer (the murmur3/splitmix family) so that nearby inputs spread.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

uint64_t combine(uint64_t seed, uint64_t value) {
  return mix(seed ^ (value + 0x9e3779b97f4a7c15ull));
}

}  // namespace

bool hasReduction(OpKind op) {
  return op == OpKind::kAllReduce || op == OpKind::kReduce || op == OpKind::kReduceScatter;
}

bool hasRoot(OpKind op) {
  return op == OpKind::kBroadcast || op == OpKind::kReduce || op == OpKind::kGather ||
         op == OpKind::kScatter;
}

uint64_t fingerprint(const CallShape& shape) {
  uint64_t h = combine(0, static_cast<uint64_t>(shape.op));
  h = combine(h, shape.count);
  h = combine(h, shape.dtype);
  if (hasReduction(shape.op)) h = combine(h, shape.redop);
  if (hasRoot(shape.op) || isPointToPoint(shape.op)) {
    h = combine(h, static_cast<uint64_t>(static_cast<uint32_t>(shape.rootOrPeer)));
  }
  return h;
}

uint64_t rollingHash(uint64_t previous, uint64_t fingerprintValue) {
  return combine(previous, fingerprintValue);
}

}  // namespace ncclwatch::trace
