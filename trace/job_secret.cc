#include "trace/job_secret.h"

#include "trace/fingerprint.h"

namespace ncclwatch::trace {
namespace {

// Keys of the two secret hashes. The domain constant keeps the secret apart from every other
// hash of the same id (NCCL's commHash above all); the two seeds make the halves independent.
constexpr uint64_t kSecretDomain = 0x6e77736563726574ull;  // "nwsecret"
constexpr uint64_t kSecretSeeds[2] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull};

// The id's bytes as little-endian words, each mixed with the seed before it enters the chain,
// so that the two chains never see the same inputs.
uint64_t keyedHash(const unsigned char* bytes, size_t length, uint64_t seed) {
  uint64_t state = mix64(seed ^ kSecretDomain);
  for (size_t offset = 0; offset < length; offset += 8) {
    uint64_t word = 0;
    for (size_t i = 0; i < 8 && offset + i < length; ++i) {
      word |= static_cast<uint64_t>(bytes[offset + i]) << (8 * i);
    }
    state = mix64(state ^ mix64(word + seed));
  }
  return mix64(state ^ static_cast<uint64_t>(length));
}

void writeHex(uint64_t value, char* text) {
  constexpr char kDigits[] = "0123456789abcdef";
  for (int i = 15; i >= 0; --i, value >>= 4) text[i] = kDigits[value & 0xf];
}

}  // namespace

void deriveSecret(const void* bytes, size_t size, DerivedSecretText& text) {
  const auto* data = static_cast<const unsigned char*>(bytes);
  writeHex(keyedHash(data, size, kSecretSeeds[0]), text);
  writeHex(keyedHash(data, size, kSecretSeeds[1]), text + 16);
  text[kDerivedSecretDigits] = '\0';
}

}  // namespace ncclwatch::trace
