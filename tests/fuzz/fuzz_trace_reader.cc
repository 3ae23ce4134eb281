// libFuzzer target: the ring-file reader must accept any bytes without crashing, reading out of
// bounds, or losing its invariants (every record read from the ring sits inside the file's slots;
// records are unique per ring index and in order; only continuous files have segments).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "trace/ring_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ncclwatch::trace;
  TraceFile file = parseTrace(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz");
  if (!file.usable && !file.records.empty()) std::abort();
  if (file.ringRecords + file.emptySlots > file.slotsPresent) std::abort();
  if (file.records.size() > file.ringRecords + file.segmentRecords) std::abort();
  if (!file.continuous && (file.segments != 0 || file.segmentRecords != 0)) std::abort();
  if (file.segmentRecords > size / sizeof(CallRecord)) std::abort();
  for (size_t i = 0; i < file.records.size(); ++i) {
    const CallRecord& record = file.records[i];
    if (record.op == OpKind::kUnknown || record.op >= OpKind::kCount) std::abort();
    if (i > 0 && file.records[i - 1].ringIndex >= record.ringIndex) std::abort();
  }
  return 0;
}
