// Loads NCCL_PROFILER_PLUGIN the way NCCL 2.28 does (reference §3.1) and calls its per-comm
// init/finalize. Events are not emitted yet (a later issue); see docs/sim.md.
#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "internal.h"
#include "profiler_names.h"

namespace ncclsim {
namespace {

// From reference §1.2 and §1.5: the log callback and the v5 function table. Event descriptors
// only travel as pointers here, so they stay opaque until events are emitted.
typedef enum {
  kLogNone = 0,
  kLogVersion = 1,
  kLogWarn = 2,
  kLogInfo = 3,
  kLogAbort = 4,
  kLogTrace = 5
} DebugLogLevel;
typedef void (*DebugLogger)(DebugLogLevel level, unsigned long flags, const char* file, int line,
                            const char* fmt, ...);

struct ProfilerV5 {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, DebugLogger logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, void* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, int eState, void* eStateArgs);
  ncclResult_t (*finalize)(void* context);
};

enum class LoadState { kNotLoaded, kLoaded, kFailed };

struct ProfilerPlugin {
  std::mutex mutex;
  LoadState state = LoadState::kNotLoaded;
  void* library = nullptr;
  ProfilerV5* table = nullptr;
  int references = 0;
};

ProfilerPlugin* gPlugin = new ProfilerPlugin;  // leaked: comms may be freed during exit

// NCCL passes one process-wide mask to every init; plugins may change it at any time.
int gEventActivationMask = 0;

int debugLevel() {
  const char* level = std::getenv("NCCL_DEBUG");
  if (!level) return kLogNone;
  std::string text = level;
  if (text == "VERSION") return kLogVersion;
  if (text == "WARN") return kLogWarn;
  if (text == "INFO") return kLogInfo;
  if (text == "TRACE") return kLogTrace;
  return kLogNone;
}

void pluginLog(DebugLogLevel level, unsigned long flags, const char* file, int line,
               const char* fmt, ...) {
  (void)flags;
  if (level > debugLevel()) return;
  std::fprintf(stderr, "ncclsim: NCCL %s:%d ", file ? file : "?", line);
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fputc('\n', stderr);
}

void info(const std::string& text) {
  if (debugLevel() >= kLogInfo || simConfig().debug)
    std::fprintf(stderr, "ncclsim: %s\n", text.c_str());
}

// Returns true with the plugin's table loaded; false marks loading failed for good (NCCL never
// retries a failed load).
bool loadPlugin(ProfilerPlugin& plugin) {
  const char* env = std::getenv("NCCL_PROFILER_PLUGIN");
  const ProfilerPluginPlan plan = planProfilerPluginLoad(env);
  if (plan.disabled) return false;
  std::string tried;
  for (const auto& candidate : plan.candidates) {
    plugin.library = dlopen(candidate ? candidate->c_str() : nullptr, RTLD_NOW | RTLD_LOCAL);
    if (plugin.library) break;
    tried += " " + (candidate ? *candidate : std::string("(global scope)"));
  }
  if (!plugin.library) {
    info("PROFILER/Plugin: Could not find:" + tried);
    return false;
  }
  plugin.table = static_cast<ProfilerV5*>(dlsym(plugin.library, "ncclProfiler_v5"));
  if (plugin.table) {
    info(std::string("PROFILER/Plugin: Loaded ") + (plugin.table->name ? plugin.table->name : "?") +
         " (v5)");
    return true;
  }
  for (const char* older :
       {"ncclProfiler_v4", "ncclProfiler_v3", "ncclProfiler_v2", "ncclProfiler_v1"}) {
    if (dlsym(plugin.library, older)) {
      // The sim only drives the v5 table; older ones are recognised so the reason is clear.
      std::fprintf(
          stderr, "ncclsim: profiler plugin exports only %s; the sim drives ncclProfiler_v5 only\n",
          older);
      dlclose(plugin.library);
      plugin.library = nullptr;
      return false;
    }
  }
  info("External profiler plugin is unsupported (no ncclProfiler_v5..v1)");
  dlclose(plugin.library);
  plugin.library = nullptr;
  return false;
}

}  // namespace

void profilerAttach(ncclComm* comm) {
  ProfilerPlugin& plugin = *gPlugin;
  std::lock_guard<std::mutex> lock(plugin.mutex);
  if (plugin.state == LoadState::kFailed) return;
  if (plugin.state == LoadState::kNotLoaded) {
    if (!loadPlugin(plugin)) {
      plugin.state = LoadState::kFailed;
      return;
    }
    plugin.state = LoadState::kLoaded;
  }
  ++plugin.references;
  comm->profilerAttached = true;
  void* context = nullptr;
  const ncclResult_t result =
      plugin.table->init(&context, comm->commHash, &gEventActivationMask,
                         comm->commName.empty() ? nullptr : comm->commName.c_str(), 1, comm->nranks,
                         comm->rank, pluginLog);
  // NCCL 2.28 only logs a failed init and carries on with whatever context the plugin wrote.
  if (result != ncclSuccess)
    info("Profiler init failed; continuing without profiler for this communicator");
  comm->profilerContext = context;
}

void profilerDetach(ncclComm* comm) {
  if (!comm->profilerAttached) return;
  ProfilerPlugin& plugin = *gPlugin;
  std::lock_guard<std::mutex> lock(plugin.mutex);
  comm->profilerAttached = false;
  if (comm->profilerContext) plugin.table->finalize(comm->profilerContext);
  comm->profilerContext = nullptr;
  if (--plugin.references == 0) {
    // Like NCCL: close at the last communicator; the next init loads it afresh.
    dlclose(plugin.library);
    plugin.library = nullptr;
    plugin.table = nullptr;
    plugin.state = LoadState::kNotLoaded;
  }
}

void profilerResetAfterFork() {
  // The parent's communicators do not exist in the child: start from "not loaded". The library
  // stays mapped; loading it again only bumps the loader's count.
  gPlugin = new ProfilerPlugin;
}

}  // namespace ncclsim
