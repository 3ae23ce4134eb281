#include "interpose/forward.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>

namespace ncclwatch::interpose {

void* resolveReal(const char* realName) {
  if (void* function = dlsym(RTLD_NEXT, realName)) return function;
  if (void* handle = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD)) {
    void* function = dlsym(handle, realName);
    dlclose(handle);  // NOLOAD took a reference: give it back, NCCL stays loaded
    return function;
  }
  return nullptr;
}

void reportMissingNccl(const char* name) {
  static std::atomic<bool> reported{false};
  if (!reported.exchange(true)) {
    std::fprintf(stderr,
                 "[ncclwatch] %s: no dynamic libnccl.so.2 to forward to (is NCCL linked "
                 "statically into this program?); use NCCL_PROFILER_PLUGIN=libncclwatch.so "
                 "instead of LD_PRELOAD\n",
                 name);
  }
}

}  // namespace ncclwatch::interpose
