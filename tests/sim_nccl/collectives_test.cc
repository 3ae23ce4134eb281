// Every collective x every datatype x every reduction at 2, 4 and 8 ranks, with exact results:
// each child computes the expected bytes with the reference reduction (checked on its own in
// unit_test.cc) and compares bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include "datatypes.h"
#include "harness.h"
#include "shm.h"

using ncclsim::CollKind;
using ncclsim::Reduction;
using ncclsim::Scalar;
using simtest::RankContext;

namespace {

constexpr size_t kCount = 3;

const ncclDataType_t kAllTypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                    ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                    ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};

enum class OpChoice { kSum, kProd, kMax, kMin, kAvg, kPreMulSumHost, kPreMulSumDevice };
const OpChoice kAllOps[] = {OpChoice::kSum,
                            OpChoice::kProd,
                            OpChoice::kMax,
                            OpChoice::kMin,
                            OpChoice::kAvg,
                            OpChoice::kPreMulSumHost,
                            OpChoice::kPreMulSumDevice};

bool isUnsigned(ncclDataType_t t) {
  return t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
}
bool isFloat(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 ||
         t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}

// Rank r's send buffer: nonzero small values, so that products and maxima mean something.
std::vector<char> sendData(ncclDataType_t type, int rank, size_t elements) {
  static const double kSigned[] = {-2, -1, 1, 2, 3};
  const size_t size = ncclsim::dataTypeSize(type);
  std::vector<char> bytes(elements * size);
  for (size_t i = 0; i < elements; ++i) {
    const int pick = static_cast<int>((rank * 7 + i * 3) % 5);
    const Scalar value =
        ncclsim::scalarFromDouble(type, isUnsigned(type) ? pick + 1 : kSigned[pick]);
    std::memcpy(bytes.data() + i * size, value.bytes, size);
  }
  return bytes;
}

Scalar preMulScalarOf(ncclDataType_t type, int rank) {
  return ncclsim::scalarFromDouble(type, rank % 3 + 1);
}

size_t sendElements(CollKind kind, int n, bool isRoot) {
  switch (kind) {
    case CollKind::kReduceScatter:
    case CollKind::kAlltoAll:
      return kCount * n;
    case CollKind::kScatter:
      return isRoot ? kCount * n : kCount;
    default:
      return kCount;
  }
}

size_t recvElements(CollKind kind, int n) {
  switch (kind) {
    case CollKind::kAllGather:
    case CollKind::kAlltoAll:
    case CollKind::kGather:
      return kCount * n;
    default:
      return kCount;
  }
}

std::vector<char> expectedOutput(CollKind kind, ncclDataType_t type, OpChoice choice, int rank,
                                 int n, int root, const std::vector<char>& untouched) {
  const size_t size = ncclsim::dataTypeSize(type);
  const size_t chunk = kCount * size;
  std::vector<std::vector<char>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(sendData(type, r, sendElements(kind, n, r == root)));
  auto reduceAt = [&](size_t offset) {
    std::vector<const void*> pointers;
    std::vector<Scalar> scalars;
    for (int r = 0; r < n; ++r) {
      pointers.push_back(inputs[r].data() + offset);
      scalars.push_back(preMulScalarOf(type, r));
    }
    Reduction reduction = Reduction::kSum;
    switch (choice) {
      case OpChoice::kSum:
        reduction = Reduction::kSum;
        break;
      case OpChoice::kProd:
        reduction = Reduction::kProd;
        break;
      case OpChoice::kMax:
        reduction = Reduction::kMax;
        break;
      case OpChoice::kMin:
        reduction = Reduction::kMin;
        break;
      case OpChoice::kAvg:
        if (isFloat(type)) {
          reduction = Reduction::kPreMulSum;
          for (Scalar& s : scalars) s = ncclsim::averageScalar(type, n);
        } else {
          reduction = Reduction::kSumPostDiv;
        }
        break;
      default:
        reduction = Reduction::kPreMulSum;
        break;
    }
    std::vector<char> out(chunk);
    ncclsim::reduceElements(type, reduction, pointers.data(), scalars.data(), n, kCount,
                            out.data());
    return out;
  };
  switch (kind) {
    case CollKind::kAllReduce:
      return reduceAt(0);
    case CollKind::kReduce:
      return rank == root ? reduceAt(0) : untouched;
    case CollKind::kReduceScatter:
      return reduceAt(rank * chunk);
    case CollKind::kBroadcast:
      return std::vector<char>(inputs[root].begin(), inputs[root].begin() + chunk);
    case CollKind::kScatter:
      return std::vector<char>(inputs[root].begin() + rank * chunk,
                               inputs[root].begin() + (rank + 1) * chunk);
    case CollKind::kAllGather:
    case CollKind::kGather: {
      if (kind == CollKind::kGather && rank != root) return untouched;
      std::vector<char> out;
      for (int r = 0; r < n; ++r)
        out.insert(out.end(), inputs[r].begin(), inputs[r].begin() + chunk);
      return out;
    }
    case CollKind::kAlltoAll: {
      std::vector<char> out;
      for (int r = 0; r < n; ++r)
        out.insert(out.end(), inputs[r].begin() + rank * chunk,
                   inputs[r].begin() + (rank + 1) * chunk);
      return out;
    }
  }
  return {};
}

ncclResult_t launch(CollKind kind, const void* send, void* recv, ncclDataType_t type,
                    ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  switch (kind) {
    case CollKind::kAllReduce:
      return ncclAllReduce(send, recv, kCount, type, op, comm, stream);
    case CollKind::kBroadcast:
      return ncclBroadcast(send, recv, kCount, type, root, comm, stream);
    case CollKind::kReduce:
      return ncclReduce(send, recv, kCount, type, op, root, comm, stream);
    case CollKind::kAllGather:
      return ncclAllGather(send, recv, kCount, type, comm, stream);
    case CollKind::kReduceScatter:
      return ncclReduceScatter(send, recv, kCount, type, op, comm, stream);
    case CollKind::kAlltoAll:
      return ncclAlltoAll(send, recv, kCount, type, comm, stream);
    case CollKind::kGather:
      return ncclGather(send, recv, kCount, type, root, comm, stream);
    case CollKind::kScatter:
      return ncclScatter(send, recv, kCount, type, root, comm, stream);
  }
  return ncclInternalError;
}

int runMatrix(const RankContext& context, CollKind kind) {
  ncclComm_t comm = simtest::initComm(context);
  SIMTEST_CHECK(comm != nullptr, context, "init");
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  const int n = context.nranks;
  const int root = n - 1;
  const bool reduces = ncclsim::collKindReduces(kind);
  for (ncclDataType_t type : kAllTypes) {
    for (OpChoice choice : kAllOps) {
      if (!reduces && choice != OpChoice::kSum) continue;
      const size_t size = ncclsim::dataTypeSize(type);
      const std::vector<char> input =
          sendData(type, context.rank, sendElements(kind, n, context.rank == root));
      const size_t recvBytes = recvElements(kind, n) * size;
      const std::vector<char> untouched(recvBytes, 0x5a);
      void *send = nullptr, *recv = nullptr, *deviceScalar = nullptr;
      cudaMalloc(&send, input.size());
      cudaMalloc(&recv, recvBytes);
      cudaMemcpy(send, input.data(), input.size(), cudaMemcpyHostToDevice);
      cudaMemcpy(recv, untouched.data(), recvBytes, cudaMemcpyHostToDevice);
      ncclRedOp_t op = ncclSum;
      Scalar scalar = preMulScalarOf(type, context.rank);
      switch (choice) {
        case OpChoice::kSum:
          op = ncclSum;
          break;
        case OpChoice::kProd:
          op = ncclProd;
          break;
        case OpChoice::kMax:
          op = ncclMax;
          break;
        case OpChoice::kMin:
          op = ncclMin;
          break;
        case OpChoice::kAvg:
          op = ncclAvg;
          break;
        case OpChoice::kPreMulSumHost:
          SIMTEST_NCCL(
              ncclRedOpCreatePreMulSum(&op, scalar.bytes, type, ncclScalarHostImmediate, comm),
              context);
          break;
        case OpChoice::kPreMulSumDevice:
          cudaMalloc(&deviceScalar, size);
          cudaMemcpy(deviceScalar, scalar.bytes, size, cudaMemcpyHostToDevice);
          SIMTEST_NCCL(ncclRedOpCreatePreMulSum(&op, deviceScalar, type, ncclScalarDevice, comm),
                       context);
          break;
      }
      SIMTEST_NCCL(launch(kind, send, recv, type, op, root, comm, stream), context);
      SIMTEST_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, context, "stream sync");
      std::vector<char> got(recvBytes);
      cudaMemcpy(got.data(), recv, recvBytes, cudaMemcpyDeviceToHost);
      const std::vector<char> want =
          expectedOutput(kind, type, choice, context.rank, n, root, untouched);
      SIMTEST_CHECK(got == want, context,
                    std::string(ncclsim::collKindName(kind)) + " " + ncclsim::dataTypeName(type) +
                        " op choice " + std::to_string(static_cast<int>(choice)) +
                        ": wrong result");
      if (op >= ncclNumOps) SIMTEST_NCCL(ncclRedOpDestroy(op, comm), context);
      cudaFree(send);
      cudaFree(recv);
      if (deviceScalar) cudaFree(deviceScalar);
    }
  }
  SIMTEST_NCCL(ncclCommDestroy(comm), context);
  cudaStreamDestroy(stream);
  return 0;
}

class CollectiveMatrix : public ::testing::TestWithParam<std::tuple<int, CollKind>> {};

TEST_P(CollectiveMatrix, ExactForEveryTypeAndOp) {
  const auto [nranks, kind] = GetParam();
  simtest::JobOptions options;
  options.nranks = nranks;
  options.timeoutMs = 30000;
  const simtest::JobResult result =
      simtest::runJob(options, [kind = kind](const RankContext& c) { return runMatrix(c, kind); });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

INSTANTIATE_TEST_SUITE_P(
    Sim, CollectiveMatrix,
    ::testing::Combine(::testing::Values(2, 4, 8),
                       ::testing::Values(CollKind::kAllReduce, CollKind::kBroadcast,
                                         CollKind::kReduce, CollKind::kAllGather,
                                         CollKind::kReduceScatter, CollKind::kAlltoAll,
                                         CollKind::kGather, CollKind::kScatter)),
    [](const auto& info) {
      return std::string(ncclsim::collKindName(std::get<1>(info.param))) + "_" +
             std::to_string(std::get<0>(info.param)) + "ranks";
    });

// In-place forms, with NCCL's layouts: AllGather sends from recvbuff + rank*count, ReduceScatter
// receives into sendbuff + rank*recvcount, Bcast uses one buffer.
TEST(InPlace, AllReduceAllGatherReduceScatterBcast) {
  simtest::JobOptions options;
  options.nranks = 4;
  const auto result = simtest::runJob(options, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    const int n = c.nranks;
    float* buffer = nullptr;
    cudaMalloc(&buffer, sizeof(float) * n * 4);
    std::vector<float> host(n * 4);
    // AllReduce in place.
    for (int i = 0; i < 4; ++i) host[i] = static_cast<float>(c.rank + i);
    cudaMemcpy(buffer, host.data(), sizeof(float) * 4, cudaMemcpyHostToDevice);
    SIMTEST_NCCL(ncclAllReduce(buffer, buffer, 4, ncclFloat, ncclSum, comm, nullptr), c);
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), buffer, sizeof(float) * 4, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 4; ++i)
      SIMTEST_CHECK(host[i] == static_cast<float>(6 + 4 * i), c, "allreduce in place");
    // AllGather in place.
    float mine = static_cast<float>(10 * c.rank);
    cudaMemcpy(buffer + c.rank, &mine, sizeof mine, cudaMemcpyHostToDevice);
    SIMTEST_NCCL(ncclAllGather(buffer + c.rank, buffer, 1, ncclFloat, comm, nullptr), c);
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), buffer, sizeof(float) * n, cudaMemcpyDeviceToHost);
    for (int r = 0; r < n; ++r) SIMTEST_CHECK(host[r] == 10.0f * r, c, "allgather in place");
    // ReduceScatter in place.
    for (int i = 0; i < n; ++i) host[i] = static_cast<float>(i * 100 + c.rank);
    cudaMemcpy(buffer, host.data(), sizeof(float) * n, cudaMemcpyHostToDevice);
    SIMTEST_NCCL(ncclReduceScatter(buffer, buffer + c.rank, 1, ncclFloat, ncclSum, comm, nullptr),
                 c);
    cudaDeviceSynchronize();
    cudaMemcpy(&mine, buffer + c.rank, sizeof mine, cudaMemcpyDeviceToHost);
    SIMTEST_CHECK(mine == static_cast<float>(c.rank * 100 * n + 6), c, "reducescatter in place");
    // Bcast.
    mine = c.rank == 2 ? 42.0f : -1.0f;
    cudaMemcpy(buffer, &mine, sizeof mine, cudaMemcpyHostToDevice);
    SIMTEST_NCCL(ncclBcast(buffer, 1, ncclFloat, 2, comm, nullptr), c);
    cudaDeviceSynchronize();
    cudaMemcpy(&mine, buffer, sizeof mine, cudaMemcpyDeviceToHost);
    SIMTEST_CHECK(mine == 42.0f, c, "bcast");
    cudaFree(buffer);
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
}

TEST(Scale, SixtyFourRankAllReduceLoop) {
  simtest::JobOptions options;
  options.nranks = 64;
  options.timeoutMs = 60000;
  const auto result = simtest::runJob(options, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    int* value = nullptr;
    cudaMalloc(&value, sizeof(int) * 4);
    for (int step = 0; step < 5; ++step) {
      int host[4] = {c.rank, 1, step, -c.rank};
      cudaMemcpy(value, host, sizeof host, cudaMemcpyHostToDevice);
      SIMTEST_NCCL(ncclAllReduce(value, value, 4, ncclInt32, ncclSum, comm, nullptr), c);
      cudaMemcpy(host, value, sizeof host, cudaMemcpyDeviceToHost);
      SIMTEST_CHECK(host[0] == 64 * 63 / 2 && host[1] == 64 && host[2] == 64 * step &&
                        host[3] == -64 * 63 / 2,
                    c, "64-rank sum");
    }
    cudaFree(value);
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  EXPECT_TRUE(result.allExitedZero()) << result.summary();
  EXPECT_LT(result.seconds, 30.0);
}

}  // namespace
