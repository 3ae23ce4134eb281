#include "trace/clock.h"

#include <time.h>

#include <atomic>
#include <cstdio>
#include <cstring>

namespace ncclwatch::trace {
namespace {

using detail::ClockLine;
constexpr ClockLine& g_line = detail::g_clockLine;

// Calibration state, touched only by the calibrating thread.
struct Calibration {
  bool checked = false;
  bool usable = false;
  uint64_t anchorTsc = 0;
  int64_t anchorNs = 0;
  uint32_t published = 0;
};
Calibration g_calibration;

constexpr int64_t kFirstLineNs = 20'000'000;  // 20 ms of samples before the first line
constexpr int64_t kWindowNs = 2'000'000'000;  // later lines: the slope over the last ~2 s

#if defined(__x86_64__)
uint64_t readTsc() {
  return __rdtsc();
}

// An invariant TSC (constant rate, running in every C-state) that the kernel itself trusts as
// its clocksource; anything else keeps clock_gettime.
bool tscIsInvariant() {
  bool constant = false, nonstop = false;
  if (FILE* cpuinfo = std::fopen("/proc/cpuinfo", "r")) {
    char line[4096];
    while (std::fgets(line, sizeof line, cpuinfo) != nullptr) {
      if (std::strncmp(line, "flags", 5) != 0) continue;
      constant = std::strstr(line, " constant_tsc") != nullptr;
      nonstop = std::strstr(line, " nonstop_tsc") != nullptr;
      break;
    }
    std::fclose(cpuinfo);
  }
  char source[64] = {};
  if (FILE* file =
          std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r")) {
    if (std::fgets(source, sizeof source, file) == nullptr) source[0] = '\0';
    std::fclose(file);
  }
  return constant && nonstop && std::strncmp(source, "tsc", 3) == 0;
}
#else
uint64_t readTsc() {
  return 0;
}
bool tscIsInvariant() {
  return false;
}
#endif

// One (tsc, ns) pair: the TSC read midway around clock_gettime, retried when a preemption
// made the bracket wide.
void samplePair(uint64_t* tsc, int64_t* ns) {
  uint64_t bestWidth = UINT64_MAX;
  for (int attempt = 0; attempt < 5; ++attempt) {
    uint64_t before = readTsc();
    int64_t now = monotonicNs();
    uint64_t after = readTsc();
    if (after - before < bestWidth) {
      bestWidth = after - before;
      *tsc = before + (after - before) / 2;
      *ns = now;
    }
  }
}

int64_t extrapolate(uint64_t tsc, uint64_t baseTsc, int64_t baseNs, uint64_t multQ32) {
  unsigned __int128 scaled = static_cast<unsigned __int128>(tsc - baseTsc) * multQ32;
  return baseNs + static_cast<int64_t>(scaled >> 32);
}

}  // namespace

int64_t monotonicNs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

bool FastClock::calibrated() {
  uint32_t version = g_line.version.load(std::memory_order_acquire);
  return version != 0 && (version & 1u) == 0;
}

void FastClock::calibrate() {
  Calibration& c = g_calibration;
  if (!c.checked) {
    c.checked = true;
    c.usable = tscIsInvariant();
    if (c.usable) samplePair(&c.anchorTsc, &c.anchorNs);
    return;
  }
  if (!c.usable) return;
  uint64_t tsc;
  int64_t ns;
  samplePair(&tsc, &ns);
  int64_t span = ns - c.anchorNs;
  if (span < kFirstLineNs || tsc <= c.anchorTsc) return;
  uint64_t multQ32 =
      static_cast<uint64_t>((static_cast<unsigned __int128>(span) << 32) / (tsc - c.anchorTsc));
  // The new line starts at the measured pair, or where the old line already is if that is
  // later: time read through nowNs() never steps back.
  int64_t baseNs = ns;
  uint32_t version = g_line.version.load(std::memory_order_relaxed);
  if (version != 0) {
    int64_t old = extrapolate(tsc, g_line.baseTsc.load(std::memory_order_relaxed),
                              g_line.baseNs.load(std::memory_order_relaxed),
                              g_line.multQ32.load(std::memory_order_relaxed));
    if (old > baseNs) baseNs = old;
  }
  g_line.version.store(version + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  g_line.baseTsc.store(tsc, std::memory_order_relaxed);
  g_line.baseNs.store(baseNs, std::memory_order_relaxed);
  g_line.multQ32.store(multQ32, std::memory_order_relaxed);
  g_line.version.store(version + 2, std::memory_order_release);
  if (span > kWindowNs) {  // slide the window: the next slope reflects the recent rate
    c.anchorTsc = tsc;
    c.anchorNs = ns;
  }
  ++c.published;
}

void FastClock::reset() {
  g_line.version.store(0, std::memory_order_release);
  g_calibration = Calibration{};
}

}  // namespace ncclwatch::trace
