// Host time NCCL spends in libncclwatch.so's profiler callbacks, per collective, measured
// against a plugin whose callbacks do nothing, in one run. This bench plays NCCL 2.28 (the v5
// table) and issues the event sequence NCCL emits for one ncclAllReduce with the default mask:
// GroupApi, CollApi, Coll (start and stop each), then KernelCh start, stop state and stop on
// each of two channels (NCCL's proxy thread emits those; here the same thread does).
//
//   plugin_callbacks [CALLS] [CHANNELS]   (default 200000 calls, 2 channels)
//
// Prints ns per call for both, and the difference. The records land in a ring under
// $TMPDIR/ncclwatch-plugin-bench; the watchdog thread polls completion as it would in a job.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "plugin/abi/profiler_abi.h"

namespace {

namespace abi = nccl_profiler_abi;

// The baseline: a plugin that returns at once (what NCCL costs with any plugin loaded).
ncclResult_t nullInit(void** context, uint64_t, int* mask, const char*, int, int, int,
                      abi::DebugLogger) {
  static int dummy;
  *context = &dummy;
  *mask = abi::kColl | abi::kKernelCh;
  return ncclSuccess;
}
ncclResult_t nullStart(void* context, void** handle, abi::EventDescr*) {
  *handle = context;
  return ncclSuccess;
}
ncclResult_t nullStop(void*) {
  return ncclSuccess;
}
ncclResult_t nullState(void*, int, abi::StateArgs*) {
  return ncclSuccess;
}
ncclResult_t nullFinalize(void*) {
  return ncclSuccess;
}
abi::ProfilerV5 nullPlugin = {"null", nullInit, nullStart, nullStop, nullState, nullFinalize};

// One ncclAllReduce's events through `table`.
void oneCall(abi::ProfilerV5& table, void* context, uint64_t seq, int channels) {
  abi::EventDescr group{};
  group.type = abi::kGroupApi;
  group.groupApi.groupDepth = 1;
  void* groupHandle = nullptr;
  table.startEvent(context, &groupHandle, &group);
  abi::EventDescr api{};
  api.type = abi::kCollApi;
  api.parentObj = groupHandle;
  api.collApi = {"AllReduce", 4096, "ncclFloat32", -1, reinterpret_cast<void*>(0x100), false, 0};
  void* apiHandle = nullptr;
  table.startEvent(context, &apiHandle, &api);
  table.stopEvent(apiHandle);
  abi::EventDescr coll{};
  coll.type = abi::kColl;
  coll.parentObj = apiHandle;
  coll.coll = {seq,
               "AllReduce",
               nullptr,
               nullptr,
               4096,
               -1,
               "ncclFloat32",
               static_cast<uint8_t>(channels),
               8,
               "RING",
               "SIMPLE",
               nullptr,
               nullptr,
               false,
               0};
  void* collHandle = nullptr;
  table.startEvent(context, &collHandle, &coll);
  table.stopEvent(collHandle);
  table.stopEvent(groupHandle);
  for (int channel = 0; channel < channels; ++channel) {
    abi::EventDescr kernel{};
    kernel.type = abi::kKernelCh;
    kernel.parentObj = collHandle;
    kernel.kernelCh.channelId = static_cast<uint8_t>(channel);
    void* kernelHandle = nullptr;
    table.startEvent(context, &kernelHandle, &kernel);
    abi::StateArgs args{};
    args.kernelCh.pTimer = seq;
    table.recordEventState(kernelHandle, abi::kKernelChStop, &args);
    table.stopEvent(kernelHandle);
  }
}

double nsPerCall(abi::ProfilerV5& table, long calls, int channels) {
  void* context = nullptr;
  int mask = 0;
  table.init(&context, 0xbe11c0ffee000001ull, &mask, "bench", 1, 8, 0, nullptr);
  // In slices, with a pause between: the watchdog polls every 100 ms and frees the slots of
  // completed calls, as it would between a real job's steps.
  constexpr long kSlice = 4000;
  double total = 0;
  for (long done = 0; done < calls; done += kSlice) {
    long slice = std::min(kSlice, calls - done);
    auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < slice; ++i)
      oneCall(table, context, static_cast<uint64_t>(done + i), channels);
    total +=
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    usleep(110'000);
  }
  table.finalize(context);
  return total / static_cast<double>(calls);
}

}  // namespace

int main(int argc, char** argv) {
  long calls = argc > 1 ? std::atol(argv[1]) : 200000;
  int channels = argc > 2 ? std::atoi(argv[2]) : 2;
  if (calls <= 0 || channels <= 0 || channels > 64) {
    std::fprintf(stderr, "usage: plugin_callbacks [CALLS > 0] [CHANNELS in 1..64]\n");
    return 2;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp ? tmp : "/tmp") + "/ncclwatch-plugin-bench";
  setenv("NCCLWATCH_DIR", dir.c_str(), 1);
  setenv("NCCLWATCH_COLLECTOR", "off", 1);
  setenv("NCCLWATCH_EVENTS", "0", 1);
  void* library = dlopen(NCCLWATCH_PRELOAD, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "plugin_callbacks: %s\n", dlerror());
    return 1;
  }
  auto* ours = static_cast<abi::ProfilerV5*>(dlsym(library, "ncclProfiler_v5"));
  double baseline = nsPerCall(nullPlugin, calls, channels);
  double measured = nsPerCall(*ours, calls, channels);
  std::printf("profiler callbacks per collective (%d channels, %ld calls, 1 thread):\n", channels,
              calls);
  std::printf("  null plugin        %8.1f ns\n", baseline);
  std::printf("  ncclwatch plugin   %8.1f ns\n", measured);
  std::printf("  added by ncclwatch %8.1f ns per collective (%.1f ns per event)\n",
              measured - baseline, (measured - baseline) / (5 + 2.0 * channels));
  return 0;
}
