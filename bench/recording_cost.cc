// Where a recorded call's nanoseconds go, piece by piece, on the machine at hand (Google
// Benchmark): the clock read, the fingerprint and rolling hash, the ring append into a
// file-backed 4 MiB ring, and, to size what the append's one locked instruction costs under
// the ring's store traffic, the same 128-byte slot writes indexed by a locked fetch_add against
// a plain increment. overhead.sh gives the whole call's added time; this says which part is
// which (issue 15.1). Run it on a quiet machine: bench/recording_cost [--benchmark_repetitions=3]
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "trace/clock.h"
#include "trace/fingerprint.h"
#include "trace/record.h"
#include "trace/ring_writer.h"

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

}  // namespace

BENCHMARK_MAIN();
