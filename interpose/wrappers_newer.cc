// The wrappers of the host functions that NCCL 2.29-2.32 added, expanded from
// interpose/nccl_api_newer.def. Compiled against PyPI's NCCL 2.32.3 nccl.h and nccl_device.h
// alone (CMake target nccl_newer_headers), so every wrapper meets that header's prototype; the
// rest of libncclwatch.so keeps the toolkit's 2.28.9 header.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nccl_device.h>

#include <cstdint>

#include "interpose/lifecycle_newer.h"
#include "interpose/wrapper_macros.h"

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0),
              "wrappers_newer.cc must be compiled against NCCL 2.29 or newer's nccl.h");

// nccl_device/host.h declares its host functions without NCCL's pnccl twins, which
// libnccl.so.2 exports all the same: declared here from the header's own prototypes.
extern "C" {
decltype(::ncclCommQueryProperties) pncclCommQueryProperties;
decltype(::ncclGetPeerDevicePointer) pncclGetPeerDevicePointer;
decltype(::ncclGetLsaMultimemDevicePointer) pncclGetLsaMultimemDevicePointer;
}

namespace ncclwatch::interpose {
namespace {

// Descriptors beyond this many are not read: a wild nDesc must not make the wrapper walk
// memory that NCCL would have refused to touch.
constexpr int kMaxDescriptorsRead = 1024;

// The number of signals an ncclWaitSignal waits for, over all its descriptors.
uint64_t signalsAwaited(int nDesc, const ncclWaitSignalDesc_t* descs) {
  if (descs == nullptr || nDesc <= 0 || nDesc > kMaxDescriptorsRead) return 0;
  uint64_t total = 0;
  for (int i = 0; i < nDesc; ++i) total += descs[i].opCnt > 0 ? descs[i].opCnt : 0;
  return total;
}

// The peer every descriptor waits on, or -1 when they name several (or none can be read).
int signalPeer(int nDesc, const ncclWaitSignalDesc_t* descs) {
  if (descs == nullptr || nDesc <= 0 || nDesc > kMaxDescriptorsRead) return -1;
  for (int i = 1; i < nDesc; ++i) {
    if (descs[i].peer != descs[0].peer) return -1;
  }
  return descs[0].peer;
}

}  // namespace
}  // namespace ncclwatch::interpose

#include "interpose/nccl_api_newer.def"
