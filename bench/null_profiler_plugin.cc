// A profiler plugin that asks NCCL for the same events as ncclwatch and does nothing with them:
// the baseline that separates NCCL's (here: the sim's) own cost of emitting profiler events
// from ncclwatch's cost of handling them (bench/overhead.sh).
#include <cstdint>

#include "plugin/abi/profiler_abi.h"

namespace {

namespace abi = nccl_profiler_abi;

int gContext;

ncclResult_t init(void** context, uint64_t, int* mask, const char*, int, int, int,
                  abi::DebugLogger) {
  *context = &gContext;
  // ncclwatch's default mask (plugin/recording.cc activationMask()).
  *mask = abi::kGroupApi | abi::kCollApi | abi::kP2pApi | abi::kColl | abi::kP2p | abi::kKernelCh |
          abi::kProxyOp | abi::kProxyStep;
  return ncclSuccess;
}
ncclResult_t start(void* context, void** handle, abi::EventDescr*) {
  *handle = context;
  return ncclSuccess;
}
ncclResult_t stop(void*) {
  return ncclSuccess;
}
ncclResult_t state(void*, int, abi::StateArgs*) {
  return ncclSuccess;
}
ncclResult_t finalize(void*) {
  return ncclSuccess;
}

}  // namespace

extern "C" {
__attribute__((visibility("default")))
abi::ProfilerV5 ncclProfiler_v5 = {"null", init, start, stop, state, finalize};
}
