// Reads ring files of live, crashed, truncated or corrupt processes. It never throws on bad
// input and never reads out of bounds; it salvages every valid record and lists exactly what
// was not valid (offset and field), so that a user knows what the analysis stands on.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "trace/ring_format.h"

namespace ncclwatch::trace {

struct TraceProblem {
  uint64_t offset = 0;  // byte offset in the file
  std::string what;     // one line: the field and why it is not valid
};

struct TraceFile {
  std::string path;
  bool usable = false;  // false: not a trace of a version this reader knows; nothing salvaged
  RingHeader header{};  // as read (fields may be the ones the problems name)
  std::vector<CommInfo> comms;
  std::vector<CallRecord> records;  // valid records, in ring-index (issue) order
  uint64_t slotsPresent = 0;        // slots fully inside the file
  uint64_t emptySlots = 0;          // never written
  std::vector<TraceProblem> problems;
};

// Parses the bytes of a ring file. `path` only labels problems.
TraceFile parseTrace(std::span<const std::byte> bytes, const std::string& path = "");

// Reads and parses a file; a file that cannot be read yields usable=false and one problem.
TraceFile readTraceFile(const std::string& path);

}  // namespace ncclwatch::trace
