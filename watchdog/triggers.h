// What makes the watchdog dump besides a hang: SIGTERM (torchrun's way of stopping survivors),
// fatal signals (SIGSEGV, SIGBUS, SIGABRT, SIGFPE), a signal named by NCCLWATCH_DUMP_SIGNAL and
// an explicit request through the C API.
//
// The handlers do only async-signal-safe work: note the request in atomics, wake the watchdog
// through a pipe, and (for SIGTERM and fatal signals) wait a bounded time for its dump before
// behaving exactly as the process would have without ncclwatch: chain to the previous handler,
// or restore the previous action and re-raise, so that the exit status and core dump stay.
// Only the first SIGTERM, and the first of each fatal signal, asks for a dump: a launcher that
// repeats SIGTERM, or a program whose own handler recovers from its faults (a guard page),
// pays for one dump at most. A program handler that returns from a fatal signal clears the
// trace's note of it: the process lived on.
#pragma once
#include <cstdint>

#include "trace/ring_writer.h"

namespace ncclwatch::watchdog {

enum class DumpTrigger : int { kNone = 0, kSigterm, kFatalSignal, kSignal, kRequest };

const char* triggerName(DumpTrigger trigger);

struct TriggerOptions {
  int dumpSignal = 0;        // 0: none
  int waitMs = 3000;         // how long SIGTERM and fatal signals wait for the dump
  bool fatalSignals = true;  // SIGSEGV, SIGBUS, SIGABRT, SIGFPE
  bool sigterm = true;
};

class Triggers {
 public:
  // On the application thread at the watchdog's start: the pipe the watchdog polls and the
  // handlers. `writer` receives the fatal signal's note. Idempotent per process.
  static bool install(trace::RingWriter* writer, const TriggerOptions& options);
  // The watchdog thread: a fatal signal there does not wait for a dump it would have to take.
  static void setWatchdogThread(int tid);
  // The pipe's read end, for the watchdog's poll(); -1 before install.
  static int wakeFd();
  // Drains the pipe.
  static void drainWake();
  // Wakes the watchdog (e.g. to stop); async-signal-safe.
  static void wake();

  // The oldest unanswered request: its trigger and the signal behind it; kNone when none.
  // `generation` identifies it for done().
  static DumpTrigger pending(int* signal, uint64_t* generation);
  // The watchdog finished the dump that answers every request up to `generation`.
  static void done(uint64_t generation);

  // A dump requested from any thread (not a handler): waits at most `waitMs` for it. False on
  // timeout or when no watchdog runs.
  static bool requestAndWait(int waitMs);

  // In a fork child: requests go nowhere until the child starts its own watchdog.
  static void forgetAfterFork();
};

}  // namespace ncclwatch::watchdog
