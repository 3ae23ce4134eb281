// A wall-clock step for a test job, without root: preloaded before libncclwatch.so, it moves
// CLOCK_REALTIME (clock_gettime, gettimeofday, time) by CLOCK_STEP_S seconds once
// CLOCK_STEP_AFTER_MS have passed since the process's first clock read, as an NTP step or an
// operator's `date -s` would. CLOCK_MONOTONIC is left alone. Says once on stderr when it stepped,
// so that a test knows the step happened inside the run.
#include <dlfcn.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

using ClockGettime = int (*)(clockid_t, timespec*);

ClockGettime realClockGettime() {
  static ClockGettime real = reinterpret_cast<ClockGettime>(dlsym(RTLD_NEXT, "clock_gettime"));
  return real;
}

int64_t envNumber(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::strtoll(text, nullptr, 10) : fallback;
}

// Seconds to add to the real time now: 0 until the step, CLOCK_STEP_S after.
int64_t offsetSeconds() {
  static const int64_t stepSeconds = envNumber("CLOCK_STEP_S", 0);
  static const int64_t afterMs = envNumber("CLOCK_STEP_AFTER_MS", 300);
  static std::atomic<int64_t> firstMs{-1};
  static std::atomic<bool> said{false};
  timespec now{};
  realClockGettime()(CLOCK_MONOTONIC, &now);
  int64_t nowMs = static_cast<int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1'000'000;
  int64_t expected = -1;
  firstMs.compare_exchange_strong(expected, nowMs);
  if (nowMs - firstMs.load() < afterMs) return 0;
  if (!said.exchange(true)) {
    char line[96];
    int length = std::snprintf(line, sizeof line, "clock_step_shim: realtime stepped by %lld s\n",
                               static_cast<long long>(stepSeconds));
    ssize_t ignored = write(STDERR_FILENO, line, static_cast<size_t>(length));
    (void)ignored;
  }
  return stepSeconds;
}

bool isRealtime(clockid_t clock) {
  return clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE || clock == CLOCK_TAI;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int clock_gettime(clockid_t clock, timespec* time) {
  int result = realClockGettime()(clock, time);
  if (result == 0 && isRealtime(clock)) time->tv_sec += offsetSeconds();
  return result;
}

__attribute__((visibility("default"))) int gettimeofday(struct timeval* time, void*) {
  timespec now{};
  int result = clock_gettime(CLOCK_REALTIME, &now);
  // glibc declares `time` nonnull, yet callers may pass null: a volatile copy is checked.
  struct timeval* volatile out = time;
  if (result == 0 && out != nullptr) {
    out->tv_sec = now.tv_sec;
    out->tv_usec = now.tv_nsec / 1000;
  }
  return result;
}

__attribute__((visibility("default"))) time_t time(time_t* out) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  if (out != nullptr) *out = now.tv_sec;
  return now.tv_sec;
}

}  // extern "C"
