#include "identity.h"

namespace ncclwatch::trace {

void CommHashState::absorb(const void* data, size_t length) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  a_ ^= length;
  for (size_t offset = 0; offset < length; offset += 8) {
    a_ += b_;
    b_ ^= a_;
    a_ ^= a_ >> 31;
    a_ *= 0x9de62bbc8cef3ce3ull;
    b_ ^= b_ >> 32;
    b_ *= 0x485cd6311b599e79ull;
    uint64_t chunk = 0;  // little-endian, zero-padded when fewer than 8 bytes remain
    for (size_t i = 0; i < 8 && offset + i < length; ++i) {
      chunk |= static_cast<uint64_t>(bytes[offset + i]) << (8 * i);
    }
    a_ += chunk;
  }
}

uint64_t CommHashState::digest() const {
  uint64_t h = a_;
  h ^= h >> 31;
  h *= 0xbac3bd562846de6bull;
  h += b_;
  h ^= h >> 32;
  h *= 0x995a187a14e7b445ull;
  return h;
}

uint64_t rootCommHash(const void* uniqueId, size_t length) {
  CommHashState state;
  state.absorb(uniqueId, length);
  return state.digest();
}

uint64_t splitCommHash(uint64_t parentHash, int splitCount, int color) {
  CommHashState state;
  state.absorb(&parentHash, sizeof parentHash);
  state.absorb(&splitCount, sizeof splitCount);
  state.absorb(&color, sizeof color);
  return state.digest();
}

uint64_t shrinkCommHash(uint64_t parentHash) {
  return splitCommHash(parentHash, 0, 0);
}

uint64_t combineHash(uint64_t base, uint64_t value) {
  CommHashState state;
  state.absorb(&base, sizeof base);
  state.absorb(&value, sizeof value);
  return state.digest();
}

uint64_t uniqueIdMagic(const void* uniqueId) {
  const auto* bytes = static_cast<const unsigned char*>(uniqueId);
  uint64_t magic = 0;  // NCCL reads it as a native (little-endian) uint64_t
  for (int i = 0; i < 8; ++i) magic |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  return magic;
}

uint64_t growMagic(uint64_t parentMagic, int childCount) {
  // NCCL passes the int counter where hashCombine takes a uint64_t: it is widened first.
  return combineHash(parentMagic, static_cast<uint64_t>(static_cast<int64_t>(childCount)));
}

uint64_t growCommHash(uint64_t magic, int nranks) {
  return combineHash(magic, static_cast<uint64_t>(static_cast<int64_t>(nranks)));
}

}  // namespace ncclwatch::trace
