// A dump: what the watchdog found and where every thread of the process was, written into the
// trace file as a block after the ring (docs/format.md, "Dump blocks"). The watchdog builds a
// Dump and formats it; the reader parses it back. Text lines of tab-separated fields keep the
// block readable with `strings` when everything else is broken.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ncclwatch::trace {

// What the local watchdog concluded about one communicator.
struct DumpFinding {
  uint64_t commHash = 0;
  uint64_t seq = 0;  // the oldest pending call
  std::string op;    // its OpKind name
  // "issued" (queued behind earlier GPU work), "started", or "reached" (started as inferred from
  // stream order with one event per call: kRecordStartInferred)
  std::string state;
  int64_t ageMs = 0;        // since it was issued
  int threadId = 0;         // the thread that issued it
  std::string explanation;  // one line
};

struct DumpFrame {
  uint64_t pc = 0;
  std::string function;  // demangled; empty when unknown
  uint64_t functionOffset = 0;
  std::string module;
  uint64_t moduleOffset = 0;
  std::string buildId;
  // Source lines, filled only by the offline CLI from the module's DWARF (tools/source_lines.h);
  // never part of a dump's text. A frame with inlined calls at its pc is expanded into one frame
  // per inlined function (inlined = true, innermost first), then the real function's frame.
  std::string file;        // source file of `line`; empty when unknown
  int line = 0;            // 0 when unknown
  bool inlined = false;    // a function inlined into the next frame, at this frame's file:line
  std::string sourceNote;  // why a line that could be known is not ("binary changed")
};

struct DumpThread {
  int tid = 0;
  // The thread's pthread_self() (glibc: the address of its thread control block), which is the
  // id CPython gives the thread's Python stack (DumpPythonThread::threadId): the join between a
  // native and a Python stack. 0 when unknown (a thread that did not answer, a dump written
  // before the field existed).
  uint64_t pthreadId = 0;
  std::string name;
  bool answered = false;  // native frames taken by the thread itself
  std::string wchan;      // for threads that did not answer
  std::string syscall;
  std::vector<DumpFrame> frames;
};

struct DumpPythonFrame {
  std::string file;
  int line = -1;
  std::string function;
};

struct DumpPythonThread {
  uint64_t threadId = 0;  // CPython's thread identifier (pthread_t)
  bool current = false;
  std::vector<DumpPythonFrame> frames;
};

struct Dump {
  std::string trigger;  // hang, sigterm, fatal-signal, request, signal, exit
  std::string reason;   // one line
  int64_t timeNs = 0;   // CLOCK_MONOTONIC when it was taken
  int64_t tookNs = 0;   // how long taking it lasted
  // How the native stacks were taken: "ptrace (no signal sent)", or "signal SIGRTMIN+3" and why
  // the signal route was used. Empty in dumps written before the field existed.
  std::string stackRoute;
  std::vector<DumpFinding> findings;
  std::vector<DumpThread> threads;
  std::string pythonNote;  // which route gave the Python stacks, or why there are none
  std::vector<DumpPythonThread> pythonThreads;
  // The reader found the block cut short (its process ended while writing it): what is here is
  // its first whole lines.
  bool partial = false;
};

// The block's text. Fields are sanitized: tabs and line breaks inside a value become spaces.
std::string formatDump(const Dump& dump);

// Parses a block's text; false with a one-line `problem` (and what was read before it in
// `dump`) when a line is malformed. Never throws; bounded by the text's size.
bool parseDump(std::string_view text, Dump* dump, std::string* problem);

}  // namespace ncclwatch::trace
