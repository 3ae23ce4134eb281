#pragma once
#include <chrono>

namespace ncclsim {

constexpr int kWaitSliceMs = 200;

template <typename Ready, typename OnSlowWait>
bool waitOnSegment(ncclComm* comm, const std::atomic<bool>& cancel, Ready ready,
                   OnSlowWait onSlowWait) {
  const auto start = std::chrono::steady_clock::now();
  bool reported = false;
  for (;;) {
    const uint32_t seen = comm->segment.wakeValue();
    if (ready()) return true;
    if (cancel.load(std::memory_order_acquire)) return false;
    if (!reported && simConfig().debug) {
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited >= std::chrono::milliseconds(simConfig().debugWaitMs)) {
        reported = true;
        onSlowWait();
      }
    }
    int sliceMs = kWaitSliceMs;
    if (!reported && simConfig().debug) {
      const auto left = std::chrono::milliseconds(simConfig().debugWaitMs) -
                        std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start);
      if (left.count() > 0 && left.count() < sliceMs) sliceMs = static_cast<int>(left.count()) + 1;
    }
    comm->segment.sleep(seen, sliceMs);
  }
}

}  // namespace ncclsim
