// One communicator, a tight ncclAllReduce loop: measures the host time per call.
// Run on the sim's instant mode (NCCLSIM_INSTANT=1) so that the figure is the enqueue path
// alone; bench/overhead.sh runs it with and without libncclwatch.so preloaded.
//   overhead_loop [BATCHES] [CALLS_PER_BATCH] [PAUSE_US] [RANKS]
// RANKS > 1 makes the communicator with ncclCommInitAll in this one process (NCCL gives a
// one-rank communicator no profiler events) and issues on its first rank only: in instant mode
// no peer needs to match.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "overhead_loop: %s failed\n", what);
    std::exit(2);
  }
}

long resident_kib() {
  FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof line, status) != nullptr) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) kib = std::strtol(line + 6, nullptr, 10);
  }
  std::fclose(status);
  return kib;
}

}  // namespace

int main(int argc, char** argv) {
  int batches = argc > 1 ? std::atoi(argv[1]) : 200;
  int calls_per_batch = argc > 2 ? std::atoi(argv[2]) : 1000;
  // A pause after each batch, outside the timed region: it gives ncclwatch's watchdog time to
  // see the batch's completion events and return their pairs to the pool, as a training step's
  // compute would.
  int pause_us = argc > 3 ? std::atoi(argv[3]) : 0;
  int ranks = argc > 4 ? std::atoi(argv[4]) : 1;
  check(batches > 0 && calls_per_batch > 0 && pause_us >= 0 && ranks >= 1 && ranks <= 8,
        "arguments (BATCHES CALLS_PER_BATCH [PAUSE_US] [RANKS 1-8])");

  check(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
  std::vector<ncclComm_t> comms(ranks);
  if (ranks == 1) {
    ncclUniqueId id;
    check(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    check(ncclCommInitRank(&comms[0], 1, id, 0) == ncclSuccess, "ncclCommInitRank");
  } else {
    check(ncclCommInitAll(comms.data(), ranks, nullptr) == ncclSuccess, "ncclCommInitAll");
    check(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
  }
  ncclComm_t comm = comms[0];
  cudaStream_t stream;
  check(cudaStreamCreate(&stream) == cudaSuccess, "cudaStreamCreate");
  float* buffer;
  check(cudaMalloc(&buffer, 1024 * sizeof(float)) == cudaSuccess, "cudaMalloc");

  auto run_batch = [&] {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls_per_batch; ++i) {
      ncclAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream);
    }
    auto end = std::chrono::steady_clock::now();
    // Drain outside the timed region so queued stream work never piles up.
    check(cudaStreamSynchronize(stream) == cudaSuccess, "cudaStreamSynchronize");
    if (pause_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    return std::chrono::duration<double, std::nano>(end - start).count() / calls_per_batch;
  };

  // Warm caches, pools and lazy initialisation (ncclwatch calibrates its clock in the first
  // ~30 ms of its watchdog thread): at least 20 batches and 200 ms.
  auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  for (int i = 0; i < 20 || std::chrono::steady_clock::now() < warm_until; ++i) run_batch();
  std::vector<double> per_call_ns;
  per_call_ns.reserve(batches);
  for (int i = 0; i < batches; ++i) per_call_ns.push_back(run_batch());
  std::sort(per_call_ns.begin(), per_call_ns.end());
  auto at = [&](double q) {
    return per_call_ns[static_cast<size_t>(q * (per_call_ns.size() - 1))];
  };

  std::printf("median_ns=%.1f p10_ns=%.1f p90_ns=%.1f rss_kib=%ld calls=%ld\n", at(0.5), at(0.1),
              at(0.9), resident_kib(), static_cast<long>(batches) * calls_per_batch);
  for (ncclComm_t each : comms) check(ncclCommDestroy(each) == ncclSuccess, "ncclCommDestroy");
  return 0;
}
