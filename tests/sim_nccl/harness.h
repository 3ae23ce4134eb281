// Runs one multi-process sim job: the parent makes the unique id (which must not start CUDA),
// forks one child per rank, and waits for all of them with a time bound.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace simtest {

struct RankContext {
  int rank;
  int nranks;
  ncclUniqueId id;
};

struct JobOptions {
  int nranks = 2;
  int timeoutMs = 20000;
  std::vector<std::pair<std::string, std::string>> env;  // set in each child before any NCCL call
};

struct JobResult {
  std::vector<int> exitCodes;    // exit status, or 128 + signal
  std::vector<std::string> err;  // each rank's stderr
  bool timedOut = false;
  double seconds = 0;
  ncclUniqueId id;
  std::string summary() const;  // one line per rank, for failure messages
  bool allExitedZero() const;
};

// scenario returns the child's exit code (0 = success). It runs with cudaSetDevice(rank % 8).
JobResult runJob(const JobOptions& options, const std::function<int(const RankContext&)>& scenario);

// Child-side helpers: print a message naming the rank and return false.
bool check(bool condition, const RankContext& context, const std::string& what);
#define SIMTEST_CHECK(condition, context, what)                      \
  do {                                                               \
    if (!::simtest::check((condition), (context), (what))) return 1; \
  } while (0)
#define SIMTEST_NCCL(call, context)                                                       \
  do {                                                                                    \
    ncclResult_t result_ = (call);                                                        \
    if (result_ != ncclSuccess) {                                                         \
      ::simtest::check(false, (context),                                                  \
                       std::string(#call) + " -> " + ncclGetErrorString(result_) + ": " + \
                           ncclGetLastError(nullptr));                                    \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

ncclComm_t initComm(const RankContext& context);  // blocking ncclCommInitRank, or nullptr
std::string readFile(const std::string& path);
double nowSeconds();
// Waits until the stream has drained or `seconds` passed; true when drained.
bool streamDrainsWithin(cudaStream_t stream, double seconds);

}  // namespace simtest
