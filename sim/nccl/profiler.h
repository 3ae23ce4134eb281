// The sim's NCCL as a profiler-plugin host: it loads NCCL_PROFILER_PLUGIN by NCCL's rules and
// emits events through the plugin's own ABI version (plugin/abi/profiler_abi.h) at the moments
// NCCL does (docs/sim.md, "Profiler plugin"). Everything here costs one load and a branch per
// operation when no plugin asked for events.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

struct ncclComm;

namespace ncclsim {

struct Operation;

// The sim's channel count per operation: collectives are split over two channels, point-to-point
// pieces use one (NCCL picks per size and topology; the plugin must not assume either).
inline constexpr int kCollChannels = 2;
inline constexpr int kP2pChannels = 1;
// Proxy steps per ProxyOp of a collective's ring (the last one needs every rank's data) and of
// a point-to-point transfer.
inline constexpr int kRingSteps = 2;
inline constexpr int kP2pSteps = 1;

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

// The tasks of one operation: one (a collective, a send or a receive), kept inline so that an
// operation and its copies allocate nothing, or the pieces of AlltoAll, Gather and Scatter.
class ProfiledTasks {
 public:
  void clear() {
    single_ = false;
    pieces_.clear();
  }
  void add(const ProfiledTask& task) {
    if (!single_ && pieces_.empty()) {
      one_ = task;
      single_ = true;
      return;
    }
    if (single_) pieces_.push_back(one_);
    single_ = false;
    pieces_.push_back(task);
  }
  bool empty() const { return !single_ && pieces_.empty(); }
  ProfiledTask* begin() { return single_ ? &one_ : pieces_.data(); }
  ProfiledTask* end() { return single_ ? &one_ + 1 : pieces_.data() + pieces_.size(); }
  const ProfiledTask* begin() const { return single_ ? &one_ : pieces_.data(); }
  const ProfiledTask* end() const { return single_ ? &one_ + 1 : pieces_.data() + pieces_.size(); }
  ProfiledTask& front() { return *begin(); }

 private:
  ProfiledTask one_;
  bool single_ = false;
  std::vector<ProfiledTask> pieces_;
};

// What an operation carries for the profiler, from its API call to its kernel's end.
struct OperationProfile {
  int mask = 0;  // the activation mask sampled at the API call (0: no events at all)
  bool captured = false;
  ProfiledTasks tasks;
};

void profilerAttach(ncclComm* comm);
void profilerDetach(ncclComm* comm);
void profilerResetAfterFork();

// The user thread, inside the API call (CollApi/P2pApi, and GroupApi at the outermost group's
// first operation); `groupDepth` is the group nesting at the call (0: outside any group).
void profilerApiCall(Operation& op, cudaStream_t stream, int groupDepth);
// The outermost ncclGroupEnd (or a bare call's implicit one): GroupApi's state 24 at its entry,
// its stop at its exit, after the launch.
void profilerGroupEndEntry();
void profilerGroupEndExit();
// The launching thread, before the operations' host task is enqueued (replay false): KernelLaunch,
// the legacy Group and each task's Coll/P2p start and stop (NCCL: right after the kernel launch;
// the sim emits them first so that no KernelCh can precede its Coll). A captured plan with proxy
// work gets its Group/Coll/P2p at every replay instead (replay true, on the stream worker, as
// NCCL's host callback does).
void profilerLaunch(std::span<Operation> ops, cudaStream_t stream, bool captured, bool replay);
// The stream worker (NCCL's proxy thread would do it): the kernel's channels start and stop.
void profilerKernelStart(Operation& op);
void profilerKernelStop(Operation& op);

// The proxy's side of one operation toward one peer in one direction: a ProxyOp per channel of
// its task (from construction to destruction) and its steps, one at a time on every channel,
// each moving through NCCL's ProxyStep states. Inactive (every call a no-op) unless the plugin
// asked for proxy events at the operation's call.
class ProxyTransfer {
 public:
  ProxyTransfer(Operation& op, int peer, bool send, int steps);
  ~ProxyTransfer();
  ProxyTransfer(const ProxyTransfer&) = delete;
  ProxyTransfer& operator=(const ProxyTransfer&) = delete;

  bool active() const { return op_ != nullptr; }
  // Starts the next step in `state`; moves it to `state`; stops it.
  void beginStep(int state);
  void enter(int state);
  void endStep();
  int stepsDone() const { return stepsDone_; }
  int steps() const { return steps_; }
  bool inStep() const { return inStep_; }

 private:
  bool emitsSteps() const;

  Operation* op_ = nullptr;
  int channels_ = 0;
  int steps_ = 0;
  int stepsDone_ = 0;
  bool inStep_ = false;
  uint64_t stepBytes_ = 0;
  void* proxyOps_[kCollChannels] = {};
  void* stepHandles_[kCollChannels] = {};
};

}  // namespace ncclsim
