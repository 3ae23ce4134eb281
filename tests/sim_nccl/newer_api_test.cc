// The sim's NCCL 2.32 per-collective-config entry points (sim/nccl/newer_api.cc), compiled
// against PyPI's 2.32.3 nccl.h like a program that uses them: they move the same data as the
// plain collective, accept a NULL config, and refuse one not made with
// NCCL_COLLCONFIG_INITIALIZER. Two ranks in one process (ncclCommInitAll), on the sim's runtime.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <string>
#include <vector>

namespace {

constexpr int kRanks = 2;
constexpr size_t kCount = 256;

class ConfigCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(ncclCommInitAll(comms_, kRanks, nullptr), ncclSuccess);
    for (int rank = 0; rank < kRanks; ++rank) {
      ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
      ASSERT_EQ(cudaStreamCreate(&streams_[rank]), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&send_[rank], kCount * kRanks * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&recv_[rank], kCount * kRanks * sizeof(float)), cudaSuccess);
      std::vector<float> values(kCount * kRanks, static_cast<float>(rank + 1));
      ASSERT_EQ(cudaMemcpy(send_[rank], values.data(), values.size() * sizeof(float),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  void TearDown() override {
    for (int rank = 0; rank < kRanks; ++rank) {
      if (comms_[rank] != nullptr) ncclCommDestroy(comms_[rank]);
    }
  }
  std::vector<float> received(int rank, size_t count) {
    std::vector<float> values(count);
    EXPECT_EQ(cudaStreamSynchronize(streams_[rank]), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(values.data(), recv_[rank], count * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return values;
  }

  ncclComm_t comms_[kRanks] = {};
  cudaStream_t streams_[kRanks] = {};
  void* send_[kRanks] = {};
  void* recv_[kRanks] = {};
};

TEST_F(ConfigCollectives, AllReduceConfigSumsLikeAllReduce) {
  ncclCollConfig_t config = NCCL_COLLCONFIG_INITIALIZER;
  config.userProfilerTag = 7;
  config.maxCTAs = 4;  // tuning means nothing to the sim, and must not be refused
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int rank = 0; rank < kRanks; ++rank) {
    ASSERT_EQ(ncclAllReduceConfig(send_[rank], recv_[rank], kCount, ncclFloat, ncclSum,
                                  comms_[rank], streams_[rank], &config),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(received(rank, kCount), std::vector<float>(kCount, 3.0f)) << "rank " << rank;
  }
}

TEST_F(ConfigCollectives, NullConfigIsThePlainCall) {
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int rank = 0; rank < kRanks; ++rank) {
    ASSERT_EQ(ncclAllGatherConfig(send_[rank], recv_[rank], kCount, ncclFloat, comms_[rank],
                                  streams_[rank], nullptr),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  std::vector<float> expected(kCount, 1.0f);
  expected.insert(expected.end(), kCount, 2.0f);
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(received(rank, kCount * kRanks), expected) << "rank " << rank;
  }
}

TEST_F(ConfigCollectives, RefusesAConfigNotMadeByTheInitializer) {
  ncclCollConfig_t config{};  // zeros: no size, no magic
  EXPECT_EQ(ncclBroadcastConfig(send_[0], recv_[0], kCount, ncclFloat, 0, comms_[0], streams_[0],
                                &config),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comms_[0])).find("NCCL_COLLCONFIG_INITIALIZER"),
            std::string::npos)
      << ncclGetLastError(comms_[0]);
}

}  // namespace
