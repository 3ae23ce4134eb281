// `ncclwatch stacks-of PID`: the native stacks of every thread of another process, taken from
// outside with ptrace so that the process sees no signal.
//
// Each thread in turn is attached with PTRACE_SEIZE and stopped with PTRACE_INTERRUPT (no
// SIGSTOP: the kernel restarts an interrupted sleep transparently, nanosleep keeps its full
// length), its registers are read, it is unwound with elfutils' libdwfl (CFI from .eh_frame or
// .debug_frame, memory read from the stopped thread), and it is detached at once. Then every
// frame is symbolized (function, module, offset, GNU build-id). A thread is stopped for the
// time of its own unwind only; if this process dies, the kernel detaches every thread.
//
// The output is an `ncclwatch-dump 1` block (docs/format.md) whose threads and frames the
// agent takes as the native part of its dump unchanged.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <ostream>
#include <string>

#include "trace/dump.h"

namespace ncclwatch::stacks_of {

struct Options {
  pid_t pid = 0;
  // The agent sets PR_SET_PTRACER to our pid after spawning us, then writes one byte on our
  // stdin: attach only after that byte (or end of input).
  bool waitForGo = false;
  std::chrono::milliseconds perThread{200};  // how long one thread may take to stop
  int maxThreads = 512;
  int maxFrames = 64;
};

// Whether this build can take remote stacks at all (it has libdwfl).
bool available();

// Fills `dump` (trigger "stacks-of") with every thread of `options.pid`. False with a one-line
// `why` when no thread could be attached (not permitted, already traced, no such process).
bool takeRemoteStacks(const Options& options, trace::Dump* dump, std::string* why);

// The subcommand: prints the block on `out`; 0 on success, 3 when ptrace is not possible (the
// reason on `err`), 2 on bad arguments.
int run(const Options& options, std::ostream& out, std::ostream& err);

}  // namespace ncclwatch::stacks_of
