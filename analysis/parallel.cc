#include "analysis/parallel.h"

#include "analysis/analyze.h"

#include <pthread.h>

#include <algorithm>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

namespace ncclwatch::analysis {

int defaultAnalysisThreads() {
  unsigned cores = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(cores / 2, 1u, 8u));
}

}  // namespace ncclwatch::analysis

namespace ncclwatch::analysis::internal {

size_t chunkCount(size_t count, int threads) {
  if (threads <= 1 || count < kParallelMinItems) return 1;
  return std::min<size_t>(static_cast<size_t>(threads), count / (kParallelMinItems / 2));
}

void parallelChunks(size_t count, int threads,
                    const std::function<void(size_t chunk, size_t begin, size_t end)>& work) {
  size_t chunks = chunkCount(count, threads);
  auto bounds = [&](size_t chunk) { return count * chunk / chunks; };
  // What a helper thread threw (bad_alloc) is rethrown here, as the calling thread's own would
  // be: out of a thread it would end the process.
  std::vector<std::exception_ptr> thrown(chunks);
  auto run = [&](size_t chunk) {
    try {
      work(chunk, bounds(chunk), bounds(chunk + 1));
    } catch (...) {
      thrown[chunk] = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  std::vector<size_t> leftOver;  // chunks no thread could be started for: done here
  for (size_t chunk = 1; chunk < chunks; ++chunk) {
    try {
      helpers.emplace_back(run, chunk);
      // Named apart from the thread that asked (a collector's triage thread), whose name they
      // would inherit: per-thread CPU figures (bench/collector_load) then tell them apart.
      pthread_setname_np(helpers.back().native_handle(), "nw-analysis");
    } catch (const std::system_error&) {
      leftOver.push_back(chunk);  // out of threads: the result is the same, only later
    }
  }
  run(0);
  for (size_t chunk : leftOver) run(chunk);
  for (std::thread& helper : helpers) helper.join();
  for (const std::exception_ptr& error : thrown) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace ncclwatch::analysis::internal
