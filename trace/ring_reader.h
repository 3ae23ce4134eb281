// Reads ring files of live, crashed, truncated or corrupt processes. It never throws on bad
// input and never reads out of bounds; it salvages every valid record and lists exactly what
// was not valid (offset and field), so that a user knows what the analysis stands on.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "trace/dump.h"
#include "trace/python_sites.h"
#include "trace/record_window.h"
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
  // Valid records, in ring-index (issue) order, one per ring index: in continuous mode those of
  // the segments and of the ring together (the ring's copy wins: it is the newer).
  RecordWindow records;
  uint64_t slotsPresent = 0;  // slots fully inside the file
  uint64_t emptySlots = 0;    // never written
  uint64_t ringRecords = 0;   // valid records read from the slots
  // Continuous mode (header traceMode full).
  bool continuous = false;
  uint64_t segments = 0;        // segments read, valid or salvaged from a truncated tail
  uint64_t segmentRecords = 0;  // valid records read from segments
  // Ring indices below max(nextIndex, last index + 1) with no valid record: the writer's
  // droppedRecords plus whatever damage, truncation or a crash cost. 0 in ring mode.
  uint64_t lostRecords = 0;
  // Where pending calls waited inside NCCL (the profiler plugin's wait notes), as last written.
  std::vector<WaitNote> waits;
  // The Python call sites records refer to (tagged callSite words), from its sites blocks.
  std::vector<PythonSite> pythonSites;
  // Dumps the watchdog wrote after the ring (hang, signal, request, exit), oldest first.
  std::vector<Dump> dumps;
  std::vector<TraceProblem> problems;
  // The live collector's alone (0 in a file): the latest time (CLOCK_MONOTONIC) of this
  // process's calls that its host's relay folded (tools/relay_fold.h) and so never reached the
  // window: the process was active then.
  int64_t foldedLatestNs = 0;
  // Put back as it was just before an abort that ended its job's hang (analysis/before_aborts.h):
  // its process ran then, whatever its end (a clean exit after the abort ends no hang).
  bool readBeforeAbort = false;
  // Set only with readBeforeAbort: the process issued calls after that abort (its own abort,
  // say), so it was running then: a dead-rank verdict says it was alive but silent, as the live
  // collector did, not gone (whatever ended it later).
  bool ranAfterAbort = false;
  // The header was read from the process's ring file once it could write no more (a file read
  // offline, or the live collector's reread of a process that died on its host): a zero
  // fatalSignal there means no handler of ours saw one (SIGKILL, or _exit), not that it is
  // unknown, as it is in the header the collector builds from HELLO.
  bool endRecorded = false;
  // NCCL's message for the newest failed call (header lastError), and that call's ring index;
  // empty when none was written, or the read caught its writer inside it.
  std::string lastNcclError;
  uint64_t lastNcclErrorIndex = 0;
};

// Parses the bytes of a ring file. `path` only labels problems.
TraceFile parseTrace(std::span<const std::byte> bytes, const std::string& path = "");
// NCCL's message for the newest failed call of a ring header's process (header lastError), and
// that call's ring index, copied between two equal reads of the index; false when none was
// written or the copy caught its writer inside it.
bool lastNcclErrorOf(std::span<const std::byte> header, std::string* text, uint64_t* index);

// A whole file's bytes, read in blocks (a trace is megabytes; byte by byte it took seconds in a
// sanitized build). False, with `error` set (strerror), when it cannot be opened.
bool readFileBytes(const std::string& path, std::vector<std::byte>* bytes, std::string* error);

// Reads and parses a file; a file that cannot be read yields usable=false and one problem.
TraceFile readTraceFile(const std::string& path);

}  // namespace ncclwatch::trace
