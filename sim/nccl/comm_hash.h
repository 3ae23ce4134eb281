// NCCL's rank-independent communicator identity (commHash), implemented from the description in
// shared/reference/nccl-profiler.md §6.4. trace/ implements the same algorithm on its own on
// purpose: the two are independent oracles for each other in tests, so keep them separate.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ncclsim {

class CommHasher {
 public:
  void absorb(const void* data, size_t length) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    a_ ^= length;
    for (size_t offset = 0; offset < length; offset += 8) {
      a_ += b_;
      b_ ^= a_;
      a_ ^= a_ >> 31;
      a_ *= 0x9de62bbc8cef3ce3ull;
      b_ ^= b_ >> 32;
      b_ *= 0x485cd6311b599e79ull;
      uint64_t chunk = 0;  // little-endian load, zero-padded
      const size_t chunkLength = length - offset < 8 ? length - offset : 8;
      for (size_t i = 0; i < chunkLength; ++i) chunk |= uint64_t{bytes[offset + i]} << (8 * i);
      a_ += chunk;
    }
  }
  uint64_t digest() const {
    uint64_t h = a_;
    h ^= h >> 31;
    h *= 0xbac3bd562846de6bull;
    h += b_;
    h ^= h >> 32;
    h *= 0x995a187a14e7b445ull;
    return h;
  }

 private:
  uint64_t a_ = 1;
  uint64_t b_ = 1;
};

// Root communicators: the 128 bytes of the unique id (commIds[0] for InitRankScalable).
inline uint64_t rootCommHash(const void* uniqueIdBytes, size_t length) {
  CommHasher hasher;
  hasher.absorb(uniqueIdBytes, length);
  return hasher.digest();
}

// Split children (splitCount is the parent's pre-incremented counter) and shrink children
// (splitCount 0, colour 0).
inline uint64_t childCommHash(uint64_t parentHash, int splitCount, int color) {
  CommHasher hasher;
  hasher.absorb(&parentHash, sizeof parentHash);
  hasher.absorb(&splitCount, sizeof splitCount);
  hasher.absorb(&color, sizeof color);
  return hasher.digest();
}

}  // namespace ncclsim
