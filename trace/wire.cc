#include "trace/wire.h"

#include <algorithm>
#include <cstring>

namespace ncclwatch::trace::wire {
namespace {

void append(std::vector<std::byte>& out, const void* data, size_t bytes) {
  const auto* begin = static_cast<const std::byte*>(data);
  out.insert(out.end(), begin, begin + bytes);
}

void header(FrameType type, size_t payload, std::vector<std::byte>& out) {
  FrameHeader h{kMagic, static_cast<uint16_t>(type), kVersion, static_cast<uint32_t>(payload), 0};
  append(out, &h, sizeof h);
}

// Tables travel as a u32 count, u32 zero, then `count` fixed-size entries.
template <typename Entry>
void encodeTable(FrameType type, int64_t nowNs, bool withTime, std::span<const Entry> entries,
                 std::vector<std::byte>& out) {
  uint32_t count = static_cast<uint32_t>(entries.size());
  size_t payload = (withTime ? sizeof nowNs : 0) + 8 + entries.size() * sizeof(Entry);
  header(type, payload, out);
  if (withTime) append(out, &nowNs, sizeof nowNs);
  uint32_t zero = 0;
  append(out, &count, sizeof count);
  append(out, &zero, sizeof zero);
  append(out, entries.data(), entries.size() * sizeof(Entry));
}

template <typename Entry>
bool decodeTable(const std::byte* payload, uint32_t length, size_t offset, uint32_t maxCount,
                 std::vector<Entry>* entries, std::string* error) {
  if (length < offset + 8) {
    *error = "table frame shorter than its count";
    return false;
  }
  uint32_t count, zero;
  std::memcpy(&count, payload + offset, sizeof count);
  std::memcpy(&zero, payload + offset + 4, sizeof zero);
  if (zero != 0 || count > maxCount || length != offset + 8 + count * sizeof(Entry)) {
    *error = "table frame's count " + std::to_string(count) + " does not match its length " +
             std::to_string(length);
    return false;
  }
  entries->resize(count);
  std::memcpy(entries->data(), payload + offset + 8, count * sizeof(Entry));
  return true;
}

}  // namespace

void encodeHello(const Hello& hello, std::vector<std::byte>& out) {
  header(FrameType::kHello, sizeof hello, out);
  append(out, &hello, sizeof hello);
}

void encodeComms(std::span<const CommInfo> comms, std::vector<std::byte>& out) {
  encodeTable(FrameType::kComms, 0, false, comms, out);
}

void encodeRecords(int64_t nowNs, std::span<const CallRecord> records,
                   std::vector<std::byte>& out) {
  encodeTable(FrameType::kRecords, nowNs, true, records, out);
}

void encodeBye(std::vector<std::byte>& out) {
  header(FrameType::kBye, 0, out);
}

void encodeWaits(int64_t nowNs, std::span<const WaitNote> waits, std::vector<std::byte>& out) {
  encodeTable(FrameType::kWaits, nowNs, true,
              waits.first(std::min<size_t>(waits.size(), kWaitNoteCapacity)), out);
}

void encodeSites(const std::string& text, std::vector<std::byte>& out) {
  size_t bytes = std::min<size_t>(text.size(), kMaxPayload);
  header(FrameType::kSites, bytes, out);
  append(out, text.data(), bytes);
}

void encodeDump(const std::string& reason, std::vector<std::byte>& out) {
  std::string text = reason.substr(0, 1024);
  header(FrameType::kDump, text.size(), out);
  append(out, text.data(), text.size());
}

void encodeAbort(uint64_t commHash, std::vector<std::byte>& out) {
  header(FrameType::kAbort, sizeof commHash, out);
  append(out, &commHash, sizeof commHash);
}

DecodeStatus decodeFrame(std::span<const std::byte> bytes, Frame* frame, size_t* consumed,
                         std::string* error) {
  if (bytes.size() < sizeof(FrameHeader)) return DecodeStatus::kNeedMore;
  FrameHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kMagic) {
    *error = "not an ncclwatch frame (bad magic)";
    return DecodeStatus::kInvalid;
  }
  if (h.version != kVersion) {
    *error = "protocol version " + std::to_string(h.version) + " is not supported";
    return DecodeStatus::kInvalid;
  }
  if (h.length > kMaxPayload || h.reserved != 0) {
    *error = "frame length " + std::to_string(h.length) + " over the bound";
    return DecodeStatus::kInvalid;
  }
  if (bytes.size() - sizeof h < h.length) return DecodeStatus::kNeedMore;
  const std::byte* payload = bytes.data() + sizeof h;
  *frame = Frame{};
  frame->type = static_cast<FrameType>(h.type);
  bool ok = true;
  switch (frame->type) {
    case FrameType::kHello:
      ok = h.length == sizeof(Hello);
      if (ok) std::memcpy(&frame->hello, payload, sizeof(Hello));
      if (!ok) *error = "HELLO frame of the wrong size";
      break;
    case FrameType::kComms:
      ok = decodeTable(payload, h.length, 0, kCommTableCapacity, &frame->comms, error);
      break;
    case FrameType::kRecords:
      ok = h.length >= sizeof(int64_t);
      if (!ok) *error = "RECORDS frame without its time";
      if (ok) {
        std::memcpy(&frame->nowNs, payload, sizeof frame->nowNs);
        ok = decodeTable(payload, h.length, sizeof(int64_t), kMaxRecordsPerFrame, &frame->records,
                         error);
      }
      break;
    case FrameType::kWaits:
      ok = h.length >= sizeof(int64_t);
      if (!ok) *error = "WAITS frame without its time";
      if (ok) {
        std::memcpy(&frame->nowNs, payload, sizeof frame->nowNs);
        ok = decodeTable(payload, h.length, sizeof(int64_t), kWaitNoteCapacity, &frame->waits,
                         error);
      }
      break;
    case FrameType::kSites:
      frame->reason.assign(reinterpret_cast<const char*>(payload), h.length);
      break;
    case FrameType::kBye:
      ok = h.length == 0;
      if (!ok) *error = "BYE frame with a payload";
      break;
    case FrameType::kDump:
      ok = h.length <= 1024;
      if (ok) frame->reason.assign(reinterpret_cast<const char*>(payload), h.length);
      if (!ok) *error = "DUMP reason over 1024 bytes";
      break;
    case FrameType::kAbort:
      ok = h.length == sizeof(uint64_t);
      if (ok) std::memcpy(&frame->commHash, payload, sizeof frame->commHash);
      if (!ok) *error = "ABORT frame of the wrong size";
      break;
    default:
      ok = false;
      *error = "unknown frame type " + std::to_string(h.type);
  }
  if (!ok) return DecodeStatus::kInvalid;
  *consumed = sizeof h + h.length;
  return DecodeStatus::kFrame;
}

bool secretMatches(const char (&received)[kSecretBytes], const std::string& expected) {
  if (expected.empty() || expected.size() >= kSecretBytes) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < kSecretBytes; ++i) {
    char want = i < expected.size() ? expected[i] : '\0';
    difference |= static_cast<unsigned char>(received[i] ^ want);
  }
  return difference == 0;
}

}  // namespace ncclwatch::trace::wire
