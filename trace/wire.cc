#include "trace/wire.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "trace/fingerprint.h"

namespace ncclwatch::trace::wire {
namespace {

// RECORDS messages (docs/protocol.md, "RECORDS"): the low two bits of a message's first byte.
enum MessageKind : uint8_t {
  kRecordMessage = 0,  // a record, delta-encoded against its communicator's previous one
  kUpdateKeep = 1,     // a kept record's new state; the collector keeps it for more updates
  kCommMessage = 2,    // a communicator slot's hash
  kUpdateLast = 3,     // a kept record's new state, its last
};

// Presence bits of a RECORD message, in the order of their fields after the issue time.
enum RecordBits : uint32_t {
  kHasStart = 1u << 0,
  kHasComplete = 1u << 1,
  kKeep = 1u << 2,  // no field: the collector keeps the record for UPDATE messages
  kHasCount = 1u << 3,
  kHasCallSite = 1u << 4,
  kHasState = 1u << 5,
  kHasSeq = 1u << 6,
  kHasOrdinal = 1u << 7,
  kHasRingIndex = 1u << 8,
  kHasStream = 1u << 9,
  kHasShape = 1u << 10,  // op, dtype, redop
  kHasRootOrPeer = 1u << 11,
  kHasP2pSeq = 1u << 12,
  kHasFlags = 1u << 13,
  kHasFingerprint = 1u << 14,
  kHasRolling = 1u << 15,
  kHasResult = 1u << 16,
  kHasThread = 1u << 17,
  kHasGroupDepth = 1u << 18,
  kHasSlotVersion = 1u << 19,
  kHasGroupSerial = 1u << 20,
  kRecordBitsKnown = (1u << 21) - 1,
};

// Presence bits of an UPDATE message (its first byte's upper six bits).
enum UpdateBits : uint8_t {
  kUpdState = 1u << 0,
  kUpdStart = 1u << 1,
  kUpdComplete = 1u << 2,
  kUpdFlags = 1u << 3,
  kUpdResult = 1u << 4,
  kUpdSlotVersion = 1u << 5,
};

uint64_t zigzag(uint64_t difference) {
  auto value = static_cast<int64_t>(difference);
  return (static_cast<uint64_t>(value) << 1) ^ static_cast<uint64_t>(value >> 63);
}
uint64_t unzigzag(uint64_t encoded) {
  return (encoded >> 1) ^ (~(encoded & 1) + 1);
}
uint32_t zigzag32(uint32_t difference) {
  auto value = static_cast<int32_t>(difference);
  return (static_cast<uint32_t>(value) << 1) ^ static_cast<uint32_t>(value >> 31);
}
uint32_t unzigzag32(uint32_t encoded) {
  return (encoded >> 1) ^ (~(encoded & 1) + 1);
}

// Writes into a buffer the caller sized (kMaxRecordBytes for one record's messages).
struct Writer {
  std::byte* at;
  void byte(uint8_t value) { *at++ = static_cast<std::byte>(value); }
  void varint(uint64_t value) {
    while (value >= 0x80) {
      byte(static_cast<uint8_t>(value) | 0x80);
      value >>= 7;
    }
    byte(static_cast<uint8_t>(value));
  }
  void fixed64(uint64_t value) {
    std::memcpy(at, &value, sizeof value);
    at += sizeof value;
  }
};

// Reads within [at, end): every read checks the bound, the first failure sticks.
struct Reader {
  const std::byte* at;
  const std::byte* end;
  bool ok = true;
  uint8_t byte() {
    if (at >= end) {
      ok = false;
      return 0;
    }
    return static_cast<uint8_t>(*at++);
  }
  uint64_t varint() {
    // Most of a record's varints are one byte (small deltas); with ten bytes left no single
    // byte needs its bound checked. The collector decodes millions of these a second: the
    // checked loop was a sixth of its ingest's instructions.
    if (end - at >= 10) {
      auto first = static_cast<uint8_t>(at[0]);
      if (first < 0x80) {
        at += 1;
        return first;
      }
      auto second = static_cast<uint8_t>(at[1]);
      if (second < 0x80) {
        at += 2;
        return (first & 0x7fu) | (static_cast<uint64_t>(second) << 7);
      }
      uint64_t value = 0;
      for (int shift = 0; shift < 64; shift += 7) {
        auto next = static_cast<uint8_t>(*at++);
        if (shift == 63 && next > 1) break;  // more than 64 bits
        value |= static_cast<uint64_t>(next & 0x7f) << shift;
        if ((next & 0x80) == 0) return value;
      }
      ok = false;
      return 0;
    }
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t next = byte();
      if (!ok) return 0;
      if (shift == 63 && next > 1) break;  // more than 64 bits
      value |= static_cast<uint64_t>(next & 0x7f) << shift;
      if ((next & 0x80) == 0) return value;
    }
    ok = false;
    return 0;
  }
  uint32_t varint32() {
    uint64_t value = varint();
    if (value > UINT32_MAX) ok = false;
    return static_cast<uint32_t>(value);
  }
  uint64_t fixed64() {
    if (end - at < 8) {
      ok = false;
      return 0;
    }
    uint64_t value;
    std::memcpy(&value, at, sizeof value);
    at += sizeof value;
    return value;
  }
};

bool sequenced(OpKind op) {
  return isCollective(op) || isPointToPoint(op);
}

// What a record's fields are when its RECORD message leaves them out.
struct Expected {
  uint64_t ordinal;
  uint64_t p2pSeq;
};
template <typename Comm>
Expected expectedFor(const Comm& comm, OpKind op) {
  if (isCollective(op)) return {comm.nextCollective, 0};
  if (isPointToPoint(op)) return {comm.nextPointToPoint, comm.lastP2pSeq};
  return {0, 0};
}
uint64_t expectedFingerprint(const CallRecord& record) {
  if (!sequenced(record.op)) return 0;
  return fingerprint({record.op, record.count, record.dtype, record.redop, record.rootOrPeer});
}

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

void RecordStream::reset() {
  comms_.clear();
  std::fill(pendingValid_.begin(), pendingValid_.end(), 0);
  lastRing_ = ~0ull;
}

void RecordStream::defineComm(size_t slot, uint64_t commHash) {
  Comm fresh;
  fresh.image = CallRecord{};
  fresh.image.commHash = commHash;
  fresh.image.rootOrPeer = -1;
  fresh.rolling = kRollingSeed;
  if (slot == comms_.size()) {
    comms_.push_back(fresh);
  } else {
    comms_[slot] = fresh;
  }
}

void RecordStream::recordSent(Comm& comm, const CallRecord& record, bool keep) {
  comm.image = record;
  if (record.seq != 0) comm.lastSeq = record.seq;
  if (isCollective(record.op)) comm.nextCollective = record.ncclSeqNumber + 1;
  if (isPointToPoint(record.op)) {
    comm.nextPointToPoint = record.ncclSeqNumber + 1;
    comm.lastP2pSeq = record.p2pSeq;
  }
  if (sequenced(record.op)) comm.rolling = record.rollingHash;
  lastRing_ = record.ringIndex;
  if (keep) {
    keepPending(record);
  } else {
    releasePending(record.ringIndex);
  }
}

CallRecord* RecordStream::pendingFor(uint64_t ringIndex) {
  if (pending_.empty()) return nullptr;
  size_t slot = ringIndex % kPendingSlots;
  if (!pendingValid_[slot] || pending_[slot].ringIndex != ringIndex) return nullptr;
  return &pending_[slot];
}

void RecordStream::keepPending(const CallRecord& record) {
  if (pending_.empty()) {
    pending_.resize(kPendingSlots);
    pendingValid_.assign(kPendingSlots, 0);
  }
  size_t slot = record.ringIndex % kPendingSlots;
  pending_[slot] = record;
  pendingValid_[slot] = 1;
}

void RecordStream::releasePending(uint64_t ringIndex) {
  if (pendingFor(ringIndex) != nullptr) pendingValid_[ringIndex % kPendingSlots] = 0;
}

bool isFinal(const CallRecord& record) {
  bool untracked = record.flags & (kRecordNoEvents | kRecordCaptured);
  return record.state == RecordState::kCompleted || record.state == RecordState::kFailed ||
         record.state == RecordState::kAborted ||
         (untracked && (isCollective(record.op) || isPointToPoint(record.op)));
}

RecordEncoder::RecordEncoder() {
  comms_.reserve(kMaxCommSlots);
  pending_.resize(kPendingSlots);
  pendingValid_.assign(kPendingSlots, 0);
}

void RecordEncoder::reset() {
  RecordStream::reset();
  nextVictim_ = 0;
}

size_t RecordEncoder::commSlot(uint64_t commHash, std::byte* out, size_t* written) {
  for (size_t slot = 0; slot < comms_.size(); ++slot) {
    if (comms_[slot].image.commHash == commHash) return slot;
  }
  size_t slot = comms_.size();
  if (slot == kMaxCommSlots) {
    slot = nextVictim_;
    nextVictim_ = (nextVictim_ + 1) % kMaxCommSlots;
  }
  defineComm(slot, commHash);
  Writer writer{out};
  writer.byte(static_cast<uint8_t>(kCommMessage | slot << 2));
  writer.fixed64(commHash);
  *written = static_cast<size_t>(writer.at - out);
  return slot;
}

size_t RecordEncoder::encode(const CallRecord& record, bool keep, std::byte* out) {
  Writer writer{out};
  // A kept record whose identity and shape did not change: only what moves over its life.
  if (CallRecord* kept = pendingFor(record.ringIndex)) {
    CallRecord same = record;
    same.state = kept->state;
    same.startNs = kept->startNs;
    same.completeNs = kept->completeNs;
    same.flags = kept->flags;
    same.result = kept->result;
    same.slotVersion = kept->slotVersion;
    bool startGone = record.startNs == 0 && kept->startNs != 0;
    bool completeGone = record.completeNs == 0 && kept->completeNs != 0;
    if (std::memcmp(&same, kept, sizeof same) == 0 && !startGone && !completeGone) {
      uint8_t bits = 0;
      if (record.state != kept->state) bits |= kUpdState;
      if (record.startNs != kept->startNs) bits |= kUpdStart;
      if (record.completeNs != kept->completeNs) bits |= kUpdComplete;
      if (record.flags != kept->flags) bits |= kUpdFlags;
      if (record.result != kept->result) bits |= kUpdResult;
      if (record.slotVersion != kept->slotVersion) bits |= kUpdSlotVersion;
      writer.byte(static_cast<uint8_t>((keep ? kUpdateKeep : kUpdateLast) | bits << 2));
      writer.varint(zigzag(lastRing_ - record.ringIndex));
      uint64_t issue = static_cast<uint64_t>(record.issueNs);
      uint64_t start = static_cast<uint64_t>(record.startNs);
      if (bits & kUpdState) writer.byte(static_cast<uint8_t>(record.state));
      if (bits & kUpdStart) writer.varint(zigzag(start - issue));
      if (bits & kUpdComplete) {
        writer.varint(zigzag(static_cast<uint64_t>(record.completeNs) - (start ? start : issue)));
      }
      if (bits & kUpdFlags) writer.byte(record.flags);
      if (bits & kUpdResult) writer.varint(zigzag32(static_cast<uint32_t>(record.result)));
      if (bits & kUpdSlotVersion) writer.varint(zigzag32(record.slotVersion - kept->slotVersion));
      if (keep) {
        *kept = record;
      } else {
        releasePending(record.ringIndex);
      }
      return static_cast<size_t>(writer.at - out);
    }
  }
  size_t defined = 0;
  size_t slot = commSlot(record.commHash, out, &defined);
  writer.at += defined;
  Comm& comm = comms_[slot];
  const CallRecord& image = comm.image;
  Expected expected = expectedFor(comm, record.op);
  uint64_t fingerprintValue = expectedFingerprint(record);
  uint64_t rolling = sequenced(record.op) ? rollingHash(comm.rolling, record.fingerprint) : 0;
  uint32_t bits = 0;
  if (record.startNs != 0) bits |= kHasStart;
  if (record.completeNs != 0) bits |= kHasComplete;
  if (keep) bits |= kKeep;
  if (record.count != image.count) bits |= kHasCount;
  if (record.callSite != image.callSite) bits |= kHasCallSite;
  if (record.state != image.state) bits |= kHasState;
  if (record.seq != comm.lastSeq + 1) bits |= kHasSeq;
  if (record.ncclSeqNumber != expected.ordinal) bits |= kHasOrdinal;
  if (record.ringIndex != lastRing_ + 1) bits |= kHasRingIndex;
  if (record.stream != image.stream) bits |= kHasStream;
  if (record.op != image.op || record.dtype != image.dtype || record.redop != image.redop) {
    bits |= kHasShape;
  }
  if (record.rootOrPeer != image.rootOrPeer) bits |= kHasRootOrPeer;
  if (record.p2pSeq != expected.p2pSeq) bits |= kHasP2pSeq;
  if (record.flags != image.flags) bits |= kHasFlags;
  if (record.fingerprint != fingerprintValue) bits |= kHasFingerprint;
  if (record.rollingHash != rolling) bits |= kHasRolling;
  if (record.result != image.result) bits |= kHasResult;
  if (record.threadId != image.threadId) bits |= kHasThread;
  if (record.groupDepth != image.groupDepth) bits |= kHasGroupDepth;
  if (record.slotVersion != image.slotVersion) bits |= kHasSlotVersion;
  if (record.groupSerial != 0) bits |= kHasGroupSerial;
  writer.byte(static_cast<uint8_t>(kRecordMessage | slot << 2));
  writer.varint(bits);
  uint64_t issue = static_cast<uint64_t>(record.issueNs);
  uint64_t start = static_cast<uint64_t>(record.startNs);
  writer.varint(zigzag(issue - static_cast<uint64_t>(image.issueNs)));
  if (bits & kHasStart) writer.varint(zigzag(start - issue));
  if (bits & kHasComplete) {
    writer.varint(zigzag(static_cast<uint64_t>(record.completeNs) - (start ? start : issue)));
  }
  if (bits & kHasCount) writer.varint(record.count);
  if (bits & kHasCallSite) writer.varint(zigzag(record.callSite - image.callSite));
  if (bits & kHasState) writer.byte(static_cast<uint8_t>(record.state));
  if (bits & kHasSeq) writer.varint(zigzag(record.seq - (comm.lastSeq + 1)));
  if (bits & kHasOrdinal) writer.varint(zigzag(record.ncclSeqNumber - expected.ordinal));
  if (bits & kHasRingIndex) writer.varint(zigzag(record.ringIndex - (lastRing_ + 1)));
  if (bits & kHasStream) writer.varint(zigzag(record.stream - image.stream));
  if (bits & kHasShape) {
    writer.byte(static_cast<uint8_t>(record.op));
    writer.byte(record.dtype);
    writer.byte(record.redop);
  }
  if (bits & kHasRootOrPeer) writer.varint(zigzag32(static_cast<uint32_t>(record.rootOrPeer)));
  if (bits & kHasP2pSeq) writer.varint(zigzag(record.p2pSeq - expected.p2pSeq));
  if (bits & kHasFlags) writer.byte(record.flags);
  if (bits & kHasFingerprint) writer.fixed64(record.fingerprint);
  if (bits & kHasRolling) writer.fixed64(record.rollingHash);
  if (bits & kHasResult) writer.varint(zigzag32(static_cast<uint32_t>(record.result)));
  if (bits & kHasThread) {
    writer.varint(
        zigzag32(static_cast<uint32_t>(record.threadId) - static_cast<uint32_t>(image.threadId)));
  }
  if (bits & kHasGroupDepth) writer.varint(record.groupDepth);
  if (bits & kHasSlotVersion) writer.varint(zigzag32(record.slotVersion - image.slotVersion));
  if (bits & kHasGroupSerial) writer.byte(record.groupSerial);
  recordSent(comm, record, keep);
  return static_cast<size_t>(writer.at - out);
}

bool RecordDecoder::decode(std::span<const std::byte> messages, std::vector<CallRecord>* records,
                           std::string* error) {
  Reader reader{messages.data(), messages.data() + messages.size()};
  auto fail = [&](const char* why) {
    *error = std::string("RECORDS message: ") + why;
    return false;
  };
  while (reader.at < reader.end) {
    uint8_t tag = reader.byte();
    uint8_t kind = tag & 3, upper = tag >> 2;
    if (kind == kCommMessage) {
      uint64_t commHash = reader.fixed64();
      if (!reader.ok) return fail("truncated COMM");
      if (upper > comms_.size()) return fail("COMM slot out of order");  // 6 bits: < 64
      defineComm(upper, commHash);
      continue;
    }
    if (records->size() >= kMaxRecordsPerFrame) return fail("too many records in one frame");
    if (kind == kUpdateKeep || kind == kUpdateLast) {
      uint64_t ringIndex = lastRing_ - unzigzag(reader.varint());
      CallRecord* kept = reader.ok ? pendingFor(ringIndex) : nullptr;
      if (kept == nullptr) return fail(reader.ok ? "UPDATE of a record not kept" : "truncated");
      CallRecord record = *kept;
      if (upper & kUpdState) record.state = static_cast<RecordState>(reader.byte());
      uint64_t issue = static_cast<uint64_t>(record.issueNs);
      if (upper & kUpdStart)
        record.startNs = static_cast<int64_t>(issue + unzigzag(reader.varint()));
      uint64_t start = static_cast<uint64_t>(record.startNs);
      if (upper & kUpdComplete) {
        record.completeNs =
            static_cast<int64_t>((start ? start : issue) + unzigzag(reader.varint()));
      }
      if (upper & kUpdFlags) record.flags = reader.byte();
      if (upper & kUpdResult) record.result = static_cast<int32_t>(unzigzag32(reader.varint32()));
      if (upper & kUpdSlotVersion) record.slotVersion += unzigzag32(reader.varint32());
      if (!reader.ok) return fail("truncated UPDATE");
      if (record.state > RecordState::kAborted) return fail("unknown state");
      if (kind == kUpdateKeep) {
        *kept = record;
      } else {
        releasePending(ringIndex);
      }
      records->push_back(record);
      continue;
    }
    // A RECORD message.
    if (upper >= comms_.size()) return fail("record of an undefined communicator slot");
    Comm& comm = comms_[upper];
    const CallRecord& image = comm.image;
    uint64_t bits = reader.varint();
    if (bits & ~static_cast<uint64_t>(kRecordBitsKnown)) return fail("unknown field bits");
    CallRecord record = image;
    uint64_t issue = static_cast<uint64_t>(image.issueNs) + unzigzag(reader.varint());
    record.issueNs = static_cast<int64_t>(issue);
    record.startNs = 0;
    record.completeNs = 0;
    if (bits & kHasStart) record.startNs = static_cast<int64_t>(issue + unzigzag(reader.varint()));
    uint64_t start = static_cast<uint64_t>(record.startNs);
    if (bits & kHasComplete) {
      record.completeNs = static_cast<int64_t>((start ? start : issue) + unzigzag(reader.varint()));
    }
    if (bits & kHasCount) record.count = reader.varint();
    if (bits & kHasCallSite) record.callSite = image.callSite + unzigzag(reader.varint());
    if (bits & kHasState) record.state = static_cast<RecordState>(reader.byte());
    // Fields whose default depends on the op are read first, resolved once the op is known.
    uint64_t seqDelta = bits & kHasSeq ? unzigzag(reader.varint()) : 0;
    uint64_t ordinalDelta = bits & kHasOrdinal ? unzigzag(reader.varint()) : 0;
    uint64_t ringDelta = bits & kHasRingIndex ? unzigzag(reader.varint()) : 0;
    if (bits & kHasStream) record.stream = image.stream + unzigzag(reader.varint());
    if (bits & kHasShape) {
      record.op = static_cast<OpKind>(reader.byte());
      record.dtype = reader.byte();
      record.redop = reader.byte();
    }
    if (bits & kHasRootOrPeer)
      record.rootOrPeer = static_cast<int32_t>(unzigzag32(reader.varint32()));
    uint64_t p2pDelta = bits & kHasP2pSeq ? unzigzag(reader.varint()) : 0;
    if (bits & kHasFlags) record.flags = reader.byte();
    uint64_t fingerprintValue = bits & kHasFingerprint ? reader.fixed64() : 0;
    uint64_t rolling = bits & kHasRolling ? reader.fixed64() : 0;
    if (bits & kHasResult) record.result = static_cast<int32_t>(unzigzag32(reader.varint32()));
    if (bits & kHasThread) {
      record.threadId = static_cast<int32_t>(static_cast<uint32_t>(image.threadId) +
                                             unzigzag32(reader.varint32()));
    }
    if (bits & kHasGroupDepth) {
      uint64_t depth = reader.varint();
      if (depth > UINT16_MAX) return fail("group depth over 16 bits");
      record.groupDepth = static_cast<uint16_t>(depth);
    }
    if (bits & kHasSlotVersion)
      record.slotVersion = image.slotVersion + unzigzag32(reader.varint32());
    record.groupSerial = bits & kHasGroupSerial ? reader.byte() : 0;
    if (!reader.ok) return fail("truncated RECORD");
    if (record.op >= OpKind::kCount) return fail("unknown op");
    if (record.state > RecordState::kAborted) return fail("unknown state");
    Expected expected = expectedFor(comm, record.op);
    record.seq = comm.lastSeq + 1 + seqDelta;
    record.ncclSeqNumber = expected.ordinal + ordinalDelta;
    record.ringIndex = lastRing_ + 1 + ringDelta;
    record.p2pSeq = expected.p2pSeq + p2pDelta;
    const bool sameShape =
        comm.imageFingerprintImplied && !(bits & (kHasCount | kHasShape | kHasRootOrPeer));
    record.fingerprint = bits & kHasFingerprint ? fingerprintValue
                         : sameShape            ? image.fingerprint
                                                : expectedFingerprint(record);
    if (!(bits & kHasRolling)) {
      rolling = sequenced(record.op) ? rollingHash(comm.rolling, record.fingerprint) : 0;
    }
    record.rollingHash = rolling;
    recordSent(comm, record, bits & kKeep);
    comm.imageFingerprintImplied = !(bits & kHasFingerprint);
    records->push_back(record);
  }
  return true;
}

void encodeHello(const Hello& hello, std::vector<std::byte>& out) {
  header(FrameType::kHello, sizeof hello, out);
  append(out, &hello, sizeof hello);
}

void encodeComms(std::span<const CommInfo> comms, std::vector<std::byte>& out) {
  encodeTable(FrameType::kComms, 0, false, comms, out);
}

size_t beginRecords(int64_t nowNs, std::vector<std::byte>& out) {
  size_t offset = out.size();
  header(FrameType::kRecords, 0, out);
  append(out, &nowNs, sizeof nowNs);
  return offset;
}

bool recordsFit(size_t frameOffset, uint32_t records, const std::vector<std::byte>& out) {
  size_t payload = out.size() - frameOffset - sizeof(FrameHeader);
  return records < kMaxRecordsPerFrame && payload + kMaxRecordBytes <= kMaxPayload &&
         out.size() + kMaxRecordBytes <= out.capacity();
}

void appendRecord(RecordEncoder& encoder, const CallRecord& record, bool keep,
                  std::vector<std::byte>& out) {
  size_t at = out.size();
  out.resize(at + kMaxRecordBytes);
  out.resize(at + encoder.encode(record, keep, out.data() + at));
}

void endRecords(size_t frameOffset, std::vector<std::byte>& out) {
  auto length = static_cast<uint32_t>(out.size() - frameOffset - sizeof(FrameHeader));
  std::memcpy(out.data() + frameOffset + offsetof(FrameHeader, length), &length, sizeof length);
}

void encodeRecords(int64_t nowNs, std::span<const CallRecord> records, RecordEncoder& encoder,
                   std::vector<std::byte>& out, bool keepUnfinished) {
  size_t next = 0;
  do {
    size_t frame = beginRecords(nowNs, out);
    out.reserve(out.size() + kMaxPayload);  // this convenience may allocate; the agent does not
    for (uint32_t count = 0; next < records.size() && recordsFit(frame, count, out); ++count) {
      const CallRecord& record = records[next++];
      appendRecord(encoder, record, keepUnfinished && !isFinal(record), out);
    }
    endRecords(frame, out);
  } while (next < records.size());
}

void encodeBye(std::vector<std::byte>& out, std::optional<int32_t> exitStatus) {
  header(FrameType::kBye, exitStatus ? sizeof(int32_t) : 0, out);
  if (exitStatus) append(out, &*exitStatus, sizeof(int32_t));
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

void encodeFolded(int64_t nowNs, std::span<const FoldedNote> notes, std::vector<std::byte>& out) {
  encodeTable(FrameType::kFolded, nowNs, true,
              notes.first(std::min<size_t>(notes.size(), kMaxFoldedNotes)), out);
}

void encodeRefused(std::vector<std::byte>& out) {
  header(FrameType::kRefused, sizeof kVersion, out);
  append(out, &kVersion, sizeof kVersion);
}

// A frame as Frame{} has it, its vectors' room kept: a collector decodes every frame of a
// connection into one Frame, and a fresh one cost a malloc per frame and a few more as its
// records vector grew.
namespace {
void clearFrame(Frame* frame) {
  frame->type = FrameType::kBye;
  frame->hello = Hello{};
  frame->comms.clear();
  frame->nowNs = 0;
  frame->records.clear();
  frame->waits.clear();
  frame->folded.clear();
  frame->reason.clear();
  frame->commHash = 0;
  frame->version = 0;
  frame->exitStatus.reset();
}
}  // namespace

DecodeStatus decodeFrame(std::span<const std::byte> bytes, Frame* frame, size_t* consumed,
                         std::string* error, RecordDecoder* records) {
  if (bytes.size() < sizeof(FrameHeader)) return DecodeStatus::kNeedMore;
  FrameHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kMagic) {
    *error = "not an ncclwatch frame (bad magic)";
    return DecodeStatus::kInvalid;
  }
  // REFUSED reads the same in every version: what an agent of any version must understand.
  if (h.type == static_cast<uint16_t>(FrameType::kRefused) && h.length == sizeof(uint16_t) &&
      h.reserved == 0) {
    if (bytes.size() < sizeof h + h.length) return DecodeStatus::kNeedMore;
    *frame = Frame{};
    frame->type = FrameType::kRefused;
    std::memcpy(&frame->version, bytes.data() + sizeof h, sizeof frame->version);
    *consumed = sizeof h + h.length;
    return DecodeStatus::kFrame;
  }
  if (h.version != kVersion) {
    *error = "protocol version " + std::to_string(h.version) + " (this side speaks version " +
             std::to_string(kVersion) + ")";
    frame->version = h.version;
    return DecodeStatus::kOtherVersion;
  }
  if (h.length > kMaxPayload || h.reserved != 0) {
    *error = "frame length " + std::to_string(h.length) + " over the bound";
    return DecodeStatus::kInvalid;
  }
  if (bytes.size() - sizeof h < h.length) return DecodeStatus::kNeedMore;
  const std::byte* payload = bytes.data() + sizeof h;
  clearFrame(frame);
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
      ok = h.length >= sizeof(int64_t) && records != nullptr;
      if (!ok) *error = "RECORDS frame without its time, or where none is expected";
      if (ok) {
        std::memcpy(&frame->nowNs, payload, sizeof frame->nowNs);
        ok = records->decode(std::span(payload + sizeof(int64_t), h.length - sizeof(int64_t)),
                             &frame->records, error);
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
    case FrameType::kFolded:
      ok = h.length >= sizeof(int64_t);
      if (!ok) *error = "FOLDED frame without its time";
      if (ok) {
        std::memcpy(&frame->nowNs, payload, sizeof frame->nowNs);
        ok =
            decodeTable(payload, h.length, sizeof(int64_t), kMaxFoldedNotes, &frame->folded, error);
      }
      break;
    case FrameType::kSites:
      frame->reason.assign(reinterpret_cast<const char*>(payload), h.length);
      break;
    case FrameType::kBye:
      ok = h.length == 0 || h.length == sizeof(int32_t);
      if (h.length == sizeof(int32_t)) {
        int32_t status;
        std::memcpy(&status, payload, sizeof status);
        frame->exitStatus = status;
      }
      if (!ok) *error = "BYE frame with a payload other than an exit status";
      break;
    case FrameType::kDump:
      ok = h.length <= 1024;
      if (ok) frame->reason.assign(reinterpret_cast<const char*>(payload), h.length);
      if (!ok) *error = "DUMP reason over 1024 bytes";
      break;
    case FrameType::kClosed:
      ok = h.length == 0;
      if (!ok) *error = "CLOSED frame with a payload";
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

SplitStatus splitFrame(std::span<const std::byte> bytes, size_t* frameBytes, uint32_t* channel,
                       uint16_t* type) {
  if (bytes.size() < sizeof(FrameHeader)) return SplitStatus::kNeedMore;
  FrameHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kMagic || h.length > kMaxPayload) return SplitStatus::kInvalid;
  if (bytes.size() - sizeof h < h.length) return SplitStatus::kNeedMore;
  *frameBytes = sizeof h + h.length;
  *channel = h.reserved;
  *type = h.type;
  return SplitStatus::kFrame;
}

void setChannel(std::byte* frame, uint32_t channel) {
  std::memcpy(frame + offsetof(FrameHeader, reserved), &channel, sizeof channel);
}

void appendWithChannel(std::span<const std::byte> frames, uint32_t channel,
                       std::vector<std::byte>& out) {
  size_t start = out.size();
  out.insert(out.end(), frames.begin(), frames.end());
  for (size_t at = start; at + sizeof(FrameHeader) <= out.size();) {
    size_t bytes = 0;
    uint32_t ignored = 0;
    uint16_t type = 0;
    if (splitFrame(std::span(out).subspan(at), &bytes, &ignored, &type) != SplitStatus::kFrame) {
      break;  // not whole frames: the caller's bug, left as it is
    }
    setChannel(out.data() + at, channel);
    at += bytes;
  }
}

void encodeClosed(uint32_t channel, std::vector<std::byte>& out) {
  size_t start = out.size();
  header(FrameType::kClosed, 0, out);
  setChannel(out.data() + start, channel);
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
