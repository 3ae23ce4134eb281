#include "watchdog/progress_source.h"

#include <atomic>
#include <cinttypes>
#include <cstdio>

namespace ncclwatch::watchdog {
namespace {

std::atomic<ProgressSource*> g_source{nullptr};

const char* kernelText(trace::KernelState state) {
  switch (state) {
    case trace::KernelState::kNotStarted:
      return "kernel not started";
    case trace::KernelState::kRunning:
      return "kernel running";
    case trace::KernelState::kStopped:
      return "kernel finished";
    case trace::KernelState::kUnknown:
      break;
  }
  return "kernel state unknown";
}

}  // namespace

void setProgressSource(ProgressSource* source) {
  g_source.store(source, std::memory_order_release);
}

ProgressSource* progressSource() {
  return g_source.load(std::memory_order_acquire);
}

std::string describeWait(const trace::WaitNote& note, int64_t nowNs) {
  char text[256];
  int used = std::snprintf(text, sizeof text, "%s", kernelText(note.kernel));
  if (note.kernel != trace::KernelState::kUnknown && note.nChannels > 0) {
    used += std::snprintf(text + used, sizeof text - used, " (%u of %u channels started",
                          note.channelsStarted, note.nChannels);
    if (note.channelsStopped > 0) {
      used += std::snprintf(text + used, sizeof text - used, ", %u finished", note.channelsStopped);
    }
    used += std::snprintf(text + used, sizeof text - used, ")");
  }
  double seconds = note.sinceNs > 0 && nowNs > note.sinceNs
                       ? static_cast<double>(nowNs - note.sinceNs) / 1e9
                       : 0.0;
  const char* state = trace::proxyStepStateName(note.stepState);
  if (note.step >= 0 && state[0] != '\0') {
    std::snprintf(text + used, sizeof text - used,
                  "; channel %d proxy step %d %s %s peer %d for %.1f s", note.channel, note.step,
                  state, note.isSend ? "toward" : "from", note.peer, seconds);
  } else if (note.channel >= 0) {
    std::snprintf(text + used, sizeof text - used, "; channel %d, no proxy step pending (%.1f s)",
                  note.channel, seconds);
  }
  return text;
}

}  // namespace ncclwatch::watchdog
