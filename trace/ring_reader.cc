#include "trace/ring_reader.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace ncclwatch::trace {
namespace {

bool isPowerOfTwo(uint64_t value) {
  return value != 0 && (value & (value - 1)) == 0;
}

void problem(TraceFile& file, uint64_t offset, std::string what) {
  file.problems.push_back({offset, std::move(what)});
}

// Copies a slot between two equal, even reads of its seqlock word. A slot still odd after a
// few tries belongs to a writer that is inside (live) or died inside (crashed): torn.
bool copyStableSlot(const std::byte* slot, CallRecord* out) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    uint32_t before, after;
    std::memcpy(&before, slot + offsetof(CallRecord, slotVersion), sizeof before);
    std::atomic_thread_fence(std::memory_order_acquire);
    std::memcpy(out, slot, sizeof *out);
    std::atomic_thread_fence(std::memory_order_acquire);
    std::memcpy(&after, slot + offsetof(CallRecord, slotVersion), sizeof after);
    if (before == after && (before & 1u) == 0) return true;
  }
  return false;
}

// Field checks of one record: the first invalid field, or empty when the record is valid.
std::string invalidField(const CallRecord& record, uint64_t slotIndex, uint32_t capacity) {
  if ((record.ringIndex & (capacity - 1)) != slotIndex)
    return "ringIndex does not belong to this slot";
  if (record.op == OpKind::kUnknown || record.op >= OpKind::kCount) return "op out of range";
  if (record.state == RecordState::kEmpty || record.state > RecordState::kAborted) {
    return "state out of range";
  }
  if (record.dtype > 31) return "dtype out of range";
  if (record.issueNs < 0 || record.startNs < 0 || record.completeNs < 0) return "negative time";
  return {};
}

}  // namespace

TraceFile parseTrace(std::span<const std::byte> bytes, const std::string& path) {
  TraceFile file;
  file.path = path;
  if (bytes.size() < sizeof(RingHeader)) {
    problem(file, 0,
            "file is " + std::to_string(bytes.size()) + " bytes, shorter than the " +
                std::to_string(sizeof(RingHeader)) + "-byte header");
    return file;
  }
  std::memcpy(&file.header, bytes.data(), sizeof file.header);
  const RingHeader& h = file.header;
  if (std::memcmp(h.magic, kRingMagic, sizeof kRingMagic) != 0) {
    problem(file, offsetof(RingHeader, magic), "magic is not NCCLWTCH: not an ncclwatch trace");
    return file;
  }
  if (h.formatVersion != kRingFormatVersion) {
    problem(file, offsetof(RingHeader, formatVersion),
            "format version " + std::to_string(h.formatVersion) + " is not supported (expected " +
                std::to_string(kRingFormatVersion) + ")");
    return file;
  }
  if (h.headerBytes != kRingHeaderBytes || h.recordBytes != sizeof(CallRecord)) {
    problem(file, offsetof(RingHeader, headerBytes),
            "header or record size differs from format version 1");
    return file;
  }
  file.usable = true;
  uint64_t capacity = h.capacity;
  uint64_t slotsInFile =
      bytes.size() > kRingHeaderBytes ? (bytes.size() - kRingHeaderBytes) / sizeof(CallRecord) : 0;
  if (!isPowerOfTwo(capacity) || capacity < kMinRingCapacity || capacity > kMaxRingCapacity) {
    problem(file, offsetof(RingHeader, capacity),
            "capacity " + std::to_string(capacity) + " is not a power of two in range");
    // Salvage what the file holds: the largest power of two that fits.
    capacity = kMinRingCapacity;
    while (capacity * 2 <= slotsInFile && capacity * 2 <= kMaxRingCapacity) capacity *= 2;
  }
  if (slotsInFile < capacity) {
    problem(file, kRingHeaderBytes + slotsInFile * sizeof(CallRecord),
            "file truncated: " + std::to_string(slotsInFile) + " of " + std::to_string(capacity) +
                " record slots present");
  }
  file.slotsPresent = std::min(slotsInFile, capacity);

  uint32_t commCount = h.commCount;
  if (commCount > kCommTableCapacity) {
    problem(file, offsetof(RingHeader, commCount),
            "commCount " + std::to_string(commCount) + " exceeds the table's " +
                std::to_string(kCommTableCapacity));
    commCount = kCommTableCapacity;
  }
  for (uint32_t i = 0; i < commCount; ++i) {
    const CommInfo& comm = h.comms[i];
    if (comm.commHash == 0 || comm.nranks <= 0 || comm.rank < 0 || comm.rank >= comm.nranks) {
      problem(file, offsetof(RingHeader, comms) + i * sizeof(CommInfo),
              "communicator entry " + std::to_string(i) + " has no hash or an invalid rank");
      continue;
    }
    file.comms.push_back(comm);
  }

  const std::byte* slots = bytes.data() + kRingHeaderBytes;
  for (uint64_t i = 0; i < file.slotsPresent; ++i) {
    const std::byte* slot = slots + i * sizeof(CallRecord);
    uint64_t offset = kRingHeaderBytes + i * sizeof(CallRecord);
    CallRecord record;
    if (!copyStableSlot(slot, &record)) {
      problem(file, offset, "slot " + std::to_string(i) + " torn: its writer was inside it");
      continue;
    }
    if (record.slotVersion == 0) {
      ++file.emptySlots;
      continue;
    }
    std::string invalid = invalidField(record, i, static_cast<uint32_t>(capacity));
    if (!invalid.empty()) {
      problem(file, offset, "slot " + std::to_string(i) + ": " + invalid);
      continue;
    }
    file.records.push_back(record);
  }
  std::sort(file.records.begin(), file.records.end(),
            [](const CallRecord& a, const CallRecord& b) { return a.ringIndex < b.ringIndex; });
  return file;
}

TraceFile readTraceFile(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) {
    TraceFile file;
    file.path = path;
    file.problems.push_back({0, std::string("cannot open: ") + std::strerror(errno)});
    return file;
  }
  std::vector<char> content((std::istreambuf_iterator<char>(stream)),
                            std::istreambuf_iterator<char>());
  return parseTrace(std::as_bytes(std::span<const char>(content)), path);
}

}  // namespace ncclwatch::trace
