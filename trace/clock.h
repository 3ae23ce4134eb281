// CLOCK_MONOTONIC nanoseconds for the hot path. clock_gettime costs ~20-30 ns even through the
// vDSO (more in VMs); reading the TSC costs a third of that. Once the watchdog thread has
// calibrated a TSC→ns line against clock_gettime, nowNs() extrapolates that line; until then,
// and on machines without an invariant TSC, it is clock_gettime itself.
#pragma once
#include <atomic>
#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace ncclwatch::trace {

// clock_gettime(CLOCK_MONOTONIC) in nanoseconds.
int64_t monotonicNs();

namespace detail {
// The published line: ns = baseNs + ((tsc - baseTsc) * multQ32) >> 32, under a seqlock whose
// version is 0 while no line exists and odd while one is being written. One cache line of its
// own: the hot path reads it on every call, the calibrating thread writes it every poll.
struct alignas(64) ClockLine {
  std::atomic<uint32_t> version{0};
  std::atomic<uint64_t> baseTsc{0};
  std::atomic<int64_t> baseNs{0};
  std::atomic<uint64_t> multQ32{0};
};
// Constant-initialized: valid from the first instruction of the process to its last.
inline ClockLine g_clockLine;
}  // namespace detail

class FastClock {
 public:
  // CLOCK_MONOTONIC now: exact to well under a microsecond once calibrated, never stepping
  // backwards within one thread (each new line starts where the previous one was). Inline: the
  // recorder reads it on every call (one version load, the TSC, three loads, the version again).
  static int64_t nowNs() {
#if defined(__x86_64__)
    const detail::ClockLine& line = detail::g_clockLine;
    uint32_t before = line.version.load(std::memory_order_acquire);
    // No line yet (0) or one being written (odd): both leave the low bit or all bits clear.
    if (__builtin_expect((before & 1u) != 0 || before == 0, 0)) return monotonicNs();
    uint64_t tsc = __rdtsc();
    uint64_t baseTsc = line.baseTsc.load(std::memory_order_relaxed);
    int64_t baseNs = line.baseNs.load(std::memory_order_relaxed);
    uint64_t multQ32 = line.multQ32.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (__builtin_expect(line.version.load(std::memory_order_relaxed) != before || tsc < baseTsc,
                         0)) {
      return monotonicNs();
    }
    unsigned __int128 scaled = static_cast<unsigned __int128>(tsc - baseTsc) * multQ32;
    return baseNs + static_cast<int64_t>(scaled >> 32);
#else
    return monotonicNs();
#endif
  }
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
