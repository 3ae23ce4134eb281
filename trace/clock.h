// CLOCK_MONOTONIC nanoseconds for the hot path. clock_gettime costs ~20-30 ns even through the
// vDSO (more in VMs); reading the TSC costs a third of that. Once the watchdog thread has
// calibrated a TSC→ns line against clock_gettime, nowNs() extrapolates that line; until then,
// and on machines without an invariant TSC, it is clock_gettime itself.
#pragma once
#include <cstdint>

namespace ncclwatch::trace {

// clock_gettime(CLOCK_MONOTONIC) in nanoseconds.
int64_t monotonicNs();

class FastClock {
 public:
  // CLOCK_MONOTONIC now: exact to well under a microsecond once calibrated, never stepping
  // backwards within one thread (each new line starts where the previous one was).
  static int64_t nowNs();
  // From one thread, every few tens of ms or more (the watchdog's poll): refines the line. The
  // first line is published after 20 ms of samples; later ones track NTP's slewing of the
  // monotonic clock over a window of about 2 s.
  static void calibrate();
  // Whether nowNs() currently extrapolates the TSC (false: clock_gettime).
  static bool calibrated();
  // For tests: forget the line (nowNs() falls back to clock_gettime until recalibrated).
  static void reset();
};

}  // namespace ncclwatch::trace
