// The hot path's clock: CLOCK_MONOTONIC, from a calibrated TSC line where the machine has an
// invariant TSC and from clock_gettime otherwise; never stepping back as lines are refined.
#include "trace/clock.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

namespace {

using ncclwatch::trace::FastClock;
using ncclwatch::trace::monotonicNs;

// Calibrates as the watchdog does: every 10 ms for `duration`.
void calibrateFor(std::chrono::milliseconds duration) {
  auto end = std::chrono::steady_clock::now() + duration;
  while (std::chrono::steady_clock::now() < end) {
    FastClock::calibrate();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST(FastClock, UncalibratedIsClockGettime) {
  FastClock::reset();
  EXPECT_FALSE(FastClock::calibrated());
  int64_t before = monotonicNs();
  int64_t now = FastClock::nowNs();
  int64_t after = monotonicNs();
  EXPECT_LE(before, now);
  EXPECT_LE(now, after);
}

TEST(FastClock, TracksTheMonotonicClockOnceCalibrated) {
  FastClock::reset();
  calibrateFor(std::chrono::milliseconds(120));
  // Where the kernel itself trusts the TSC a line exists by now; elsewhere the fallback holds.
  // Either way nowNs() must agree with clock_gettime: bracket it, many times, and allow the
  // line a few microseconds of error (a VM's preemption can widen a bracket, so the median
  // error is what is bounded).
  std::vector<int64_t> errors;
  for (int i = 0; i < 2000; ++i) {
    int64_t before = monotonicNs();
    int64_t now = FastClock::nowNs();
    int64_t after = monotonicNs();
    int64_t error = now < before ? before - now : (now > after ? now - after : 0);
    errors.push_back(error);
  }
  std::sort(errors.begin(), errors.end());
  EXPECT_LT(errors[errors.size() / 2], 5'000) << "median error in ns";
  EXPECT_LT(errors[errors.size() * 9 / 10], 50'000) << "90th percentile error in ns";
}

TEST(FastClock, NeverStepsBackAcrossRecalibrations) {
  FastClock::reset();
  int64_t last = FastClock::nowNs();
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  int calibrations = 0;
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 1000; ++i) {
      int64_t now = FastClock::nowNs();
      ASSERT_GE(now, last);
      last = now;
    }
    FastClock::calibrate();
    ++calibrations;
  }
  EXPECT_GT(calibrations, 10);
}

}  // namespace
