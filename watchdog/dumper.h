// Taking a dump: every thread's native stack (signal + libunwind, then symbolized), the Python
// stacks when the host is CPython, and the local findings, as a trace::Dump; and the concise
// block that goes to stderr. Runs on the watchdog thread only, so two dumps never overlap; every
// step has a time bound.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "trace/dump.h"

namespace ncclwatch::watchdog {

struct DumpBounds {
  std::chrono::milliseconds perThread{200};   // each thread's answer to the stack signal
  std::chrono::milliseconds symbolize{1500};  // symbolizing all threads
  std::chrono::milliseconds python{1000};     // the Python stacks
};

// At the watchdog's start, on the application thread: installs the stack signal
// (SIGRTMIN + stackSignalOffset) and prepares the Python route. False with `error` when the
// stack signal cannot be installed (dumps then carry no native stacks of other threads).
bool prepareDumps(int stackSignalOffset, std::string* error);

trace::Dump takeDump(const std::string& trigger, const std::string& reason,
                     std::vector<trace::DumpFinding> findings, const DumpBounds& bounds);

// Who this process is, for the stderr block's first line.
struct ProcessLabel {
  int rank = -1;
  int pid = 0;
  std::string tracePath;
};

// The concise stderr block: per finding the comm, seq, op, age and state in words, and the top
// frames of the thread that issued the call; then where the dump went.
std::string describeDump(const trace::Dump& dump, const ProcessLabel& label, bool written,
                         int topFrames = 8);

}  // namespace ncclwatch::watchdog
