#include "watchdog/progress_source.h"

#include <atomic>

namespace ncclwatch::watchdog {
namespace {

std::atomic<ProgressSource*> g_source{nullptr};

}  // namespace

void setProgressSource(ProgressSource* source) {
  g_source.store(source, std::memory_order_release);
}

ProgressSource* progressSource() {
  return g_source.load(std::memory_order_acquire);
}

}  // namespace ncclwatch::watchdog
