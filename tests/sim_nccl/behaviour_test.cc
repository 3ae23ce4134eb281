// Multi-process behaviour of the sim NCCL: p2p, groups, split, shrink, non-blocking comms, real
// hangs ended by abort, mismatch detection, corrupt mode, fault injection and instant mode.
#include <gtest/gtest.h>
#include <nccl_device.h>
#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "harness.h"

using simtest::RankContext;

namespace {

void sleepMs(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

template <typename T>
T* deviceArray(const std::vector<T>& host) {
  T* device = nullptr;
  cudaMalloc(&device, sizeof(T) * host.size());
  cudaMemcpy(device, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice);
  return device;
}

template <typename T>
std::vector<T> hostCopy(const T* device, size_t count) {
  std::vector<T> host(count);
  cudaMemcpy(host.data(), device, sizeof(T) * count, cudaMemcpyDeviceToHost);
  return host;
}

simtest::JobResult run(int nranks, const std::function<int(const RankContext&)>& scenario,
                       std::vector<std::pair<std::string, std::string>> env = {},
                       int timeoutMs = 20000) {
  simtest::JobOptions options;
  options.nranks = nranks;
  options.env = std::move(env);
  options.timeoutMs = timeoutMs;
  return simtest::runJob(options, scenario);
}

// A hung operation: the stream stays busy, then ncclCommAbort frees it within a bound.
int expectHangThenAbort(const RankContext& c, ncclComm_t comm, cudaStream_t stream,
                        double hangSeconds = 0.4) {
  SIMTEST_CHECK(!simtest::streamDrainsWithin(stream, hangSeconds), c, "operation should hang");
  const double start = simtest::nowSeconds();
  SIMTEST_NCCL(ncclCommAbort(comm), c);
  SIMTEST_CHECK(simtest::streamDrainsWithin(stream, 1.0), c, "abort must release the stream");
  SIMTEST_CHECK(simtest::nowSeconds() - start < 1.0, c, "abort took too long");
  return 0;
}

TEST(P2p, RingInsideGroupAndManySendsToOnePeer) {
  const auto result = run(4, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    const int n = c.nranks, next = (c.rank + 1) % n, prev = (c.rank + n - 1) % n;
    constexpr int kMessages = 5;
    std::vector<float*> send(kMessages), recv(kMessages);
    for (int m = 0; m < kMessages; ++m) {
      send[m] = deviceArray(std::vector<float>(8, static_cast<float>(100 * c.rank + m)));
      recv[m] = deviceArray(std::vector<float>(8, -1.0f));
    }
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    SIMTEST_NCCL(ncclGroupStart(), c);
    for (int m = 0; m < kMessages; ++m) {
      SIMTEST_NCCL(ncclSend(send[m], 8, ncclFloat, next, comm, stream), c);
      SIMTEST_NCCL(ncclRecv(recv[m], 8, ncclFloat, prev, comm, stream), c);
    }
    SIMTEST_NCCL(ncclGroupEnd(), c);
    SIMTEST_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, c, "sync");
    for (int m = 0; m < kMessages; ++m) {
      // The k-th send from prev pairs with this rank's k-th receive from prev.
      SIMTEST_CHECK(hostCopy(recv[m], 8)[7] == static_cast<float>(100 * prev + m), c, "ring data");
    }
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(P2p, UngroupedPairAndSelfSendInGroup) {
  const auto result = run(2, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    int* mine = deviceArray(std::vector<int>{c.rank + 10, c.rank + 20});
    int* theirs = deviceArray(std::vector<int>{0, 0});
    const int peer = 1 - c.rank;
    if (c.rank == 0) {
      SIMTEST_NCCL(ncclSend(mine, 2, ncclInt32, peer, comm, nullptr), c);
      SIMTEST_NCCL(ncclRecv(theirs, 2, ncclInt32, peer, comm, nullptr), c);
    } else {
      SIMTEST_NCCL(ncclRecv(theirs, 2, ncclInt32, peer, comm, nullptr), c);
      SIMTEST_NCCL(ncclSend(mine, 2, ncclInt32, peer, comm, nullptr), c);
    }
    cudaDeviceSynchronize();
    SIMTEST_CHECK(hostCopy(theirs, 2) == (std::vector<int>{peer + 10, peer + 20}), c, "pair data");
    int* self = deviceArray(std::vector<int>{0, 0});
    SIMTEST_NCCL(ncclGroupStart(), c);
    SIMTEST_NCCL(ncclSend(mine, 2, ncclInt32, c.rank, comm, nullptr), c);
    SIMTEST_NCCL(ncclRecv(self, 2, ncclInt32, c.rank, comm, nullptr), c);
    SIMTEST_NCCL(ncclGroupEnd(), c);
    cudaDeviceSynchronize();
    SIMTEST_CHECK(hostCopy(self, 2) == (std::vector<int>{c.rank + 10, c.rank + 20}), c,
                  "self send");
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(P2p, UngroupedRingDeadlocksLikeNccl) {
  const auto result = run(3, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    float* buffer = deviceArray(std::vector<float>(4, 1.0f));
    float* incoming = deviceArray(std::vector<float>(4, 0.0f));
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    SIMTEST_NCCL(ncclSend(buffer, 4, ncclFloat, (c.rank + 1) % 3, comm, stream), c);
    SIMTEST_NCCL(ncclRecv(incoming, 4, ncclFloat, (c.rank + 2) % 3, comm, stream), c);
    return expectHangThenAbort(c, comm, stream);
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Groups, MixedCollectivesOnTwoStreams) {
  const auto result = run(4, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    cudaStream_t first, second;
    cudaStreamCreate(&first);
    cudaStreamCreate(&second);
    double* reduced = deviceArray(std::vector<double>{1.0 * c.rank, 2.0});
    int* gathered = deviceArray(std::vector<int>(4, 0));
    int* contribution = deviceArray(std::vector<int>{c.rank * c.rank});
    int64_t* broadcast = deviceArray(std::vector<int64_t>{c.rank == 1 ? 77 : 0});
    SIMTEST_NCCL(ncclGroupStart(), c);
    SIMTEST_NCCL(ncclAllReduce(reduced, reduced, 2, ncclFloat64, ncclMax, comm, first), c);
    SIMTEST_NCCL(ncclGroupStart(), c);  // nesting: only the outermost End launches
    SIMTEST_NCCL(ncclAllGather(contribution, gathered, 1, ncclInt32, comm, second), c);
    SIMTEST_NCCL(ncclGroupEnd(), c);
    SIMTEST_NCCL(ncclBroadcast(broadcast, broadcast, 1, ncclInt64, 1, comm, first), c);
    SIMTEST_NCCL(ncclGroupEnd(), c);
    cudaDeviceSynchronize();
    SIMTEST_CHECK(hostCopy(reduced, 2) == (std::vector<double>{3.0, 2.0}), c, "allreduce max");
    SIMTEST_CHECK(hostCopy(gathered, 4) == (std::vector<int>{0, 1, 4, 9}), c, "allgather");
    SIMTEST_CHECK(hostCopy(broadcast, 1)[0] == 77, c, "broadcast");
    ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
    SIMTEST_NCCL(ncclGroupStart(), c);
    SIMTEST_NCCL(ncclAllReduce(reduced, reduced, 2, ncclFloat64, ncclSum, comm, first), c);
    SIMTEST_NCCL(ncclGroupSimulateEnd(&info), c);
    SIMTEST_CHECK(info.estimatedTime > 0, c, "simulate fills estimatedTime");
    cudaDeviceSynchronize();
    SIMTEST_CHECK(hostCopy(reduced, 2) == (std::vector<double>{3.0, 2.0}), c,
                  "simulated group launches nothing");
    SIMTEST_CHECK(ncclGroupEnd() == ncclInvalidUsage, c, "unmatched GroupEnd");
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

// FSDP's shape: an all-gather on one stream, then a reduce-scatter on another, ungrouped, on
// one communicator. On ranks 2 and 3 the all-gather's stream is held by earlier work, so their
// reduce-scatter's stream is free first. NCCL runs a communicator's operations in issue order
// whatever the stream, so both complete with the right data; numbered as they started, the sim
// paired rank 0's all-gather with rank 2's reduce-scatter and hung (a real FSDP2 job did).
TEST(Groups, UngroupedCollectivesOnTwoStreamsPairByIssueOrder) {
  const auto result = run(4, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    cudaStream_t gatherStream, scatterStream;
    cudaStreamCreate(&gatherStream);
    cudaStreamCreate(&scatterStream);
    int* contribution = deviceArray(std::vector<int>{c.rank + 1});
    int* gathered = deviceArray(std::vector<int>(4, 0));
    int* toScatter = deviceArray(std::vector<int>{1, 2, 3, 4});
    int* scattered = deviceArray(std::vector<int>{0});
    if (c.rank >= 2) {
      cudaLaunchHostFunc(
          gatherStream, [](void*) { sleepMs(300); }, nullptr);
    }
    SIMTEST_NCCL(ncclAllGather(contribution, gathered, 1, ncclInt32, comm, gatherStream), c);
    SIMTEST_NCCL(
        ncclReduceScatter(toScatter, scattered, 1, ncclInt32, ncclSum, comm, scatterStream), c);
    SIMTEST_CHECK(simtest::streamDrainsWithin(gatherStream, 5.0), c, "all-gather hangs");
    SIMTEST_CHECK(simtest::streamDrainsWithin(scatterStream, 5.0), c, "reduce-scatter hangs");
    SIMTEST_CHECK(hostCopy(gathered, 4) == (std::vector<int>{1, 2, 3, 4}), c, "allgather");
    SIMTEST_CHECK(hostCopy(scattered, 1)[0] == 4 * (c.rank + 1), c, "reducescatter");
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Lifecycle, SplitOrdersByKeyAndHonoursNoColor) {
  const auto result = run(8, [](const RankContext& c) {
    ncclComm_t world = simtest::initComm(c);
    SIMTEST_CHECK(world != nullptr, c, "init");
    // Colour by parity; key reverses the order; rank 7 opts out.
    const int color = c.rank == 7 ? NCCL_SPLIT_NOCOLOR : c.rank % 2;
    ncclComm_t half = reinterpret_cast<ncclComm_t>(0x1);
    SIMTEST_NCCL(ncclCommSplit(world, color, -c.rank, &half, nullptr), c);
    if (c.rank == 7) {
      SIMTEST_CHECK(half == nullptr, c, "NOCOLOR gives NULL");
    } else {
      int count = 0, rank = 0;
      SIMTEST_NCCL(ncclCommCount(half, &count), c);
      SIMTEST_NCCL(ncclCommUserRank(half, &rank), c);
      const int members = c.rank % 2 == 0 ? 4 : 3;
      SIMTEST_CHECK(count == members, c, "split size");
      // Highest parent rank has the smallest key.
      const int expectedRank = (c.rank % 2 == 0) ? (6 - c.rank) / 2 : (5 - c.rank) / 2;
      SIMTEST_CHECK(rank == expectedRank, c, "split rank " + std::to_string(rank));
      int* value = deviceArray(std::vector<int>{c.rank});
      SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, half, nullptr), c);
      cudaDeviceSynchronize();
      SIMTEST_CHECK(hostCopy(value, 1)[0] == (c.rank % 2 == 0 ? 12 : 9), c, "sum over split comm");
      SIMTEST_NCCL(ncclCommDestroy(half), c);
    }
    // A second split of the same parent works too (double-buffered posts).
    ncclComm_t all = nullptr;
    SIMTEST_NCCL(ncclCommSplit(world, 0, c.rank, &all, nullptr), c);
    int count = 0;
    SIMTEST_NCCL(ncclCommCount(all, &count), c);
    SIMTEST_CHECK(count == 8, c, "second split");
    SIMTEST_NCCL(ncclCommDestroy(all), c);
    SIMTEST_NCCL(ncclCommDestroy(world), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Lifecycle, ShrinkExcludesADeadRank) {
  const auto result = run(4, [](const RankContext& c) {
    ncclComm_t world = simtest::initComm(c);
    SIMTEST_CHECK(world != nullptr, c, "init");
    if (c.rank == 1) return 0;  // this rank "dies"
    int excluded[] = {1};
    ncclComm_t survivors = nullptr;
    SIMTEST_NCCL(ncclCommShrink(world, excluded, 1, &survivors, nullptr, NCCL_SHRINK_DEFAULT), c);
    int count = 0, rank = 0;
    SIMTEST_NCCL(ncclCommCount(survivors, &count), c);
    SIMTEST_NCCL(ncclCommUserRank(survivors, &rank), c);
    SIMTEST_CHECK(count == 3 && rank == (c.rank == 0 ? 0 : c.rank - 1), c, "shrunk ranks");
    int* value = deviceArray(std::vector<int>{c.rank});
    SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, survivors, nullptr), c);
    cudaDeviceSynchronize();
    SIMTEST_CHECK(hostCopy(value, 1)[0] == 5, c, "sum over survivors");
    SIMTEST_NCCL(ncclCommDestroy(survivors), c);
    SIMTEST_NCCL(ncclCommAbort(world), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Lifecycle, ShrinkAbortEndsAHungParentOperation) {
  const auto result = run(3, [](const RankContext& c) {
    ncclComm_t world = simtest::initComm(c);
    SIMTEST_CHECK(world != nullptr, c, "init");
    if (c.rank == 2) return 0;  // never joins the allreduce
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    int* value = deviceArray(std::vector<int>{1});
    SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, world, stream), c);
    SIMTEST_CHECK(!simtest::streamDrainsWithin(stream, 0.3), c, "hangs first");
    int excluded[] = {2};
    ncclComm_t survivors = nullptr;
    SIMTEST_NCCL(ncclCommShrink(world, excluded, 1, &survivors, nullptr, NCCL_SHRINK_ABORT), c);
    SIMTEST_CHECK(simtest::streamDrainsWithin(stream, 1.0), c, "shrink abort released the stream");
    SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, survivors, stream), c);
    SIMTEST_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, c, "sync");
    SIMTEST_CHECK(hostCopy(value, 1)[0] == 2, c, "sum after shrink");
    SIMTEST_NCCL(ncclCommDestroy(survivors), c);
    SIMTEST_NCCL(ncclCommAbort(world), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

// Ranks 1 and 2 on one GPU (a device computed wrongly): NCCL refuses both with
// ncclInvalidUsage, "Duplicate GPU detected", and the others wait in the rest of the init,
// which the refused ranks never join, until aborted. The sim had let them all in.
TEST(Lifecycle, TwoRanksOnOneGpuAreRefusedAndTheOthersWaitInInit) {
  const auto result = run(3, [](const RankContext& c) {
    if (c.rank == 2) cudaSetDevice(1);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = c.rank == 0 ? 0 : 1;
    ncclComm_t comm = nullptr;
    const ncclResult_t started = ncclCommInitRankConfig(&comm, c.nranks, c.id, c.rank, &config);
    if (c.rank != 0) {
      SIMTEST_CHECK(started == ncclInvalidUsage, c, "a rank on a shared GPU is refused");
      const std::string expected = "Duplicate GPU detected : rank " + std::to_string(c.rank) +
                                   " and rank " + std::to_string(3 - c.rank) +
                                   " both on CUDA device 1000";
      SIMTEST_CHECK(std::string(ncclGetLastError(nullptr)) == expected, c,
                    std::string("last error: ") + ncclGetLastError(nullptr));
      return 0;
    }
    SIMTEST_CHECK(started == ncclInProgress, c, "non-blocking init returns ncclInProgress");
    ncclResult_t state = ncclInProgress;
    const double deadline = simtest::nowSeconds() + 0.5;
    while (state == ncclInProgress && simtest::nowSeconds() < deadline) {
      SIMTEST_NCCL(ncclCommGetAsyncError(comm, &state), c);
      sleepMs(5);
    }
    SIMTEST_CHECK(state == ncclInProgress, c, "the init of the others never completes");
    SIMTEST_NCCL(ncclCommAbort(comm), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Lifecycle, NonBlockingInitSplitAndFinalize) {
  const auto result = run(2, [](const RankContext& c) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "nb";
    ncclComm_t comm = nullptr;
    if (c.rank == 1) sleepMs(200);  // rank 0's init must stay in progress meanwhile
    const ncclResult_t started = ncclCommInitRankConfig(&comm, c.nranks, c.id, c.rank, &config);
    SIMTEST_CHECK(started == ncclInProgress, c, "non-blocking init returns ncclInProgress");
    ncclResult_t state = ncclInProgress;
    if (c.rank == 0) {
      SIMTEST_NCCL(ncclCommGetAsyncError(comm, &state), c);
      SIMTEST_CHECK(state == ncclInProgress, c, "still in progress while rank 1 sleeps");
    }
    const double deadline = simtest::nowSeconds() + 5;
    while (state == ncclInProgress && simtest::nowSeconds() < deadline) {
      SIMTEST_NCCL(ncclCommGetAsyncError(comm, &state), c);
      sleepMs(5);
    }
    SIMTEST_CHECK(state == ncclSuccess, c, "init completes");
    ncclComm_t child = nullptr;
    const ncclResult_t split = ncclCommSplit(comm, 0, c.rank, &child, nullptr);
    SIMTEST_CHECK(split == ncclInProgress || split == ncclSuccess, c, "split");
    do {
      SIMTEST_NCCL(ncclCommGetAsyncError(child, &state), c);
      sleepMs(2);
    } while (state == ncclInProgress);
    SIMTEST_CHECK(state == ncclSuccess, c, "split completes");
    float* value = deviceArray(std::vector<float>{1.5f});
    SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclFloat, ncclSum, child, nullptr), c);
    SIMTEST_CHECK(ncclCommFinalize(child) == ncclInProgress, c, "finalize in progress");
    do {
      SIMTEST_NCCL(ncclCommGetAsyncError(child, &state), c);
      sleepMs(2);
    } while (state == ncclInProgress);
    SIMTEST_CHECK(hostCopy(value, 1)[0] == 3.0f, c, "allreduce done by finalize");
    SIMTEST_NCCL(ncclCommDestroy(child), c);
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Hangs, AbortEndsAMissingRankHangWithLowCpu) {
  const auto result = run(4, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    if (c.rank == 3) {
      sleepMs(1500);  // alive, but never calls the collective
      return 0;
    }
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    float* value = deviceArray(std::vector<float>(16, 1.0f));
    SIMTEST_NCCL(ncclAllReduce(value, value, 16, ncclFloat, ncclSum, comm, stream), c);
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    SIMTEST_CHECK(!simtest::streamDrainsWithin(stream, 1.0), c, "hangs");
    getrusage(RUSAGE_SELF, &after);
    const double cpu = (after.ru_utime.tv_sec - before.ru_utime.tv_sec) +
                       (after.ru_stime.tv_sec - before.ru_stime.tv_sec) +
                       1e-6 * ((after.ru_utime.tv_usec - before.ru_utime.tv_usec) +
                               (after.ru_stime.tv_usec - before.ru_stime.tv_usec));
    SIMTEST_CHECK(cpu < 0.1, c, "waiting uses near-zero CPU, used " + std::to_string(cpu) + " s");
    return expectHangThenAbort(c, comm, stream, 0.0);
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Hangs, MismatchWaitsAndDebugNamesBothSides) {
  const auto result =
      run(2,
          [](const RankContext& c) {
            ncclComm_t comm = simtest::initComm(c);
            SIMTEST_CHECK(comm != nullptr, c, "init");
            cudaStream_t stream;
            cudaStreamCreate(&stream);
            float* value = deviceArray(std::vector<float>(4096, 1.0f));
            if (c.rank == 0)
              SIMTEST_NCCL(ncclAllReduce(value, value, 4096, ncclFloat, ncclSum, comm, stream), c);
            else
              SIMTEST_NCCL(ncclBroadcast(value, value, 4096, ncclFloat, 0, comm, stream), c);
            return expectHangThenAbort(c, comm, stream);
          },
          {{"NCCLSIM_DEBUG", "1"}});
  ASSERT_TRUE(result.allExitedZero()) << result.summary();
  EXPECT_NE(result.err[0].find("coll #1 AllReduce(4096 x float sum) waits: mismatch with rank 1 "
                               "Broadcast(4096 x float root=0)"),
            std::string::npos)
      << result.err[0];
  EXPECT_NE(result.err[1].find("waits: mismatch with rank 0 AllReduce"), std::string::npos)
      << result.err[1];
}

TEST(Hangs, MissingPeerDebugLineNamesTheMissingRanks) {
  const auto result =
      run(3,
          [](const RankContext& c) {
            ncclComm_t comm = simtest::initComm(c);
            SIMTEST_CHECK(comm != nullptr, c, "init");
            if (c.rank == 1) {
              sleepMs(800);
              return 0;
            }
            cudaStream_t stream;
            cudaStreamCreate(&stream);
            int* value = deviceArray(std::vector<int>{1});
            SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, comm, stream), c);
            return expectHangThenAbort(c, comm, stream, 0.5);
          },
          {{"NCCLSIM_DEBUG", "1"}, {"NCCLSIM_DEBUG_WAIT_MS", "100"}});
  ASSERT_TRUE(result.allExitedZero()) << result.summary();
  EXPECT_NE(result.err[0].find("waits: 2/3 arrived, missing ranks 1"), std::string::npos)
      << result.err[0];
}

TEST(Hangs, CorruptModeLetsEqualSizedMismatchesThrough) {
  const auto result =
      run(2,
          [](const RankContext& c) {
            ncclComm_t comm = simtest::initComm(c);
            SIMTEST_CHECK(comm != nullptr, c, "init");
            float* value = deviceArray(std::vector<float>{c.rank == 0 ? 2.0f : 5.0f});
            // Same bytes, different redop: each rank applies its own.
            SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclFloat, c.rank == 0 ? ncclSum : ncclMax,
                                       comm, nullptr),
                         c);
            cudaDeviceSynchronize();
            SIMTEST_CHECK(hostCopy(value, 1)[0] == (c.rank == 0 ? 7.0f : 5.0f), c,
                          "each rank's own interpretation");
            // Different byte sizes still hang.
            cudaStream_t stream;
            cudaStreamCreate(&stream);
            double* wide = deviceArray(std::vector<double>{1.0});
            SIMTEST_NCCL(ncclAllReduce(wide, wide, 1, c.rank == 0 ? ncclFloat : ncclFloat64,
                                       ncclSum, comm, stream),
                         c);
            return expectHangThenAbort(c, comm, stream);
          },
          {{"NCCLSIM_MISMATCH", "corrupt"}});
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Faults, SlowRankIsSlowerButCorrect) {
  const auto result =
      run(2,
          [](const RankContext& c) {
            ncclComm_t comm = simtest::initComm(c);
            SIMTEST_CHECK(comm != nullptr, c, "init");
            int* value = deviceArray(std::vector<int>{c.rank + 1});
            const double start = simtest::nowSeconds();
            SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, comm, nullptr), c);
            cudaDeviceSynchronize();
            SIMTEST_CHECK(simtest::nowSeconds() - start >= 0.25, c, "delayed by the slow rank");
            SIMTEST_CHECK(hostCopy(value, 1)[0] == 3, c, "correct");
            SIMTEST_NCCL(ncclCommDestroy(comm), c);
            return 0;
          },
          {{"NCCLSIM_FAULT", "slow:rank=1,us=300000"}});
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Faults, StallAtSeqHangsThatOperation) {
  const auto result =
      run(2,
          [](const RankContext& c) {
            ncclComm_t comm = simtest::initComm(c);
            SIMTEST_CHECK(comm != nullptr, c, "init");
            cudaStream_t stream;
            cudaStreamCreate(&stream);
            int* value = deviceArray(std::vector<int>{1});
            SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, comm, stream), c);
            SIMTEST_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, c, "seq 1 completes");
            SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, comm, stream), c);
            return expectHangThenAbort(c, comm, stream);
          },
          {{"NCCLSIM_FAULT", "stall:rank=0,seq=2"}});
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Faults, CrashAtSeqKillsThatRank) {
  const auto result =
      run(2,
          [](const RankContext& c) {
            ncclComm_t comm = simtest::initComm(c);
            SIMTEST_CHECK(comm != nullptr, c, "init");
            cudaStream_t stream;
            cudaStreamCreate(&stream);
            int* value = deviceArray(std::vector<int>{1});
            SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, comm, stream), c);
            SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, comm, stream),
                         c);  // rank 1 dies here
            return expectHangThenAbort(c, comm, stream);
          },
          {{"NCCLSIM_FAULT", "crash:rank=1,seq=2"}});
  EXPECT_EQ(result.exitCodes[0], 0) << result.summary();
  // A plain run dies of SIGSEGV; under ASan or TSan the sanitizer's SEGV handler reports and
  // exits non-zero instead.
  EXPECT_NE(result.exitCodes[1], 0) << result.summary();
  EXPECT_NE(result.err[1].find("crashing at seq 2"), std::string::npos) << result.err[1];
  if (result.err[1].find("Sanitizer") == std::string::npos) {
    EXPECT_EQ(result.exitCodes[1], 128 + SIGSEGV);
  }
}

TEST(Faults, NetErrorSetsAsyncErrorAndHangs) {
  for (const char* kind : {"remote", "system"}) {
    const bool system = std::string(kind) == "system";
    const auto result =
        run(2,
            [system](const RankContext& c) {
              ncclComm_t comm = simtest::initComm(c);
              SIMTEST_CHECK(comm != nullptr, c, "init");
              cudaStream_t stream;
              cudaStreamCreate(&stream);
              int* value = deviceArray(std::vector<int>{1});
              SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, comm, stream), c);
              SIMTEST_CHECK(!simtest::streamDrainsWithin(stream, 0.3), c, "hangs");
              ncclResult_t error = ncclSuccess;
              SIMTEST_NCCL(ncclCommGetAsyncError(comm, &error), c);
              const ncclResult_t want =
                  c.rank == 0 ? (system ? ncclSystemError : ncclRemoteError) : ncclSuccess;
              SIMTEST_CHECK(error == want, c, "async error " + std::to_string(error));
              return expectHangThenAbort(c, comm, stream, 0.0);
            },
            {{"NCCLSIM_FAULT", std::string("neterror:rank=0,seq=1,error=") + kind}});
    EXPECT_TRUE(result.allExitedZero()) << kind << "\n" << result.summary();
  }
}

TEST(Faults, CommIndexSelectsTheSplitChild) {
  const auto result =
      run(2,
          [](const RankContext& c) {
            ncclComm_t world = simtest::initComm(c);
            SIMTEST_CHECK(world != nullptr, c, "init");
            ncclComm_t child = nullptr;
            SIMTEST_NCCL(ncclCommSplit(world, 0, c.rank, &child, nullptr), c);
            cudaStream_t stream;
            cudaStreamCreate(&stream);
            int* value = deviceArray(std::vector<int>{1});
            SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, world, stream),
                         c);  // world seq 2: fine
            SIMTEST_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, c, "world unaffected");
            SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, child, stream),
                         c);  // comm 1 seq 1
            const int code = expectHangThenAbort(c, child, stream);
            ncclCommDestroy(world);
            return code;
          },
          {{"NCCLSIM_FAULT", "stall:rank=1,seq=1,comm=1"}});
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Instant, CompletesWithoutPeers) {
  const auto result =
      run(2,
          [](const RankContext& c) {
            ncclComm_t comm = simtest::initComm(c);
            SIMTEST_CHECK(comm != nullptr, c, "init");
            if (c.rank == 0) {
              int* value = deviceArray(std::vector<int>{5});
              for (int i = 0; i < 100; ++i)
                SIMTEST_NCCL(ncclAllReduce(value, value, 1, ncclInt32, ncclSum, comm, nullptr), c);
              SIMTEST_CHECK(cudaDeviceSynchronize() == cudaSuccess, c, "sync");
              SIMTEST_CHECK(hostCopy(value, 1)[0] == 5, c, "no data moved");
            }
            SIMTEST_NCCL(ncclCommDestroy(comm), c);
            return 0;
          },
          {{"NCCLSIM_INSTANT", "1"}});
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Api, ErrorsGettersRevokeAndRegistration) {
  const auto result = run(2, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    int version = 0, device = -1, count = 0, rank = -1;
    SIMTEST_NCCL(ncclGetVersion(&version), c);
    SIMTEST_CHECK(version == 22809, c, "version");
    SIMTEST_NCCL(ncclCommCuDevice(comm, &device), c);
    SIMTEST_CHECK(device == c.rank % 8, c, "device");
    SIMTEST_NCCL(ncclCommCount(comm, &count), c);
    SIMTEST_NCCL(ncclCommUserRank(comm, &rank), c);
    SIMTEST_CHECK(count == 2 && rank == c.rank, c, "count and rank");
    std::vector<float> hostBuffer(4);
    SIMTEST_CHECK(ncclAllReduce(hostBuffer.data(), hostBuffer.data(), 4, ncclFloat, ncclSum, comm,
                                nullptr) == ncclInvalidArgument,
                  c, "host pointers are rejected");
    SIMTEST_CHECK(
        std::string(ncclGetLastError(comm)).find("not device memory") != std::string::npos, c,
        "last error text");
    SIMTEST_CHECK(
        ncclBroadcast(nullptr, nullptr, 1, ncclFloat, 5, comm, nullptr) == ncclInvalidArgument, c,
        "root range");
    SIMTEST_CHECK(std::string(ncclGetErrorString(ncclInProgress)) == "NCCL operation in progress",
                  c, "strings");
    void* memory = nullptr;
    SIMTEST_NCCL(ncclMemAlloc(&memory, 8192), c);
    void* handle = nullptr;
    SIMTEST_NCCL(ncclCommRegister(comm, memory, 8192, &handle), c);
    SIMTEST_NCCL(ncclCommDeregister(comm, handle), c);
    ncclWindow_t window = nullptr;
    SIMTEST_NCCL(ncclCommWindowRegister(comm, memory, 8192, &window, NCCL_WIN_DEFAULT), c);
    SIMTEST_NCCL(ncclCommWindowDeregister(comm, window), c);
    SIMTEST_CHECK(ncclCommRegister(comm, hostBuffer.data(), 16, &handle) == ncclInvalidArgument, c,
                  "host register");
    SIMTEST_NCCL(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), c);
    SIMTEST_CHECK(
        ncclAllReduce(memory, memory, 1, ncclFloat, ncclSum, comm, nullptr) == ncclInvalidUsage, c,
        "revoked");
    SIMTEST_NCCL(ncclMemFree(memory), c);
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Api, InitAllInOneProcess) {
  const auto result = run(1, [](const RankContext& c) {
    ncclComm_t comms[2] = {};
    int devices[2] = {3, 5};
    SIMTEST_NCCL(ncclCommInitAll(comms, 2, devices), c);
    int device = 0;
    SIMTEST_NCCL(ncclCommCuDevice(comms[1], &device), c);
    SIMTEST_CHECK(device == 5, c, "devlist order");
    cudaStream_t streams[2];
    int* values[2];
    for (int i = 0; i < 2; ++i) {
      cudaSetDevice(devices[i]);
      cudaStreamCreate(&streams[i]);
      values[i] = deviceArray(std::vector<int>{i + 1});
    }
    SIMTEST_NCCL(ncclGroupStart(), c);
    for (int i = 0; i < 2; ++i)
      SIMTEST_NCCL(ncclAllReduce(values[i], values[i], 1, ncclInt32, ncclSum, comms[i], streams[i]),
                   c);
    SIMTEST_NCCL(ncclGroupEnd(), c);
    for (int i = 0; i < 2; ++i) {
      cudaStreamSynchronize(streams[i]);
      SIMTEST_CHECK(hostCopy(values[i], 1)[0] == 3, c, "single-process allreduce");
      SIMTEST_NCCL(ncclCommDestroy(comms[i]), c);
    }
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Api, DeviceApiHostSide) {
  const auto result = run(2, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    SIMTEST_CHECK(ncclDevCommCreate(comm, nullptr, nullptr) == ncclInvalidUsage, c,
                  "no device comms");
    SIMTEST_CHECK(
        std::string(ncclGetLastError(comm)).find("no device kernels") != std::string::npos, c,
        "text");
    const ncclTeam_t world = ncclTeamWorld(comm);
    SIMTEST_CHECK(world.nRanks == 2 && world.rank == c.rank && world.stride == 1, c, "world team");
    const ncclTeam_t rail = ncclTeamRail(comm);
    SIMTEST_CHECK(rail.nRanks == 1 && rail.rank == 0, c, "rail team on one node");
    SIMTEST_CHECK(ncclTeamRankToWorld(comm, world, 1 - c.rank) == 1 - c.rank, c,
                  "team rank to world");
    ncclLsaBarrierHandle_t barrier{};
    ncclDevResourceRequirements_t requirement{};
    SIMTEST_NCCL(ncclLsaBarrierCreateRequirement(ncclTeamLsa(comm), 4, &barrier, &requirement), c);
    SIMTEST_CHECK(barrier.nBarriers == 4 && requirement.bufferSize > 0 &&
                      requirement.outBufferHandle == &barrier.bufHandle,
                  c, "lsa barrier requirement");
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

}  // namespace
