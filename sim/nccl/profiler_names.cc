#include "profiler_names.h"

#include <strings.h>

#include <cstring>

namespace ncclsim {
namespace {

// NCCL compares with strncasecmp(name, "STATIC_PLUGIN", strlen(name)), so any case-insensitive
// prefix ("s", "Static") also selects the global scope; we keep that quirk on purpose.
std::optional<std::string> openName(const std::string& name) {
  if (strncasecmp(name.c_str(), "STATIC_PLUGIN", name.size()) == 0) return std::nullopt;
  return name;
}

bool endsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

ProfilerPluginPlan planProfilerPluginLoad(const char* envValue) {
  ProfilerPluginPlan plan;
  const std::string name = envValue ? envValue : "";
  if (strcasecmp(name.c_str(), "none") == 0) {
    plan.disabled = true;
    return plan;
  }
  if (name.empty()) {
    plan.candidates.push_back(std::string("libnccl-profiler.so"));
    return plan;
  }
  plan.candidates.push_back(openName(name));
  const bool looksLikeLibraryFile = name.rfind("lib", 0) == 0 && endsWith(name, ".so");
  if (name.find('/') == std::string::npos && !looksLikeLibraryFile) {
    plan.candidates.push_back(openName("libnccl-profiler-" + name + ".so"));
  }
  return plan;
}

}  // namespace ncclsim
