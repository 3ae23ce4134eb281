// libFuzzer target: the ring-file reader must accept any bytes without crashing, reading out of
// bounds, or losing its invariants (every salvaged record sits inside the file's slots).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "trace/ring_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ncclwatch::trace;
  TraceFile file = parseTrace(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz");
  if (!file.usable && !file.records.empty()) std::abort();
  if (file.records.size() + file.emptySlots > file.slotsPresent) std::abort();
  for (const CallRecord& record : file.records) {
    if (record.op == OpKind::kUnknown || record.op >= OpKind::kCount) std::abort();
  }
  return 0;
}
