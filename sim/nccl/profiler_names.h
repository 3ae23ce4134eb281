// Which libraries NCCL 2.28 tries to dlopen for NCCL_PROFILER_PLUGIN (reference §3.1), as a pure
// function so that the rules are unit-tested apart from dlopen.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace ncclsim {

struct ProfilerPluginPlan {
  bool disabled = false;  // NCCL_PROFILER_PLUGIN=none (any case)
  // dlopen names in order; std::nullopt means dlopen(NULL), the global scope (STATIC_PLUGIN).
  std::vector<std::optional<std::string>> candidates;
};

// envValue is NCCL_PROFILER_PLUGIN, or nullptr when unset.
ProfilerPluginPlan planProfilerPluginLoad(const char* envValue);

}  // namespace ncclsim
