// The small C API of libncclwatch.so, prefixed ncclwatch.
#include "interpose/recorder.h"
#include "watchdog/triggers.h"

#define NCCLWATCH_EXPORT extern "C" __attribute__((visibility("default")))

// The library's version, e.g. "0.1.0".
NCCLWATCH_EXPORT const char* ncclwatchVersion(void) {
  return NCCLWATCH_VERSION_STRING;
}

// The path of this process's trace file, or NULL while nothing has been recorded yet (the file
// is created at the first NCCL call) or when recording is off.
NCCLWATCH_EXPORT const char* ncclwatchTracePath(void) {
  try {
    ncclwatch::interpose::Recorder* recorder = ncclwatch::interpose::Recorder::existing();
    return recorder != nullptr ? recorder->tracePath() : nullptr;
  } catch (...) {
    return nullptr;
  }
}

// Takes a dump now: every thread's native and Python stacks into this process's trace file,
// and a summary on stderr. Waits at most `waitMs` (0 or less: 3000).
// Returns 0 when the dump was written, -1 when no watchdog runs yet (no communicator was
// created) or it did not finish in time. Safe from any thread but a signal handler.
NCCLWATCH_EXPORT int ncclwatchDump(int waitMs) {
  try {
    return ncclwatch::watchdog::Triggers::requestAndWait(waitMs > 0 ? waitMs : 3000) ? 0 : -1;
  } catch (...) {
    return -1;
  }
}
