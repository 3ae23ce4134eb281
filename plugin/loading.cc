// How NCCL comes to load this library as its profiler plugin. Under LD_PRELOAD the library
// offers itself (NCCLWATCH_PLUGIN=auto, the default): NCCL_PROFILER_PLUGIN is set to our own
// absolute path when it is unset, so that NCCL's loader opens the very object already loaded
// and one library plays both roles. NCCL loads one profiler plugin only: when the user named
// another, we leave it and say what each choice costs.
#include <dlfcn.h>
#include <limits.h>
#include <strings.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "plugin/abi/profiler_abi.h"
#include "plugin/plugin.h"

extern "C" nccl_profiler_abi::ProfilerV5 ncclProfiler_v5;

namespace ncclwatch::plugin {
namespace {

enum class PluginSetting { kAuto, kOn, kOff };

PluginSetting setting() {
  const char* text = std::getenv("NCCLWATCH_PLUGIN");
  if (text == nullptr || *text == '\0' || strcasecmp(text, "auto") == 0)
    return PluginSetting::kAuto;
  if (strcasecmp(text, "on") == 0) return PluginSetting::kOn;
  if (strcasecmp(text, "off") == 0) return PluginSetting::kOff;
  return PluginSetting::kAuto;
}

bool recordingSwitchedOff() {
  const char* text = std::getenv("NCCLWATCH_ENABLE");
  return text != nullptr && (std::strcmp(text, "0") == 0 || strcasecmp(text, "off") == 0 ||
                             strcasecmp(text, "no") == 0 || strcasecmp(text, "false") == 0);
}

// Loaded into the global scope (LD_PRELOAD or RTLD_GLOBAL) rather than by NCCL's RTLD_LOCAL
// plugin loader: then our wrappers interpose the NCCL API.
// (The main program's handle searches the global scope only; RTLD_DEFAULT would also search
// the caller's own local scope and always find us.)
bool inGlobalScope() {
  void* global = dlopen(nullptr, RTLD_LAZY);
  if (global == nullptr) return false;
  bool ours = dlsym(global, "ncclProfiler_v5") == static_cast<void*>(&ncclProfiler_v5);
  dlclose(global);
  return ours;
}

std::string ownPath() {
  Dl_info info{};
  if (dladdr(static_cast<void*>(&ncclProfiler_v5), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  char resolved[PATH_MAX];
  return realpath(info.dli_fname, resolved) != nullptr ? resolved : info.dli_fname;
}

bool samePath(const char* a, const std::string& b) {
  char resolved[PATH_MAX];
  return realpath(a, resolved) != nullptr && b == resolved;
}

char g_startupNote[512];
std::atomic<bool> g_noteTaken{false};

// Runs when the dynamic loader maps the library: before main under LD_PRELOAD, long before
// NCCL reads NCCL_PROFILER_PLUGIN at its first communicator init. Only getenv, dlsym, dladdr
// and setenv: nothing that can block.
__attribute__((constructor)) void offerPluginToNccl() {
  if (!inGlobalScope() || recordingSwitchedOff() || setting() == PluginSetting::kOff) return;
  std::string self = ownPath();
  if (self.empty()) return;
  const char* named = std::getenv("NCCL_PROFILER_PLUGIN");
  if (named == nullptr || *named == '\0') {
    setenv("NCCL_PROFILER_PLUGIN", self.c_str(), 1);
    return;
  }
  if (strcasecmp(named, "none") == 0 || samePath(named, self)) return;
  std::snprintf(g_startupNote, sizeof g_startupNote,
                "NCCL_PROFILER_PLUGIN=%s: NCCL loads one profiler plugin, so ncclwatch records "
                "through LD_PRELOAD only (no kernel or proxy progress for stuck calls, and no "
                "calls of a statically linked NCCL); unset it to give ncclwatch that role and "
                "lose that plugin's output",
                named);
}

}  // namespace

bool pluginEnabled() {
  return !recordingSwitchedOff() && setting() != PluginSetting::kOff;
}

void noteBypassedInterposer() {
  static std::atomic<bool> said{false};
  if (!inGlobalScope() || said.exchange(true)) return;
  std::fprintf(stderr,
               "[ncclwatch] NCCL's calls in this process do not reach the LD_PRELOAD wrappers "
               "(NCCL linked statically or deep-bound): recording through NCCL's profiler "
               "plugin instead (no reduction ops or call sites in the records)\n");
}

std::string takeStartupNote() {
  if (g_startupNote[0] == '\0' || g_noteTaken.exchange(true)) return "";
  return g_startupNote;
}

}  // namespace ncclwatch::plugin
