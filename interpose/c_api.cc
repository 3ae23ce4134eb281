// The small C API of libncclwatch.so, prefixed ncclwatch.
#include "interpose/recorder.h"

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
