// Taking a dump: every thread's native stack, the Python stacks when the host is CPython, and
// the local findings, as a trace::Dump; and the concise block that goes to stderr. Runs on the
// watchdog thread only, so two dumps never overlap; every step has a time bound.
//
// Native stacks come through one of two routes (the dump's stackRoute says which):
// - ptrace: the `ncclwatch stacks-of` helper stops each thread from outside without a signal
//   (stack_helper.h), so the program's own sleeps and waits are not cut short;
// - signal: each thread is sent SIGRTMIN+3 and unwinds itself (stacks.h); its nanosleep,
//   epoll_wait, poll and futex waits may return EINTR. Taken for fatal-signal dumps (the process
//   is dying: no new process to start), with NCCLWATCH_STACK_ROUTE=signal, and automatically
//   when the ptrace route fails (no helper, ptrace refused, already traced).
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "trace/dump.h"
#include "watchdog/stack_helper.h"

namespace ncclwatch::watchdog {

struct DumpBounds {
  std::chrono::milliseconds perThread{200};   // each thread's answer to the stack signal
  std::chrono::milliseconds symbolize{1500};  // symbolizing all threads
  std::chrono::milliseconds python{1000};     // the Python stacks
  std::chrono::milliseconds helper{3000};     // the ptrace helper, killed past it
};

// At the watchdog's start, on the application thread: installs the stack signal
// (SIGRTMIN + stackSignalOffset) and prepares the Python route. False with `error` when the
// stack signal cannot be installed (dumps then carry no native stacks of other threads).
// `route` is NCCLWATCH_STACK_ROUTE; the signal is installed for every route (the fallback).
bool prepareDumps(int stackSignalOffset, std::string* error, StackRoute route = StackRoute::kAuto);

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
