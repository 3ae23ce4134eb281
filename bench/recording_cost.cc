// Where a recorded call's nanoseconds go, piece by piece, on the machine at hand (Google
// Benchmark): the clock read, the fingerprint and rolling hash, the ring append into a
// file-backed 4 MiB ring, and, to size what the append's one locked instruction costs under
// the ring's store traffic, the same 128-byte slot writes indexed by a locked fetch_add against
// a plain increment. overhead.sh gives the whole call's added time; this says which part is
// which (issue 15.1).
//
// BM_WholeCall runs the whole recording path of one ncclAllReduce as the LD_PRELOAD wrapper
// does (interpose/wrapper_macros.h: the resolved pointer, the call scope, the call's
// description, recordAndCall: the recorder, the comm lookup, issue into the ring, the NVTX and
// in-progress marks, the check for finish) around a "real NCCL" that returns at once, with
// events off as NCCLWATCH_EVENTS=0 sets it. Its "added_ns" counter is the recording path's own
// cost: batches of wrapped calls timed against batches of the same call made directly,
// interleaved in the same run, median of the per-batch differences.
// Run it on a quiet machine: bench/recording_cost [--benchmark_repetitions=3]
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "interpose/lifecycle.h"
#include "interpose/recorder.h"
#include "trace/clock.h"
#include "trace/fingerprint.h"
#include "trace/record.h"
#include "trace/ring_writer.h"
#include "watchdog/agent.h"
#include "watchdog/completion.h"

// The recorder's objects call these NCCL functions off the hot path (queries at init, abort on
// a hang); no NCCL is linked here, and this program never reaches them.
extern "C" {
ncclResult_t ncclCommAbort(ncclComm_t) {
  return ncclInvalidUsage;
}
ncclResult_t ncclCommCount(const ncclComm_t, int*) {
  return ncclInvalidUsage;
}
ncclResult_t ncclCommUserRank(const ncclComm_t, int*) {
  return ncclInvalidUsage;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t, int*) {
  return ncclInvalidUsage;
}
}

namespace {

using ncclwatch::trace::CallRecord;

void BM_ClockRead(benchmark::State& state) {
  // Calibrated: the fast path extrapolates the TSC, as on the hot path after the first 20 ms.
  for (int i = 0; i < 40 && !ncclwatch::trace::FastClock::calibrated(); ++i) {
    ncclwatch::trace::FastClock::calibrate();
    usleep(1000);
  }
  for (auto _ : state) benchmark::DoNotOptimize(ncclwatch::trace::FastClock::nowNs());
  state.counters["calibrated"] = ncclwatch::trace::FastClock::calibrated() ? 1 : 0;
}
BENCHMARK(BM_ClockRead);

void BM_FingerprintAndRollingHash(benchmark::State& state) {
  uint64_t rolling = ncclwatch::trace::kRollingSeed;
  uint64_t count = 1024;
  for (auto _ : state) {
    benchmark::DoNotOptimize(count);
    uint64_t print =
        ncclwatch::trace::fingerprint({ncclwatch::trace::OpKind::kAllReduce, count, 7, 0, -1});
    rolling = ncclwatch::trace::rollingHash(rolling, print);
    benchmark::DoNotOptimize(rolling);
  }
}
BENCHMARK(BM_FingerprintAndRollingHash);

// The real ring writer on a file in $TMPDIR (the trace file's mapping, its seqlock, its index).
void BM_RingAppend(benchmark::State& state) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/recording_cost." +
                     std::to_string(getpid()) + ".ncclwatch";
  ncclwatch::trace::RingWriter writer;
  ncclwatch::trace::ProcessInfo info;
  std::string error;
  if (!writer.open(path, 32768, info, &error)) {
    state.SkipWithError(("cannot open the ring: " + error).c_str());
    return;
  }
  CallRecord record{};
  record.op = ncclwatch::trace::OpKind::kAllReduce;
  record.count = 1024;
  for (auto _ : state) {
    ++record.seq;
    benchmark::DoNotOptimize(writer.append(record));
  }
  writer.close();
  unlink(path.c_str());
}
BENCHMARK(BM_RingAppend);

// 128-byte slot writes over a 4 MiB ring, the index taken with a locked fetch_add (as the ring
// does: any thread may append) or with a plain load and store (one appending thread).
template <bool kLocked>
void BM_SlotWrites(benchmark::State& state) {
  constexpr size_t kSlots = 32768;
  std::vector<CallRecord> ring(kSlots);
  std::atomic<uint64_t> next{0};
  CallRecord record{};
  for (auto _ : state) {
    uint64_t index = kLocked ? next.fetch_add(1, std::memory_order_relaxed)
                             : next.load(std::memory_order_relaxed);
    if (!kLocked) next.store(index + 1, std::memory_order_relaxed);
    record.seq = index;
    std::memcpy(&ring[index & (kSlots - 1)], &record, sizeof record);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_SlotWrites<true>)->Name("BM_SlotWrites/locked_fetch_add");
BENCHMARK(BM_SlotWrites<false>)->Name("BM_SlotWrites/plain_increment");

// The whole path. ---------------------------------------------------------------------------

// The "real" ncclAllReduce: returns at once (an empty asm keeps the call).
__attribute__((noinline)) ncclResult_t realAllReduce(const void* sendbuff, void* recvbuff,
                                                     size_t count, ncclDataType_t, ncclRedOp_t,
                                                     ncclComm_t, cudaStream_t) {
  asm volatile("" : : "r"(sendbuff), "r"(recvbuff), "r"(count) : "memory");
  return ncclSuccess;
}
// As the wrapper finds NCCL's function: resolved once, then one acquire load per call.
std::atomic<void*> g_realAllReduce{reinterpret_cast<void*>(&realAllReduce)};
using AllReduceFunction = decltype(&realAllReduce);

// The body of NCCL_COLLECTIVE (interpose/wrapper_macros.h) for ncclAllReduce, the resolution
// aside (no NCCL under this program to resolve).
__attribute__((noinline)) ncclResult_t wrappedAllReduce(const void* sendbuff, void* recvbuff,
                                                        size_t count, ncclDataType_t datatype,
                                                        ncclRedOp_t op, ncclComm_t comm,
                                                        cudaStream_t stream) {
  auto real = reinterpret_cast<AllReduceFunction>(g_realAllReduce.load(std::memory_order_acquire));
  ncclwatch::interpose::CallScope scope;
  if (!scope.outermost()) return real(sendbuff, recvbuff, count, datatype, op, comm, stream);
  ncclwatch::interpose::CallDescription call{
      .count = static_cast<uint64_t>(count),
      .stream = reinterpret_cast<uint64_t>(stream),
      .callSite = reinterpret_cast<uint64_t>(__builtin_return_address(0)),
      .dtype = static_cast<int>(datatype),
      .redop = static_cast<int>(op),
      .rootOrPeer = -1,
      .op = ncclwatch::trace::OpKind::kAllReduce};
  return ncclwatch::interpose::recordAndCall(
      comm, call, [&] { return real(sendbuff, recvbuff, count, datatype, op, comm, stream); });
}
// Without ncclwatch: the application calls NCCL's function itself.
__attribute__((noinline)) ncclResult_t directAllReduce(const void* sendbuff, void* recvbuff,
                                                       size_t count, ncclDataType_t datatype,
                                                       ncclRedOp_t op, ncclComm_t comm,
                                                       cudaStream_t stream) {
  auto real = reinterpret_cast<AllReduceFunction>(g_realAllReduce.load(std::memory_order_acquire));
  return real(sendbuff, recvbuff, count, datatype, op, comm, stream);
}

// As the watchdog would calibrate the clock, when a bench runs without it.
void calibrateClock() {
  for (int i = 0; i < 40 && !ncclwatch::trace::FastClock::calibrated(); ++i) {
    ncclwatch::trace::FastClock::calibrate();
    usleep(1000);
  }
}

// A communicator of 8 ranks, rank 0, registered with `recorder`: the one the wrapped calls use.
ncclComm_t addFakeComm(ncclwatch::interpose::Recorder& recorder) {
  static char commStorage[64];
  auto* fake = reinterpret_cast<ncclComm_t>(commStorage);
  ncclwatch::interpose::CommCreation creation;
  creation.comm = fake;
  creation.hash = 0x5eedf00dcafe1234ull;
  creation.nranks = 8;
  creation.rank = 0;
  recorder.add(creation);
  return fake;
}

// A recorder (trace file in $TMPDIR, events off, no watchdog thread: the clock is calibrated
// here as the watchdog would) and one registered communicator.
ncclComm_t wholeCallSetup() {
  static ncclComm_t comm = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir =
        std::string(tmp != nullptr ? tmp : "/tmp") + "/recording_cost." + std::to_string(getpid());
    setenv("NCCLWATCH_DIR", dir.c_str(), 1);
    static std::string folder = dir;  // removed at exit (the mapping may outlive the name)
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(folder, ignored);
    });
    setenv("NCCLWATCH_EVENTS", "0", 1);
    setenv("NCCLWATCH_PLUGIN", "off", 1);
    calibrateClock();
    auto* recorder = ncclwatch::interpose::Recorder::get();
    if (recorder == nullptr) return static_cast<ncclComm_t>(nullptr);
    return addFakeComm(*recorder);
  }();
  return comm;
}

// The whole-call benches' communicator; null, with the benchmark skipped, without a recorder.
ncclComm_t wholeCallCommOrSkip(benchmark::State& state) {
  ncclComm_t comm = wholeCallSetup();
  if (comm == nullptr) state.SkipWithError("no recorder");
  return comm;
}

enum class WholeCallMode { kDirect, kWrapped };
template <WholeCallMode kMode>
void BM_WholeCall(benchmark::State& state) {
  ncclComm_t comm = wholeCallCommOrSkip(state);
  if (comm == nullptr) return;
  float buffer[16];
  auto* stream = reinterpret_cast<cudaStream_t>(0x1000);
  for (auto _ : state) {
    ncclResult_t result =
        kMode == WholeCallMode::kWrapped
            ? wrappedAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream)
            : directAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream);
    benchmark::DoNotOptimize(result);
  }
}
BENCHMARK(BM_WholeCall<WholeCallMode::kDirect>)->Name("BM_WholeCall/direct");
BENCHMARK(BM_WholeCall<WholeCallMode::kWrapped>)->Name("BM_WholeCall/recorded");

// One batch of kWholeCallBatch direct calls, then as many wrapped ones: ns a call of each.
constexpr int kWholeCallBatch = 1000;
struct BatchNs {
  double direct = 0;
  double wrapped = 0;
};
BatchNs timeBatches(ncclComm_t comm, float* buffer, cudaStream_t stream) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kWholeCallBatch; ++i) {
    benchmark::DoNotOptimize(
        directAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream));
  }
  auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < kWholeCallBatch; ++i) {
    benchmark::DoNotOptimize(
        wrappedAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream));
  }
  auto t2 = std::chrono::steady_clock::now();
  return {std::chrono::duration<double, std::nano>(t1 - t0).count() / kWholeCallBatch,
          std::chrono::duration<double, std::nano>(t2 - t1).count() / kWholeCallBatch};
}

// Batches of 1000 direct and 1000 wrapped calls in turn; added_ns is the median over the
// iterations of (wrapped - direct) / 1000, so that both sides see the same machine.
void BM_WholeCallAdded(benchmark::State& state) {
  ncclComm_t comm = wholeCallCommOrSkip(state);
  if (comm == nullptr) return;
  float buffer[16];
  auto* stream = reinterpret_cast<cudaStream_t>(0x1000);
  std::vector<double> added;
  added.reserve(1 << 16);
  for (auto _ : state) {
    BatchNs batch = timeBatches(comm, buffer, stream);
    added.push_back(batch.wrapped - batch.direct);
  }
  std::sort(added.begin(), added.end());
  state.counters["added_ns"] = added.empty() ? 0 : added[added.size() / 2];
}
BENCHMARK(BM_WholeCallAdded);

// The same with completion tracking on (BM_WholeCallEvents/1: one event a call, the default;
// /2: NCCLWATCH_EVENTS=full), against the stub driver built beside this binary as
// stub_cuda/libcuda.so.1 (bench/stub_cuda.cc: every driver call returns at once; skipped
// without it, never measured against the real driver), so that added_ns is ncclwatch's own
// work on the event path: the capture check and event record calls themselves cost nothing,
// the pair handout, its bookkeeping and the hand-over to the poller are all there, and the
// watchdog thread polls and recycles pairs as in a job. A process has one recorder, started
// with one event mode, so each case runs in a fork()ed child (the recorder of a parent that ran
// BM_WholeCall is forgotten there, as in any fork child) and sends its figures back. shed says
// how many of the child's timed calls found no free pair (the others are tracked):
// a shed call skips the event path, so the figure holds only while shed is ~0; hence a 2 ms
// pause after each pair of batches (untimed), in which the poller recycles the batch's pairs.
struct EventPathFigures {
  double addedNs = 0;
  double directNs = 0;
  double wrappedNs = 0;
  uint64_t calls = 0;
  uint64_t shed = 0;
  char error[96] = {};
};

EventPathFigures measureEventPath(const char* eventMode, int batches) {
  EventPathFigures figures;
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/recording_cost.events." +
                    std::to_string(getpid());
  setenv("NCCLWATCH_DIR", dir.c_str(), 1);
  setenv("NCCLWATCH_EVENTS", eventMode, 1);
  setenv("NCCLWATCH_PLUGIN", "off", 1);
  setenv("NCCLWATCH_COLLECTOR", "off", 1);
  // The stub driver, by its path beside this binary (stub_cuda/libcuda.so.1): once loaded, it
  // is the libcuda.so.1 that watchdog/driver_api.cc finds. Never the real driver: without the
  // stub the case is skipped.
  char self[4096] = {};
  ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string stub =
      length > 0 ? std::filesystem::path(self).parent_path().string() + "/stub_cuda/libcuda.so.1"
                 : std::string();
  void* stubDriver = stub.empty() ? nullptr : dlopen(stub.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (stubDriver == nullptr || dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) != stubDriver) {
    std::snprintf(figures.error, sizeof figures.error, "no stub driver at %s",
                  stub.empty() ? "?" : stub.c_str());
    return figures;
  }
  calibrateClock();
  auto* recorder = ncclwatch::interpose::Recorder::get();
  if (recorder == nullptr) {
    std::snprintf(figures.error, sizeof figures.error, "no recorder");
    return figures;
  }
  ncclComm_t comm = addFakeComm(*recorder);
  recorder->communicatorCreated();  // the watchdog thread and the context's event pool
  auto* agent = ncclwatch::watchdog::Agent::current();
  const ncclwatch::watchdog::CompletionTracker* completion =
      agent != nullptr ? agent->completion() : nullptr;
  if (completion == nullptr) {
    std::snprintf(figures.error, sizeof figures.error, "no completion tracking (stub driver?)");
    std::filesystem::remove_all(dir);
    return figures;
  }
  float buffer[16];
  auto* stream = reinterpret_cast<cudaStream_t>(0x1000);
  usleep(200'000);  // the watchdog tops the new pool up (kWarmPairs), as early in a job
  for (int i = 0; i < 20 * kWholeCallBatch; ++i) {
    benchmark::DoNotOptimize(
        wrappedAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream));
  }
  usleep(50'000);
  uint64_t shedBefore = completion->counters().noPair.load();
  std::vector<double> added, direct, wrapped;
  for (int b = 0; b < batches; ++b) {
    BatchNs batch = timeBatches(comm, buffer, stream);
    double d = batch.direct, w = batch.wrapped;
    direct.push_back(d);
    wrapped.push_back(w);
    added.push_back(w - d);
    // Untimed, as a training step's compute between its collectives: the poller recycles the
    // batch's pairs (a call that finds the pool empty is shed and skips the event path).
    usleep(2000);
  }
  usleep(300'000);  // the last calls reach the poller
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  figures.addedNs = median(added);
  figures.directNs = median(direct);
  figures.wrappedNs = median(wrapped);
  figures.calls = uint64_t{kWholeCallBatch} * static_cast<uint64_t>(batches);
  figures.shed = completion->counters().noPair.load() - shedBefore;
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return figures;
}

void BM_WholeCallEvents(benchmark::State& state) {
  const char* mode = state.range(0) == 2 ? "full" : "1";
  constexpr int kBatches = 2000;
  int channel[2];
  if (pipe(channel) != 0) {
    state.SkipWithError("pipe");
    return;
  }
  pid_t child = fork();
  if (child == 0) {
    close(channel[0]);
    EventPathFigures figures = measureEventPath(mode, kBatches);
    ssize_t written = write(channel[1], &figures, sizeof figures);
    _exit(written == static_cast<ssize_t>(sizeof figures) ? 0 : 1);
  }
  close(channel[1]);
  EventPathFigures figures;
  ssize_t got = child > 0 ? read(channel[0], &figures, sizeof figures) : -1;
  close(channel[0]);
  if (child > 0) waitpid(child, nullptr, 0);
  for (auto _ : state) state.SetIterationTime(figures.wrappedNs * 1e-9);
  if (got != static_cast<ssize_t>(sizeof figures)) {
    state.SkipWithError("the measuring child failed");
    return;
  }
  if (figures.error[0] != '\0') {
    state.SkipWithError(figures.error);
    return;
  }
  state.counters["added_ns"] = figures.addedNs;
  state.counters["direct_ns"] = figures.directNs;
  state.counters["wrapped_ns"] = figures.wrappedNs;
  // Every timed call is either shed (counted as it is made) or handed to the poller; the
  // poller's own count lags and can include the warm-up's last calls (it read over 100%).
  uint64_t shed = std::min(figures.shed, figures.calls);
  state.counters["tracked_pct"] =
      figures.calls ? 100.0 * static_cast<double>(figures.calls - shed) / figures.calls : 0;
  state.counters["shed"] = static_cast<double>(figures.shed);
}
BENCHMARK(BM_WholeCallEvents)->Arg(1)->Arg(2)->Iterations(1)->UseManualTime();

}  // namespace

BENCHMARK_MAIN();
