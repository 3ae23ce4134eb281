// CPU seconds of this process, for the benches' per-record and per-pass figures: on a shared
// machine the wall clock also counts other programs' time slices, the CPU time does not.
#pragma once
#include <ctime>

namespace ncclwatch::bench {

inline double processCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

}  // namespace ncclwatch::bench
