// The sim's NCCL as a profiler-plugin host: it loads NCCL_PROFILER_PLUGIN by NCCL's rules and
// emits events through the plugin's own ABI version (plugin/abi/profiler_abi.h) at the moments
// NCCL does (docs/sim.md, "Profiler plugin"). Everything here costs one load and a branch per
// operation when no plugin asked for events.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

struct ncclComm;

namespace ncclsim {

struct Operation;

// The sim's channel count per operation: collectives are split over two channels, point-to-point
// pieces use one (NCCL picks per size and topology; the plugin must not assume either).
inline constexpr int kCollChannels = 2;
inline constexpr int kP2pChannels = 1;

// One NCCL task as the profiler sees it: a Coll, or a P2p piece (AlltoAll, Gather and Scatter
// become P2p pieces, as NCCL 2.28 decomposes them).
struct ProfiledTask {
  void* api = nullptr;  // CollApi / P2pApi handle
  void* op = nullptr;   // Coll / P2p handle
  void* kernels[kCollChannels] = {};
  int channels = 0;
  int peer = -1;  // P2p pieces
  bool send = false;
  uint64_t count = 0;
};

// What an operation carries for the profiler, from its API call to its kernel's end.
struct OperationProfile {
  int mask = 0;  // the activation mask sampled at the API call (0: no events at all)
  std::vector<ProfiledTask> tasks;
};

void profilerAttach(ncclComm* comm);
void profilerDetach(ncclComm* comm);
void profilerResetAfterFork();

// The user thread, inside the API call (CollApi/P2pApi, and GroupApi at the outermost group's
// first operation); `groupDepth` is the group nesting at the call (0: outside any group).
void profilerApiCall(Operation& op, cudaStream_t stream, int groupDepth);
// ncclGroupEnd of the outermost group: GroupApi's end states and stop.
void profilerGroupEnd();
// The launching thread, before the operations' host task is enqueued: the legacy Group and each
// task's Coll/P2p start and stop (NCCL: right after the kernel launch; the sim emits them first so
// that no KernelCh can precede its Coll).
void profilerLaunch(std::vector<Operation>& ops);
// The stream worker (NCCL's proxy thread would do it): the kernel's channels start and stop.
void profilerKernelStart(Operation& op);
void profilerKernelStop(Operation& op);

// A network proxy step of one operation toward `peer`, from construction to destruction:
// a ProxyOp and one ProxyStep in `state` (NCCL's state numbers), moved on with enter().
class ProxyStep {
 public:
  ProxyStep(Operation& op, int peer, bool send, int state);
  ~ProxyStep();
  ProxyStep(const ProxyStep&) = delete;
  ProxyStep& operator=(const ProxyStep&) = delete;
  void enter(int state);
  // Whether the plugin asked for proxy events at this operation's call.
  bool active() const { return op_ != nullptr; }

 private:
  Operation* op_ = nullptr;
  void* proxyOp_ = nullptr;
  void* step_ = nullptr;
};

}  // namespace ncclsim
