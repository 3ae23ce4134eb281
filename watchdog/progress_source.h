// A second source of call progress beside the CUDA-event CompletionTracker: the profiler
// plugin, whose KernelCh events tell when NCCL's kernel started and stopped and whose proxy
// events tell where an operation waits. The watchdog thread polls it every pass, right after
// the tracker, so that every state change of a record happens on that one thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trace/ring_format.h"
#include "watchdog/completion.h"

namespace ncclwatch::watchdog {

class ProgressSource {
 public:
  virtual ~ProgressSource() = default;
  // Applies new starts and completions to the ring and refreshes progress(). `nowNs` is the
  // monotonic clock.
  virtual void poll(int64_t nowNs) = 0;
  // The communicators whose calls this source tracks (those the tracker does not), as of the
  // last poll.
  virtual const std::vector<CommProgress>& progress() const = 0;
  // Where this process's pending calls wait inside NCCL, newest state, as of the last poll.
  virtual const std::vector<trace::WaitNote>& waits() const = 0;
};

// The source the agent polls; set once by the plugin (before or after the agent starts).
void setProgressSource(ProgressSource* source);
ProgressSource* progressSource();

}  // namespace ncclwatch::watchdog
