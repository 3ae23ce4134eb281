// The plugin role of libncclwatch.so, as the rest of the library sees it: whether it is on,
// its counters, the progress source it hands the watchdog, and the one-time notes about how
// NCCL reaches us.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

namespace ncclwatch::plugin {

struct PluginCounters {
  std::atomic<uint64_t> unrecorded{0};       // operations with no communicator or no op name
  std::atomic<uint64_t> foreignProxyOps{0};  // PXN proxy ops of other processes (not linked)
  // Combined mode: operations NCCL launched that no wrapper's record could be found for (their
  // API event got no call slot, or a group launched them after the slot was swept). The
  // interposer's record of the call stands, without NCCL's kernel progress.
  std::atomic<uint64_t> unjoined{0};
};
PluginCounters& counters();

// NCCLWATCH_PLUGIN (auto, on, off) and NCCLWATCH_ENABLE: whether the plugin role records.
bool pluginEnabled();

// Registers the plugin's progress source with the watchdog (once, at the first init).
void startProgressSource();

// Under LD_PRELOAD, said once: NCCL's calls do not reach our wrappers (NCCL linked
// statically or deep-bound), the profiler plugin records them instead.
void noteBypassedInterposer();

// A line to print when the recorder starts (how the plugin was or was not offered to NCCL),
// empty when there is nothing to say. Taken once.
std::string takeStartupNote();

}  // namespace ncclwatch::plugin
