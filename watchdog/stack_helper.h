// Native stacks taken from outside the process: the watchdog runs `ncclwatch stacks-of <pid>`
// (tools/remote_stacks.h), which stops one thread at a time with ptrace (PTRACE_SEIZE +
// PTRACE_INTERRUPT: no signal, interrupted sleeps continue) and prints the threads' symbolized
// frames as a dump block. Nothing of the unwinder enters this library: the helper is a process
// of its own.
//
// The helper is started with clone(CLONE_VM | CLONE_VFORK) and no exit signal, so that the host
// gets no SIGCHLD (which would interrupt its own waits, where it handles SIGCHLD) and its own
// waitpid(-1) never reaps it; it is bounded and killed past its bound. When Yama's ptrace_scope
// is 1, PR_SET_PTRACER names the helper (and only it) for the time of the dump.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "trace/dump.h"

namespace ncclwatch::watchdog {

// NCCLWATCH_STACK_ROUTE: auto tries ptrace, then the signal; ptrace never sends the signal
// (a dump then has no native stacks when ptrace fails); signal is the in-process route only.
enum class StackRoute { kAuto, kPtrace, kSignal };

// Parses "auto", "ptrace", "signal"; false for anything else.
bool parseStackRoute(const char* text, StackRoute* route);

struct StackHelperSetup {
  std::string cli;                       // the ncclwatch binary
  std::vector<std::string> environment;  // the helper's, without our LD_PRELOAD
};

// On the application thread at the agent's start: where the helper is (NCCLWATCH_CLI, else
// bin/ncclwatch beside libncclwatch.so's lib/) and the environment it gets.
StackHelperSetup stackHelperFromEnvironment();

// On the watchdog thread: runs the helper on this process, waits at most `bound`, and fills
// `threads` with its threads. False with a one-line `why` (helper missing, ptrace refused and
// the helper's reason, timed out, unreadable output); the dump then falls back.
bool takeStacksThroughHelper(const StackHelperSetup& setup, std::chrono::milliseconds bound,
                             std::vector<trace::DumpThread>* threads, std::string* why);

}  // namespace ncclwatch::watchdog
