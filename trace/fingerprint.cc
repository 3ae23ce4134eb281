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

uint64_t fingerprint(const CallShape& shape) {
  // The small fields share one word, so the whole shape costs two mixes on the hot path.
  uint64_t packed = static_cast<uint64_t>(shape.op) | static_cast<uint64_t>(shape.dtype) << 8;
  if (hasReduction(shape.op)) packed |= static_cast<uint64_t>(shape.redop) << 16;
  if (hasRoot(shape.op) || isPointToPoint(shape.op)) {
    packed |= static_cast<uint64_t>(static_cast<uint32_t>(shape.rootOrPeer)) << 32;
  }
  return mix(mix(packed) ^ shape.count);
}

uint64_t rollingHash(uint64_t previous, uint64_t fingerprintValue) {
  return combine(previous, fingerprintValue);
}

}  // namespace ncclwatch::trace
