// The scenario corpus: small NCCL programs written straight against the NCCL API (not through
// examples/train_loop), each with one bug or none, selected by name: `nccl_scenarios NAME`.
// expected.tsv beside this file says what ncclwatch must find in each, live and offline.
// Like examples/, the binary links the real toolkit libraries with no RPATH: build/sim/lib first
// on LD_LIBRARY_PATH runs it on the sim. Rank and world come from the launcher (torchrun
// variables), the first unique id from examples/common's rendezvous.
//
// A rank whose NCCL call fails prints the error and exits 1, as most programs do; a hung rank
// stays hung until the test stops the job.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/launch_env.h"

namespace {

constexpr size_t kCount = 1024;

struct Job {
  examples::LaunchEnv env;
  int rank = 0;
  int world = 1;
  ncclComm_t comm = nullptr;  // the world
  int device = 0;
  cudaStream_t stream = nullptr;
  float* data = nullptr;  // kCount * world floats of device memory (room for gathers)
  float* out = nullptr;   // the same size again
  ncclUniqueId firstId{};
};

Job g;

void sleepMs(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// A failed call ends the rank with its error, as most programs do.
void check(ncclResult_t result, const char* what) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  std::fprintf(stderr, "nccl_scenarios: rank %d: %s failed: %s (%s)\n", g.rank, what,
               ncclGetErrorString(result), ncclGetLastError(nullptr));
  std::exit(1);
}

void checkCuda(cudaError_t result, const char* what) {
  if (result == cudaSuccess) return;
  std::fprintf(stderr, "nccl_scenarios: rank %d: %s failed: %s\n", g.rank, what,
               cudaGetErrorString(result));
  std::exit(2);
}

void sync(cudaStream_t stream = g.stream) {
  checkCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

// A non-blocking communicator: waits until its last operation or init is enqueued.
void settle(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
  }
  check(state, "a non-blocking operation");
}

float* deviceFloats(size_t count) {
  float* pointer = nullptr;
  checkCuda(cudaMalloc(reinterpret_cast<void**>(&pointer), count * sizeof(float)), "cudaMalloc");
  checkCuda(cudaMemset(pointer, 0, count * sizeof(float)), "cudaMemset");
  return pointer;
}

void allReduce(ncclComm_t comm, size_t count = kCount, ncclDataType_t dtype = ncclFloat32,
               ncclRedOp_t op = ncclSum, cudaStream_t stream = g.stream) {
  check(ncclAllReduce(g.data, g.data, count, dtype, op, comm, stream), "ncclAllReduce");
}

void broadcast(ncclComm_t comm, int root = 0, size_t count = kCount, cudaStream_t stream = g.stream,
               float* buffer = g.data) {
  check(ncclBroadcast(buffer, buffer, count, ncclFloat32, root, comm, stream), "ncclBroadcast");
}

void allGather(ncclComm_t comm, size_t count = kCount / 4) {
  check(ncclAllGather(g.data, g.out, count, ncclFloat32, comm, g.stream), "ncclAllGather");
}

void warmUp(int calls = 3) {
  for (int i = 0; i < calls; ++i) allReduce(g.comm);
  sync();
}

void destroy(ncclComm_t comm) {
  check(ncclCommDestroy(comm), "ncclCommDestroy");
}

// The end of a clean rank: everything done, the world destroyed.
int finish() {
  sync();
  destroy(g.comm);
  return 0;
}

// Blocks the calling rank for good (the test stops the job).
[[noreturn]] void hangHere() {
  for (;;) pause();
}

// A second communicator over every rank (split of the world, one colour).
ncclComm_t duplicate() {
  ncclComm_t dup = nullptr;
  check(ncclCommSplit(g.comm, 0, g.rank, &dup, nullptr), "ncclCommSplit");
  return dup;
}

// A fresh unique id from rank 0, shared over the world communicator.
ncclUniqueId sharedNewId() {
  ncclUniqueId id{};
  if (g.rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  char* staging = nullptr;
  checkCuda(cudaMalloc(reinterpret_cast<void**>(&staging), sizeof id), "cudaMalloc");
  checkCuda(cudaMemcpy(staging, &id, sizeof id, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(ncclBroadcast(staging, staging, sizeof id, ncclInt8, 0, g.comm, g.stream), "ncclBroadcast");
  sync();
  checkCuda(cudaMemcpy(&id, staging, sizeof id, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return id;
}

// ----- bugs -----

// A collective only some ranks reach: rank 3 skips the AllReduce the others make.
int condSubset() {
  warmUp();
  if (g.rank != 3) allReduce(g.comm, 256);
  broadcast(g.comm);
  allGather(g.comm);
  return finish();
}

// Rank 3 makes one AllReduce fewer in a run of identical ones, then goes on to the next phase.
int condIdentical() {
  warmUp();
  for (int i = 0; i < (g.rank == 3 ? 4 : 5); ++i) allReduce(g.comm);
  broadcast(g.comm);
  allGather(g.comm);
  return finish();
}

int wrongRoot() {
  warmUp();
  broadcast(g.comm, g.rank == 2 ? 1 : 0);
  return finish();
}

// Inside a group, rank 1 passes another count to the second AllReduce.
int groupCount() {
  warmUp();
  check(ncclGroupStart(), "ncclGroupStart");
  allReduce(g.comm);
  allReduce(g.comm, g.rank == 1 ? kCount / 2 : kCount);
  check(ncclGroupEnd(), "ncclGroupEnd");
  return finish();
}

// Rank 2 reduces int32 where the others reduce float32: the same bytes, so NCCL completes it
// with wrong data (silent corruption) and the job ends with exit code 0.
int dtypeEqualBytes() {
  warmUp();
  allReduce(g.comm, kCount, g.rank == 2 ? ncclInt32 : ncclFloat32);
  allReduce(g.comm);
  allReduce(g.comm);
  return finish();
}

// Rank 0 uses max where the others use sum, at the same position; every later call aligns.
int redopSubstituted() {
  warmUp(5);
  allReduce(g.comm, kCount, ncclFloat32, g.rank == 0 ? ncclMax : ncclSum);
  for (int i = 0; i < 3; ++i) allReduce(g.comm);
  return finish();
}

// Rank 0 inserts an extra AllReduce (max) before the sums every rank makes: every later call is
// one off, and rank 0's last one finds no partner.
int redopInserted() {
  warmUp(5);
  if (g.rank == 0) allReduce(g.comm, kCount, ncclFloat32, ncclMax);
  for (int i = 0; i < 3; ++i) allReduce(g.comm);
  return finish();
}

// A ring exchange in a group; rank 1 sends to rank+2 instead of rank+1.
int p2pWrongPeer() {
  warmUp();
  int next = (g.rank + (g.rank == 1 ? 2 : 1)) % g.world;
  int previous = (g.rank + g.world - 1) % g.world;
  check(ncclGroupStart(), "ncclGroupStart");
  check(ncclSend(g.data, kCount, ncclFloat32, next, g.comm, g.stream), "ncclSend");
  check(ncclRecv(g.out, kCount, ncclFloat32, previous, g.comm, g.stream), "ncclRecv");
  check(ncclGroupEnd(), "ncclGroupEnd");
  allReduce(g.comm);
  return finish();
}

// Pairs (0,1) and (2,3) swap buffers; rank 3 forgets its receive.
int p2pMissingReceive() {
  warmUp();
  int partner = g.rank ^ 1;
  check(ncclGroupStart(), "ncclGroupStart");
  check(ncclSend(g.data, kCount, ncclFloat32, partner, g.comm, g.stream), "ncclSend");
  if (g.rank != 3) {
    check(ncclRecv(g.out, kCount, ncclFloat32, partner, g.comm, g.stream), "ncclRecv");
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
  allReduce(g.comm);
  return finish();
}

// A ring exchange where rank 2 receives half of what rank 1 sends.
int p2pSize() {
  warmUp();
  int next = (g.rank + 1) % g.world, previous = (g.rank + g.world - 1) % g.world;
  check(ncclGroupStart(), "ncclGroupStart");
  check(ncclSend(g.data, kCount, ncclFloat32, next, g.comm, g.stream), "ncclSend");
  check(ncclRecv(g.out, g.rank == 2 ? kCount / 2 : kCount, ncclFloat32, previous, g.comm, g.stream),
        "ncclRecv");
  check(ncclGroupEnd(), "ncclGroupEnd");
  allReduce(g.comm);
  return finish();
}

// Pairs of ranks split off (colour rank/2); rank 5 computes colour 3 instead of 2.
int splitColour() {
  warmUp();
  int colour = g.rank == 5 ? 3 : g.rank / 2;
  ncclComm_t pair = nullptr;
  check(ncclCommSplit(g.comm, colour, g.rank, &pair, nullptr), "ncclCommSplit");
  allReduce(pair);
  sync();
  destroy(pair);
  return finish();
}

// Every rank but 3 splits the world; rank 3 goes straight on to the next AllReduce.
int splitSkipped() {
  warmUp();
  ncclComm_t half = nullptr;
  if (g.rank != 3) {
    check(ncclCommSplit(g.comm, g.rank % 2, g.rank, &half, nullptr), "ncclCommSplit");
  }
  allReduce(g.comm);
  sync();
  if (half != nullptr) destroy(half);
  return finish();
}

// A second communicator from a fresh id; rank 3 comes late and passes nranks 5.
int initWrongRanks() {
  warmUp();
  ncclUniqueId id = sharedNewId();
  if (g.rank == 3) sleepMs(300);
  ncclComm_t second = nullptr;
  check(ncclCommInitRank(&second, g.rank == 3 ? g.world + 1 : g.world, id, g.rank),
        "ncclCommInitRank");
  allReduce(second);
  sync();
  destroy(second);
  return finish();
}

// A second communicator from a fresh id; rank 3 comes late with the world's id, used up long ago.
int initStaleId() {
  warmUp();
  ncclUniqueId id = sharedNewId();
  if (g.rank == 3) sleepMs(300);
  ncclComm_t second = nullptr;
  check(ncclCommInitRank(&second, g.world, g.rank == 3 ? g.firstId : id, g.rank),
        "ncclCommInitRank");
  allReduce(second);
  sync();
  destroy(second);
  return finish();
}

// Rank 2 passes a root that is no rank: its Broadcast fails with ncclInvalidArgument.
int errorInvalidArgument() {
  warmUp();
  broadcast(g.comm, g.rank == 2 ? g.world + 3 : 0);
  return finish();
}

// Rank 1 revokes the world, then tries the next AllReduce on it: ncclInvalidUsage.
int errorInvalidUsage() {
  warmUp();
  if (g.rank == 1) check(ncclCommRevoke(g.comm, NCCL_REVOKE_DEFAULT), "ncclCommRevoke");
  allReduce(g.comm);
  return finish();
}

// Rank 2 returns from main early (exit code 0), its communicator never destroyed.
int earlyExit() {
  warmUp();
  if (g.rank == 2) return 0;
  allReduce(g.comm);
  return finish();
}

// Rank 2 destroys the world and exits while the others go on to the next AllReduce.
int earlyExitDestroy() {
  warmUp();
  if (g.rank == 2) return finish();
  allReduce(g.comm);
  return finish();
}

// The same with ncclCommFinalize first.
int earlyExitFinalize() {
  warmUp();
  if (g.rank == 2) {
    check(ncclCommFinalize(g.comm), "ncclCommFinalize");
    return finish();
  }
  allReduce(g.comm);
  return finish();
}

// Ranks 1 and 4 (of 6) make one AllReduce fewer, destroy their communicator and exit while the
// others wait in the last one.
int skipThenDestroyTwo() {
  warmUp();
  bool skips = g.rank == 1 || g.rank == 4;
  for (int i = 0; i < (skips ? 4 : 5); ++i) allReduce(g.comm);
  return finish();
}

int crash() {
  warmUp();
  if (g.rank == 2) raise(SIGSEGV);
  allReduce(g.comm);
  return finish();
}

// Rank 2 aborts the world while the others make the next AllReduce; it stays alive.
int abortComm() {
  warmUp();
  if (g.rank == 2) {
    check(ncclCommAbort(g.comm), "ncclCommAbort");
    hangHere();
  }
  allReduce(g.comm);
  return finish();
}

// Two communicators taken in opposite orders on one stream: rank 0 the duplicate first.
int deadlockTwo() {
  ncclComm_t dup = duplicate();
  warmUp();
  allReduce(dup);
  sync();
  if (g.rank == 0) {
    allReduce(dup);
    allReduce(g.comm);
  } else {
    allReduce(g.comm);
    allReduce(dup);
  }
  sync();
  destroy(dup);
  return finish();
}

// Three pairs over three ranks, each rank taking its two pairs in an order that closes a cycle:
// 0 waits for 1 in (0,1), 1 for 2 in (1,2), 2 for 0 in (0,2).
int deadlockThree() {
  warmUp();
  const int pairs[3][2] = {{0, 1}, {1, 2}, {0, 2}};
  ncclComm_t mine[3] = {};
  for (int p = 0; p < 3; ++p) {
    bool member = g.rank == pairs[p][0] || g.rank == pairs[p][1];
    check(ncclCommSplit(g.comm, member ? p : NCCL_SPLIT_NOCOLOR, g.rank, &mine[p], nullptr),
          "ncclCommSplit");
  }
  for (ncclComm_t pair : mine) {
    if (pair != nullptr) allReduce(pair);
  }
  sync();
  const int order[3][2] = {{0, 2}, {1, 0}, {2, 1}};  // rank r: pair order[r][0], then [1]
  allReduce(mine[order[g.rank][0]]);
  allReduce(mine[order[g.rank][1]]);
  sync();
  for (ncclComm_t pair : mine) {
    if (pair != nullptr) destroy(pair);
  }
  return finish();
}

// A non-blocking world; rank 3 skips a Broadcast.
ncclComm_t nonBlockingWorld() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  check(ncclCommInitRankConfig(&comm, g.world, g.firstId, g.rank, &config),
        "ncclCommInitRankConfig");
  settle(comm);
  return comm;
}

int nonBlocking(bool bug) {
  for (int step = 0; step < 3; ++step) {
    allReduce(g.comm);
    settle(g.comm);
    if (!(bug && step == 1 && g.rank == 3)) {
      broadcast(g.comm);
      settle(g.comm);
    }
    allGather(g.comm);
    settle(g.comm);
  }
  sync();
  check(ncclCommFinalize(g.comm), "ncclCommFinalize");
  settle(g.comm);
  destroy(g.comm);
  return 0;
}

// Collectives captured in a CUDA graph and launched; with the bug rank 1 captured another count.
int graph(bool bug) {
  warmUp();
  cudaStream_t capture;
  checkCuda(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking), "cudaStreamCreate");
  checkCuda(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal), "BeginCapture");
  allReduce(g.comm, kCount, ncclFloat32, ncclSum, capture);
  allReduce(g.comm, bug && g.rank == 1 ? kCount / 2 : kCount, ncclFloat32, ncclSum, capture);
  cudaGraph_t captured;
  checkCuda(cudaStreamEndCapture(capture, &captured), "EndCapture");
  cudaGraphExec_t exec;
  checkCuda(cudaGraphInstantiate(&exec, captured, 0), "cudaGraphInstantiate");
  // One launch: the sim runs a captured NCCL operation once (its task is freed after the first
  // replay), where NCCL replays it as often as the graph is launched.
  checkCuda(cudaGraphLaunch(exec, capture), "cudaGraphLaunch");
  sync(capture);
  return finish();
}

// Two threads, each with its own communicator and stream; with the bug rank 2's second thread
// makes one Broadcast fewer.
int threads(bool bug) {
  ncclComm_t dup = duplicate();
  cudaStream_t second;
  checkCuda(cudaStreamCreate(&second), "cudaStreamCreate");
  float* own = deviceFloats(kCount);
  std::thread a([&] {
    checkCuda(cudaSetDevice(g.device), "cudaSetDevice");
    for (int i = 0; i < 5; ++i) allReduce(g.comm);
    sync();
  });
  std::thread b([&] {
    checkCuda(cudaSetDevice(g.device), "cudaSetDevice");
    int calls = bug && g.rank == 2 ? 4 : 5;
    for (int i = 0; i < calls; ++i) broadcast(dup, 0, kCount, second, own);
    sync(second);
  });
  a.join();
  b.join();
  destroy(dup);
  return finish();
}

// Rank 1 skips the Broadcast of the second round of a 2-rank job: in a 2-rank communicator the
// counts tie, and only the shift (its AllGather is rank 0's next call) says who skipped.
int twoRankSkip() {
  for (int round = 0; round < 3; ++round) {
    allReduce(g.comm);
    if (!(round == 1 && g.rank == 1)) broadcast(g.comm);
    allGather(g.comm);
  }
  return finish();
}

// Two ranks disagree on a count and nothing else tells which one is wrong.
int twoRankUndecidable() {
  warmUp();
  allReduce(g.comm, g.rank == 1 ? 2 * kCount : kCount);
  return finish();
}

// ----- clean programs that look suspicious -----

int clean() {
  warmUp();
  broadcast(g.comm);
  check(ncclReduce(g.data, g.out, kCount, ncclFloat32, ncclSum, 0, g.comm, g.stream), "ncclReduce");
  allGather(g.comm);
  check(ncclReduceScatter(g.out, g.data, kCount / 4, ncclFloat32, ncclSum, g.comm, g.stream),
        "ncclReduceScatter");
  check(ncclAlltoAll(g.data, g.out, kCount / 4, ncclFloat32, g.comm, g.stream), "ncclAlltoAll");
  return finish();
}

// Rank 0 sends three messages to rank 1, rank 2 one to rank 3, between collectives.
int unevenP2p() {
  warmUp();
  for (int round = 0; round < 2; ++round) {
    check(ncclGroupStart(), "ncclGroupStart");
    if (g.rank == 0) {
      for (int i = 0; i < 3; ++i)
        check(ncclSend(g.data, 64, ncclFloat32, 1, g.comm, g.stream), "s");
    } else if (g.rank == 1) {
      for (int i = 0; i < 3; ++i) check(ncclRecv(g.out, 64, ncclFloat32, 0, g.comm, g.stream), "r");
    } else if (g.rank == 2) {
      check(ncclSend(g.data, 64, ncclFloat32, 3, g.comm, g.stream), "ncclSend");
    } else if (g.rank == 3) {
      check(ncclRecv(g.out, 64, ncclFloat32, 2, g.comm, g.stream), "ncclRecv");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    allReduce(g.comm);
  }
  return finish();
}

// AlltoAll written as grouped sends and receives to and from every rank.
int alltoallGrouped() {
  warmUp();
  size_t chunk = kCount / static_cast<size_t>(g.world);
  for (int round = 0; round < 2; ++round) {
    check(ncclGroupStart(), "ncclGroupStart");
    for (int peer = 0; peer < g.world; ++peer) {
      check(ncclSend(g.data + peer * chunk, chunk, ncclFloat32, peer, g.comm, g.stream),
            "ncclSend");
      check(ncclRecv(g.out + peer * chunk, chunk, ncclFloat32, peer, g.comm, g.stream), "ncclRecv");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    allReduce(g.comm);
  }
  return finish();
}

// Rank 0 scatters with sends and gathers with receives: it makes world-1 p2p calls per phase,
// the others one, between collectives.
int p2pCountsDiffer() {
  warmUp();
  for (int round = 0; round < 2; ++round) {
    check(ncclGroupStart(), "ncclGroupStart");
    if (g.rank == 0) {
      for (int peer = 1; peer < g.world; ++peer)
        check(ncclSend(g.data, 128, ncclFloat32, peer, g.comm, g.stream), "ncclSend");
    } else {
      check(ncclRecv(g.out, 128, ncclFloat32, 0, g.comm, g.stream), "ncclRecv");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    allReduce(g.comm);
    check(ncclGroupStart(), "ncclGroupStart");
    if (g.rank == 0) {
      for (int peer = 1; peer < g.world; ++peer)
        check(ncclRecv(g.out + peer * 128, 128, ncclFloat32, peer, g.comm, g.stream), "ncclRecv");
    } else {
      check(ncclSend(g.data, 128, ncclFloat32, 0, g.comm, g.stream), "ncclSend");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    broadcast(g.comm);
  }
  return finish();
}

// Every rank pauses 4 s on the host (longer than the collector's quiet time) with nothing
// pending: a checkpoint, not a hang.
int longPause() {
  warmUp();
  sleepMs(4000);
  warmUp();
  return finish();
}

// Rank 1 arrives 1.5 s late at one AllReduce the others already wait in (under the quiet time).
int soloPause() {
  warmUp();
  if (g.rank == 1) sleepMs(1500);
  allReduce(g.comm);
  return finish();
}

// Rank 2 is 30 ms late to every call: a straggler, information only.
int slowRank() {
  for (int i = 0; i < 10; ++i) {
    if (g.rank == 2) sleepMs(30);
    allReduce(g.comm);
    sync();
  }
  return finish();
}

// Ranks 0-2 shrink the world to exclude rank 3 (which destroys its world and leaves) and go on.
int shrinkClean() {
  warmUp();
  if (g.rank == 3) return finish();
  int excluded[] = {3};
  ncclComm_t shrunk = nullptr;
  check(ncclCommShrink(g.comm, excluded, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT),
        "ncclCommShrink");
  for (int i = 0; i < 3; ++i) allReduce(shrunk);
  sync();
  destroy(shrunk);
  return finish();
}

struct Scenario {
  std::function<int()> run;
  bool nonBlockingWorld = false;
  int neverInits = -1;  // a rank held before the world's init (the others wait inside it)
};

const std::map<std::string, Scenario>& scenarios() {
  static const std::map<std::string, Scenario> table = {
      {"clean", {clean}},
      {"cond_subset", {condSubset}},
      {"cond_identical", {condIdentical}},
      {"wrong_root", {wrongRoot}},
      {"group_count", {groupCount}},
      {"dtype_equal_bytes", {dtypeEqualBytes}},
      {"redop_substituted", {redopSubstituted}},
      {"redop_inserted", {redopInserted}},
      {"p2p_wrong_peer", {p2pWrongPeer}},
      {"p2p_missing_recv", {p2pMissingReceive}},
      {"p2p_size", {p2pSize}},
      {"split_colour", {splitColour}},
      {"split_skipped", {splitSkipped}},
      {"init_wrong_nranks", {initWrongRanks}},
      {"init_stale_id", {initStaleId}},
      {"error_invalid_argument", {errorInvalidArgument}},
      {"error_invalid_usage", {errorInvalidUsage}},
      {"early_exit", {earlyExit}},
      {"early_exit_destroy", {earlyExitDestroy}},
      {"early_exit_finalize", {earlyExitFinalize}},
      {"skip_destroy_two", {skipThenDestroyTwo}},
      {"crash", {crash}},
      {"abort_comm", {abortComm}},
      {"deadlock_two_comms", {deadlockTwo}},
      {"deadlock_three_comms", {deadlockThree}},
      {"nonblocking_skip", {[] { return nonBlocking(true); }, true}},
      {"nonblocking_clean", {[] { return nonBlocking(false); }, true}},
      {"graph_mismatch", {[] { return graph(true); }}},
      {"graph_clean", {[] { return graph(false); }}},
      {"threads_skip", {[] { return threads(true); }}},
      {"threads_clean", {[] { return threads(false); }}},
      {"two_rank_skip", {twoRankSkip}},
      {"two_rank_undecidable", {twoRankUndecidable}},
      {"uneven_p2p", {unevenP2p}},
      {"alltoall_grouped", {alltoallGrouped}},
      {"p2p_counts_differ", {p2pCountsDiffer}},
      {"long_pause", {longPause}},
      {"solo_pause", {soloPause}},
      {"slow_rank", {slowRank}},
      {"shrink_clean", {shrinkClean}},
      {"init_rank_never_comes", {clean, false, 3}},
  };
  return table;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 2 || scenarios().count(argv[1]) == 0) {
    std::fprintf(stderr, "usage: nccl_scenarios NAME\nnames:");
    for (const auto& [name, scenario] : scenarios()) std::fprintf(stderr, " %s", name.c_str());
    std::fprintf(stderr, "\n");
    return 2;
  }
  const Scenario& scenario = scenarios().at(argv[1]);
  g.env = examples::readLaunchEnv();
  g.rank = g.env.rank;
  g.world = g.env.world;
  int devices = 0;
  checkCuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  g.device = g.env.localRank % devices;
  checkCuda(cudaSetDevice(g.device), "cudaSetDevice");
  checkCuda(cudaStreamCreate(&g.stream), "cudaStreamCreate");
  g.data = deviceFloats(kCount * static_cast<size_t>(g.world));
  g.out = deviceFloats(kCount * static_cast<size_t>(g.world));
  g.firstId = examples::shareUniqueId(g.env);
  if (g.rank == scenario.neverInits) {
    // Held before its init (a download, a data loader) until the test ends the job.
    for (;;) sleepMs(1000);
  }
  if (scenario.nonBlockingWorld) {
    g.comm = nonBlockingWorld();
  } else {
    check(ncclCommInitRank(&g.comm, g.world, g.firstId, g.rank), "ncclCommInitRank");
  }
  return scenario.run();
}
