#include "trace/python_lines.h"

#include <cstdint>

namespace ncclwatch::trace {
namespace {

// A cursor over the table that answers "no more" instead of reading past the end.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  bool done() const { return at_ >= bytes_.size(); }
  bool byte(uint8_t* out) {
    if (done()) return false;
    *out = bytes_[at_++];
    return true;
  }
  // CPython's varint: 6 bits a byte, least significant first, 0x40 = more follow.
  bool varint(uint32_t* out) {
    uint32_t value = 0;
    for (int shift = 0; shift < 32; shift += 6) {
      uint8_t b;
      if (!byte(&b)) return false;
      value |= static_cast<uint32_t>(b & 0x3f) << shift;
      if ((b & 0x40) == 0) {
        *out = value;
        return true;
      }
    }
    return false;  // longer than any 32-bit value: malformed
  }
  // The sign in the lowest bit, the magnitude above it.
  bool signedVarint(int32_t* out) {
    uint32_t raw;
    if (!varint(&raw)) return false;
    int32_t magnitude = static_cast<int32_t>(raw >> 1);
    *out = (raw & 1) ? -magnitude : magnitude;
    return true;
  }
  bool skip(int bytes) {
    for (int i = 0; i < bytes; ++i) {
      uint8_t unused;
      if (!byte(&unused)) return false;
    }
    return true;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t at_ = 0;
};

// Entry kinds of the 3.11+ table (the high nibble of an entry's first byte, bit 7 set).
constexpr int kOneLine0 = 10;
constexpr int kNoColumns = 13;
constexpr int kLong = 14;
constexpr int kNone = 15;

// Lines are summed in 64 bits: a hostile table's deltas must not overflow.
int asLine(int64_t line, bool known) {
  return known && line >= 0 && line <= INT32_MAX ? static_cast<int>(line) : -1;
}

}  // namespace

int lineFromLocationTable(std::span<const uint8_t> table, int firstLine, uint32_t codeUnit) {
  Reader reader(table);
  int64_t line = firstLine;
  uint64_t start = 0;
  while (!reader.done()) {
    uint8_t head;
    reader.byte(&head);
    if ((head & 0x80) == 0) return -1;  // every entry starts with bit 7 set
    int code = (head >> 3) & 0x0f;
    uint64_t end = start + (head & 0x07) + 1;
    int32_t delta = 0;
    bool known = true;
    if (code == kNone) {
      known = false;
    } else if (code == kLong) {
      uint32_t unused;
      if (!reader.signedVarint(&delta) || !reader.varint(&unused) || !reader.varint(&unused) ||
          !reader.varint(&unused)) {
        return -1;
      }
    } else if (code == kNoColumns) {
      if (!reader.signedVarint(&delta)) return -1;
    } else if (code >= kOneLine0) {
      delta = code - kOneLine0;
      if (!reader.skip(2)) return -1;
    } else if (!reader.skip(1)) {  // the short forms: same line, one byte of columns
      return -1;
    }
    line += delta;
    // A line below 0 comes only from a malformed table.
    if (codeUnit >= start && codeUnit < end) return asLine(line, known);
    start = end;
  }
  return -1;
}

int lineFromLineTable310(std::span<const uint8_t> table, int firstLine, uint32_t byteOffset) {
  int64_t line = firstLine;
  uint64_t start = 0;
  for (size_t at = 0; at + 1 < table.size(); at += 2) {
    uint64_t end = start + table[at];
    int8_t delta = static_cast<int8_t>(table[at + 1]);
    bool known = delta != -128;
    if (known) line += delta;
    if (byteOffset >= start && byteOffset < end) return asLine(line, known);
    start = end;
  }
  return -1;
}

}  // namespace ncclwatch::trace
