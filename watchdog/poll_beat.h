// When the watchdog polls next. Every agent of a host polls on the same beat of the host's
// monotonic clock (multiples of the poll interval): its frames then reach the host's relay
// within a millisecond or so of the others', and the relay sends them to the collector in one
// write (tools/relay.h, kGatherNs), instead of one write, read and TCP segment per agent frame.
// Hosts' monotonic clocks start at their boots, so hosts stay spread over the interval.
#pragma once
#include <cstdint>

namespace ncclwatch::watchdog {

// Milliseconds from `monotonicNs` to the next multiple of `periodMs` (1 to periodMs: a poll
// that ends on a beat waits for the next one, not zero).
inline int msToNextBeat(int64_t monotonicNs, int periodMs) {
  if (periodMs <= 1 || monotonicNs < 0) return periodMs < 1 ? 1 : periodMs;
  const int64_t periodNs = int64_t{periodMs} * 1'000'000;
  int64_t leftNs = periodNs - monotonicNs % periodNs;
  int ms = static_cast<int>((leftNs + 999'999) / 1'000'000);
  return ms < 1 ? 1 : ms;
}

}  // namespace ncclwatch::watchdog
