#include "trace/ring_reader.h"

#include "trace/dump.h"

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

// The header's wait notes, copied between two equal even reads of their seqlock word. A table
// still being written after three tries was left so by a process that ended inside the write:
// its writer rewrites only the entries that change, each with its check, so the whole entries
// (old or new) are kept and a torn one is dropped.
void readWaits(std::span<const std::byte> bytes, TraceFile& file) {
  if (bytes.size() < offsetof(RingHeader, waits) + sizeof(RingHeader::waits)) return;
  const std::byte* version = bytes.data() + offsetof(RingHeader, waitsVersion);
  const std::byte* table = bytes.data() + offsetof(RingHeader, waits);
  WaitNote notes[kWaitNoteCapacity];
  bool settled = false;
  for (int attempt = 0; attempt < 3 && !settled; ++attempt) {
    uint32_t before, after;
    std::memcpy(&before, version, sizeof before);
    std::atomic_thread_fence(std::memory_order_acquire);
    std::memcpy(notes, table, sizeof notes);
    std::atomic_thread_fence(std::memory_order_acquire);
    std::memcpy(&after, version, sizeof after);
    settled = before == after && (before & 1u) == 0;
  }
  size_t dropped = 0;
  for (const WaitNote& note : notes) {
    if (note.commHash == 0) continue;
    // Settled, an unchecked note is one of a file before the checks; unsettled, it cannot be
    // told from a torn one.
    bool whole = note.check == 0 ? settled : note.check == waitNoteCheck(note);
    if (!whole) {
      ++dropped;
      continue;
    }
    // Unsettled, an entry not yet rewritten may hold a call the new table holds elsewhere.
    auto same = std::find_if(file.waits.begin(), file.waits.end(), [&](const WaitNote& kept) {
      return kept.commHash == note.commHash && kept.seq == note.seq;
    });
    if (same == file.waits.end()) {
      file.waits.push_back(note);
    } else if (note.updatedNs > same->updatedNs) {
      *same = note;
    }
  }
  if (dropped > 0) {
    bool one = dropped == 1;
    std::string what = std::to_string(dropped) + (one ? " wait note " : " wait notes ");
    if (settled) {
      what += one ? "fails its check: dropped" : "fail their check: dropped";
    } else {
      what += one ? "torn: its writer ended inside it" : "torn: their writer ended inside them";
    }
    problem(file, offsetof(RingHeader, waits), std::move(what));
  }
}

// Field checks of one record but its ringIndex: the first invalid field, or empty when valid.
std::string invalidContent(const CallRecord& record) {
  if (record.op == OpKind::kUnknown || record.op >= OpKind::kCount) return "op out of range";
  if (record.state == RecordState::kEmpty || record.state > RecordState::kAborted) {
    return "state out of range";
  }
  if (record.dtype > 31) return "dtype out of range";
  if (record.issueNs < 0 || record.startNs < 0 || record.completeNs < 0) return "negative time";
  return {};
}

std::string invalidField(const CallRecord& record, uint64_t slotIndex, uint32_t capacity) {
  if ((record.ringIndex & (capacity - 1)) != slotIndex)
    return "ringIndex does not belong to this slot";
  return invalidContent(record);
}

std::string at(uint64_t offset) {
  return "segment at offset " + std::to_string(offset);
}

// The next 32-byte step after `from` where a segment or dump magic starts, or `size` if none.
uint64_t resync(std::span<const std::byte> bytes, uint64_t from) {
  uint64_t size = bytes.size();
  for (uint64_t pos = from + sizeof(SegmentHeader);
       pos < size && size - pos >= sizeof kSegmentMagic; pos += sizeof(SegmentHeader)) {
    if (std::memcmp(bytes.data() + pos, kSegmentMagic, sizeof kSegmentMagic) == 0 ||
        std::memcmp(bytes.data() + pos, kDumpMagic, sizeof kDumpMagic) == 0 ||
        std::memcmp(bytes.data() + pos, kSitesMagic, sizeof kSitesMagic) == 0) {
      return pos;
    }
  }
  return size;
}

// Records [0, count) of the segment whose records start at `recordsAt`, checked one by one.
void takeSegmentRecords(TraceFile& file, std::span<const std::byte> bytes, uint64_t recordsAt,
                        uint64_t firstIndex, uint64_t count, RecordWindow& out) {
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t offset = recordsAt + i * sizeof(CallRecord);
    CallRecord record;
    std::memcpy(&record, bytes.data() + offset, sizeof record);
    std::string invalid = record.ringIndex != firstIndex + i
                              ? "ringIndex " + std::to_string(record.ringIndex) +
                                    " where the segment expects " + std::to_string(firstIndex + i)
                              : invalidContent(record);
    if (!invalid.empty()) {
      problem(file, offset, "segment record " + std::to_string(firstIndex + i) + ": " + invalid);
      continue;
    }
    out.push_back(record);
    ++file.segmentRecords;
  }
}

// What a process killed while writing a text block left of it: the text up to the first NUL
// (the block's space is zero where nothing was written yet) or the file's end, in whole lines.
std::string_view writtenPart(std::span<const std::byte> bytes, uint64_t textAt, uint64_t length) {
  std::string_view text(reinterpret_cast<const char*>(bytes.data() + textAt), length);
  text = text.substr(0, text.find('\0'));
  size_t lastLine = text.rfind('\n');
  return lastLine == std::string_view::npos ? std::string_view() : text.substr(0, lastLine + 1);
}

// The text block (a dump, or Python sites) at `pos`, checked: `text` is set when whole and
// intact. Returns where the next block starts, or 0 when the file ends inside this one. A block
// that ends early (its process was killed while writing it, or a NUL where its text should go
// on) sets `partial` and gives its whole lines in `text`, when `partial` is not null.
uint64_t readTextBlock(TraceFile& file, std::span<const std::byte> bytes, uint64_t pos,
                       const char* what, std::string_view* text, bool* partial = nullptr) {
  uint64_t size = bytes.size();
  std::string where = std::string(what) + " at offset " + std::to_string(pos);
  DumpHeader header;
  std::memcpy(&header, bytes.data() + pos, sizeof header);
  if (header.textBytes == 0 || header.textBytes > kMaxDumpBytes) {
    uint64_t next = resync(bytes, pos);
    problem(file, pos,
            where + ": size " + std::to_string(header.textBytes) + " out of range, skipped");
    return next;
  }
  uint64_t textAt = pos + sizeof header;
  uint64_t padded = paddedDumpBytes(header.textBytes);
  if (size - textAt < padded) {
    std::string_view written =
        writtenPart(bytes, textAt, std::min(size - textAt, header.textBytes));
    if (partial != nullptr && !written.empty()) {
      *partial = true;
      *text = written;
      problem(file, pos,
              where + " is partial: " + std::to_string(written.size()) + " of " +
                  std::to_string(header.textBytes) +
                  " bytes written (the process ended while writing it)");
      return 0;
    }
    problem(file, pos,
            where + " truncated: " + std::to_string(size - textAt) + " of " +
                std::to_string(padded) + " bytes present");
    return 0;
  }
  uint64_t next = textAt + padded;
  if (dumpChecksum(header.textBytes, bytes.data() + textAt) != header.checksum) {
    // Zeros inside the text: its end was never written. Without them the block is damaged.
    std::string_view whole(reinterpret_cast<const char*>(bytes.data() + textAt), header.textBytes);
    std::string_view written = whole.find('\0') == std::string_view::npos
                                   ? std::string_view()
                                   : writtenPart(bytes, textAt, header.textBytes);
    if (partial != nullptr && !written.empty()) {
      *partial = true;
      *text = written;
      problem(file, pos,
              where + " is partial: " + std::to_string(written.size()) + " of " +
                  std::to_string(header.textBytes) +
                  " bytes written (the process ended while writing it)");
      return next;
    }
    problem(file, pos, where + ": checksum mismatch, skipped");
    return next;
  }
  *text = std::string_view(reinterpret_cast<const char*>(bytes.data() + textAt), header.textBytes);
  return next;
}

// The dump block at `pos`: parsed into file.dumps when whole and intact, or when partial (named
// so: Dump::partial).
uint64_t readDump(TraceFile& file, std::span<const std::byte> bytes, uint64_t pos) {
  std::string_view text;
  bool partial = false;
  uint64_t next = readTextBlock(file, bytes, pos, "dump", &text, &partial);
  if (text.empty()) return next;
  Dump dump;
  std::string why;
  if (!parseDump(text, &dump, &why) && !partial) {
    problem(file, pos, "dump at offset " + std::to_string(pos) + ": " + why);
  }
  dump.partial = partial;
  file.dumps.push_back(std::move(dump));  // what parsed before a bad line is still shown
  return next;
}

// A block of Python call sites: parsed into file.pythonSites.
uint64_t readSites(TraceFile& file, std::span<const std::byte> bytes, uint64_t pos) {
  std::string_view text;
  uint64_t next = readTextBlock(file, bytes, pos, "sites", &text);
  std::string why;
  if (!text.empty() && !parsePythonSites(text, &file.pythonSites, &why)) {
    problem(file, pos, "sites at offset " + std::to_string(pos) + ": " + why);
  }
  return next;
}

// The blocks from `start` to the end of the file: segments (continuous mode only) and dumps. Bad
// ones are named and skipped; a truncated last one gives the records it holds in full.
void readSegments(TraceFile& file, std::span<const std::byte> bytes, uint64_t start,
                  RecordWindow& out, bool segmentsExpected = true) {
  uint64_t size = bytes.size();
  uint64_t pos = start;
  bool truncated = false;
  while (pos < size) {
    if (size - pos < sizeof(SegmentHeader)) {
      problem(file, pos,
              at(pos) + " truncated: " + std::to_string(size - pos) + " of " +
                  std::to_string(sizeof(SegmentHeader)) + " header bytes present");
      truncated = true;
      break;
    }
    bool sites = std::memcmp(bytes.data() + pos, kSitesMagic, sizeof kSitesMagic) == 0;
    if (sites || std::memcmp(bytes.data() + pos, kDumpMagic, sizeof kDumpMagic) == 0) {
      uint64_t next = sites ? readSites(file, bytes, pos) : readDump(file, bytes, pos);
      if (next == 0) {
        truncated = true;
        break;
      }
      pos = next;
      continue;
    }
    if (!segmentsExpected) {
      uint64_t next = resync(bytes, pos);
      problem(file, pos,
              "block at offset " + std::to_string(pos) +
                  " is not a dump or sites, and a ring-mode file has no segments: skipped");
      pos = next;
      continue;
    }
    SegmentHeader segment;
    std::memcpy(&segment, bytes.data() + pos, sizeof segment);
    std::string bad;
    if (std::memcmp(segment.magic, kSegmentMagic, sizeof kSegmentMagic) != 0) {
      bad = "bad magic";
    } else if (segment.recordCount == 0 || segment.recordCount > kMaxSegmentRecords) {
      bad = "record count " + std::to_string(segment.recordCount) + " out of range";
    }
    if (!bad.empty()) {
      uint64_t next = resync(bytes, pos);
      problem(file, pos,
              at(pos) + ": " + bad + ", skipped " +
                  (next < size ? "to offset " + std::to_string(next) : "to the end of the file"));
      pos = next;
      continue;
    }
    uint64_t recordsAt = pos + sizeof(SegmentHeader);
    uint64_t count = segment.recordCount;
    uint64_t present = (size - recordsAt) / sizeof(CallRecord);
    if (present < count) {
      problem(file, pos,
              at(pos) + " truncated: " + std::to_string(present) + " of " + std::to_string(count) +
                  " records present");
      ++file.segments;
      takeSegmentRecords(file, bytes, recordsAt, segment.firstIndex, present, out);
      truncated = true;
      break;
    }
    uint64_t end = recordsAt + count * sizeof(CallRecord);
    if (segmentChecksum(segment.firstIndex, segment.recordCount, bytes.data() + recordsAt) !=
        segment.checksum) {
      problem(file, pos,
              at(pos) + ": checksum mismatch, its " + std::to_string(count) + " records skipped");
      pos = end;
      continue;
    }
    ++file.segments;
    takeSegmentRecords(file, bytes, recordsAt, segment.firstIndex, count, out);
    pos = end;
  }
  uint64_t committed = file.header.persistedBytes;
  if (!truncated && committed > size) {
    problem(file, size,
            "file truncated: it ends at offset " + std::to_string(size) +
                ", the header says segments end at " + std::to_string(committed));
  }
}

// One record per ring index, in order; of several, the last in `records` wins.
void keepNewest(RecordWindow& records) {
  std::stable_sort(records.begin(), records.end(), [](const CallRecord& a, const CallRecord& b) {
    return a.ringIndex < b.ringIndex;
  });
  size_t kept = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    if (i + 1 < records.size() && records[i + 1].ringIndex == records[i].ringIndex) continue;
    records[kept++] = records[i];
  }
  records.resize(kept);
}

}  // namespace

bool lastNcclErrorOf(std::span<const std::byte> header, std::string* text, uint64_t* index) {
  if (header.size() < offsetof(RingHeader, lastError) + sizeof(RingHeader::lastError)) return false;
  uint64_t before, after;
  char copied[sizeof(RingHeader::lastError)];
  std::memcpy(&before, header.data() + offsetof(RingHeader, lastErrorIndex), sizeof before);
  std::atomic_thread_fence(std::memory_order_acquire);
  std::memcpy(copied, header.data() + offsetof(RingHeader, lastError), sizeof copied);
  std::atomic_thread_fence(std::memory_order_acquire);
  std::memcpy(&after, header.data() + offsetof(RingHeader, lastErrorIndex), sizeof after);
  if (before != after || before == 0 || before == kLastErrorWriting) return false;
  text->assign(copied, strnlen(copied, sizeof copied));
  *index = before - 1;
  return true;
}

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
  file.endRecorded = true;
  if (h.traceMode > static_cast<uint32_t>(TraceMode::kFull)) {
    problem(file, offsetof(RingHeader, traceMode),
            "traceMode " + std::to_string(h.traceMode) + " is unknown: read as full");
  }
  file.continuous = h.traceMode != static_cast<uint32_t>(TraceMode::kRing);
  bool capacityValid = true;
  uint64_t capacity = h.capacity;
  uint64_t slotsInFile =
      bytes.size() > kRingHeaderBytes ? (bytes.size() - kRingHeaderBytes) / sizeof(CallRecord) : 0;
  if (!isPowerOfTwo(capacity) || capacity < kMinRingCapacity || capacity > kMaxRingCapacity) {
    problem(file, offsetof(RingHeader, capacity),
            "capacity " + std::to_string(capacity) + " is not a power of two in range");
    capacityValid = false;
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

  readWaits(bytes, file);
  lastNcclErrorOf(bytes, &file.lastNcclError, &file.lastNcclErrorIndex);

  const std::byte* slots = bytes.data() + kRingHeaderBytes;
  RecordWindow ringCopies;
  ringCopies.reserve(file.slotsPresent);
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
    ringCopies.push_back(record);
  }
  file.ringRecords = ringCopies.size();
  uint64_t ringEnd = kRingHeaderBytes + capacity * sizeof(CallRecord);
  if (!file.continuous) {
    keepNewest(ringCopies);
    file.records = std::move(ringCopies);
    // Dumps follow the ring in ring mode too.
    if (capacityValid && bytes.size() > ringEnd) {
      RecordWindow none;
      readSegments(file, bytes, ringEnd, none, false);
    }
    return file;
  }

  RecordWindow all;
  if (!capacityValid) {
    problem(file, ringEnd,
            "segments not read: the ring's capacity, hence their offset, is unknown");
  } else if (slotsInFile >= capacity) {
    readSegments(file, bytes, ringEnd, all);
  }
  // The ring's copies go last: of two copies of one record, the ring's is the newer.
  all.reserve(all.size() + ringCopies.size());
  for (const CallRecord& record : ringCopies) all.push_back(record);
  keepNewest(all);
  file.records = std::move(all);
  uint64_t end = h.nextIndex;
  if (!file.records.empty() && file.records.back().ringIndex >= end) {
    end = std::max(file.records.back().ringIndex, file.records.back().ringIndex + 1);
  }
  file.lostRecords = end > file.records.size() ? end - file.records.size() : 0;
  return file;
}

bool readFileBytes(const std::string& path, std::vector<std::byte>* bytes, std::string* error) {
  bytes->clear();
  std::ifstream stream(path, std::ios::binary);
  if (!stream) {
    *error = std::strerror(errno);
    return false;
  }
  constexpr size_t kBlock = size_t{1} << 20;
  for (;;) {
    size_t have = bytes->size();
    bytes->resize(have + kBlock);
    stream.read(reinterpret_cast<char*>(bytes->data() + have),
                static_cast<std::streamsize>(kBlock));
    bytes->resize(have + static_cast<size_t>(stream.gcount()));
    if (!stream) return true;
  }
}

TraceFile readTraceFile(const std::string& path) {
  std::vector<std::byte> content;
  std::string error;
  if (!readFileBytes(path, &content, &error)) {
    TraceFile file;
    file.path = path;
    file.problems.push_back({0, "cannot open: " + error});
    return file;
  }
  return parseTrace(content, path);
}

}  // namespace ncclwatch::trace
