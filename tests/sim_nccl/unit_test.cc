// Single-process tests of the sim NCCL's pure parts: converters, reductions, commHash, the
// environment parser and the profiler plugin name rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "comm_hash.h"
#include "config.h"
#include "datatypes.h"
#include "profiler_names.h"

namespace ncclsim {
namespace {

// Independent oracle for float -> bfloat16: the classic bit trick, correct for finite floats.
uint16_t bfloat16ByBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

TEST(Converters, HalfKnownValues) {
  EXPECT_EQ(encodeHalf(1.0), 0x3c00);
  EXPECT_EQ(encodeHalf(-2.0), 0xc000);
  EXPECT_EQ(encodeHalf(65504.0), 0x7bff);
  EXPECT_EQ(encodeHalf(65519.99), 0x7bff);
  EXPECT_EQ(encodeHalf(65520.0), 0x7c00);                     // ties to even overflows to infinity
  EXPECT_EQ(encodeHalf(std::ldexp(1.0, -24)), 0x0001);        // smallest subnormal
  EXPECT_EQ(encodeHalf(std::ldexp(1.0, -25)), 0x0000);        // tie to even: zero
  EXPECT_EQ(encodeHalf(std::ldexp(3.0, -25)), 0x0002);        // tie to even: two
  EXPECT_EQ(encodeHalf(1.0 + std::ldexp(1.0, -11)), 0x3c00);  // tie, even stays
  EXPECT_EQ(encodeHalf(1.0 + 3 * std::ldexp(1.0, -11)), 0x3c02);  // tie, rounds to even
  EXPECT_TRUE(std::isnan(decodeHalf(encodeHalf(NAN))));
  EXPECT_EQ(decodeHalf(0x7c00), INFINITY);
}

TEST(Converters, HalfRoundTripsEveryValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const double value = decodeHalf(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(encodeHalf(value), bits) << std::hex << bits;
  }
}

TEST(Converters, HalfMatchesCompilerFloat16) {
  std::mt19937_64 random(1);
  std::uniform_real_distribution<double> magnitude(-30, 17);
  for (int i = 0; i < 200000; ++i) {
    const double value =
        std::ldexp(1.0 + (random() % 1000000) / 1e6, static_cast<int>(magnitude(random))) *
        ((random() & 1) ? -1 : 1);
    const _Float16 reference = static_cast<_Float16>(value);
    uint16_t bits;
    std::memcpy(&bits, &reference, sizeof bits);
    ASSERT_EQ(encodeHalf(value), bits) << value;
  }
}

TEST(Converters, Bfloat16) {
  EXPECT_EQ(encodeBfloat16(1.0), 0x3f80);
  EXPECT_EQ(encodeBfloat16(-1.5), 0xbfc0);
  EXPECT_EQ(encodeBfloat16(1e39), 0x7f80);
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const double value = decodeBfloat16(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(encodeBfloat16(value), bits) << std::hex << bits;
  }
  std::mt19937 random(2);
  for (int i = 0; i < 200000; ++i) {
    uint32_t raw = random();
    float value;
    std::memcpy(&value, &raw, sizeof value);
    if (!std::isfinite(value) || std::fabs(value) > 3.38e38f) continue;
    ASSERT_EQ(encodeBfloat16(value), bfloat16ByBits(value)) << std::hex << raw;
  }
}

TEST(Converters, Fp8E4M3) {
  EXPECT_EQ(encodeFp8E4M3(1.0), 0x38);
  EXPECT_EQ(encodeFp8E4M3(448.0), 0x7e);
  EXPECT_EQ(encodeFp8E4M3(464.0), 0x7e);  // would round to 480 = NaN pattern: saturates
  EXPECT_EQ(encodeFp8E4M3(1e9), 0x7e);
  EXPECT_EQ(encodeFp8E4M3(-1e9), 0xfe);
  EXPECT_EQ(encodeFp8E4M3(INFINITY), 0x7e);
  EXPECT_EQ(encodeFp8E4M3(NAN), 0x7f);
  EXPECT_EQ(encodeFp8E4M3(std::ldexp(1.0, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(encodeFp8E4M3(1.0625), 0x38);               // tie to even (1.0)
  EXPECT_EQ(encodeFp8E4M3(1.1875), 0x3a);               // tie to even (1.25)
  for (uint32_t bits = 0; bits < 0x100; ++bits) {
    const double value = decodeFp8E4M3(static_cast<uint8_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(encodeFp8E4M3(value), bits) << std::hex << bits;
  }
}

TEST(Converters, Fp8E5M2) {
  EXPECT_EQ(encodeFp8E5M2(1.0), 0x3c);
  EXPECT_EQ(encodeFp8E5M2(57344.0), 0x7b);
  EXPECT_EQ(encodeFp8E5M2(1e9), 0x7b);
  EXPECT_EQ(encodeFp8E5M2(-INFINITY), 0xfb);
  EXPECT_EQ(encodeFp8E5M2(std::ldexp(1.0, -16)), 0x01);
  EXPECT_EQ(encodeFp8E5M2(1.125), 0x3c);  // tie to even
  for (uint32_t bits = 0; bits < 0x100; ++bits) {
    const double value = decodeFp8E5M2(static_cast<uint8_t>(bits));
    if (std::isnan(value) || std::isinf(value)) continue;
    ASSERT_EQ(encodeFp8E5M2(value), bits) << std::hex << bits;
  }
}

template <typename T>
std::vector<T> reduceVia(ncclDataType_t type, Reduction reduction,
                         const std::vector<std::vector<T>>& inputs,
                         const std::vector<Scalar>& scalars = {}) {
  std::vector<const void*> pointers;
  for (auto& input : inputs) pointers.push_back(input.data());
  std::vector<Scalar> factors = scalars;
  factors.resize(inputs.size());
  std::vector<T> out(inputs[0].size());
  reduceElements(type, reduction, pointers.data(), factors.data(), static_cast<int>(inputs.size()),
                 out.size(), out.data());
  return out;
}

TEST(Reductions, IntegersWrapAndCompare) {
  std::vector<std::vector<int8_t>> in = {{100, -5, 7}, {100, 3, -7}, {-1, 1, 2}};
  EXPECT_EQ(reduceVia<int8_t>(ncclInt8, Reduction::kSum, in), (std::vector<int8_t>{-57, -1, 2}));
  EXPECT_EQ(reduceVia<int8_t>(ncclInt8, Reduction::kProd, in),
            (std::vector<int8_t>{static_cast<int8_t>(-10000), -15, -98}));
  EXPECT_EQ(reduceVia<int8_t>(ncclInt8, Reduction::kMax, in), (std::vector<int8_t>{100, 3, 7}));
  EXPECT_EQ(reduceVia<int8_t>(ncclInt8, Reduction::kMin, in), (std::vector<int8_t>{-1, -5, -7}));
  std::vector<std::vector<uint32_t>> u = {{7, 0xffffffffu}, {2, 3}};
  EXPECT_EQ(reduceVia<uint32_t>(ncclUint32, Reduction::kSum, u), (std::vector<uint32_t>{9, 2}));
  EXPECT_EQ(reduceVia<uint32_t>(ncclUint32, Reduction::kSumPostDiv, u),
            (std::vector<uint32_t>{4, 1}));
  std::vector<std::vector<int64_t>> s = {{-7, 9}, {2, 0}};
  EXPECT_EQ(reduceVia<int64_t>(ncclInt64, Reduction::kSumPostDiv, s),
            (std::vector<int64_t>{-2, 4}));
  std::vector<std::vector<uint64_t>> big = {{3}, {5}};
  EXPECT_EQ(
      reduceVia<uint64_t>(ncclUint64, Reduction::kPreMulSum, big,
                          {scalarFromDouble(ncclUint64, 2), scalarFromDouble(ncclUint64, 10)}),
      (std::vector<uint64_t>{56}));
}

TEST(Reductions, FloatsRoundAfterEveryStepInRankOrder) {
  // 1e8 + 1 - 1e8 in float: the 1 is lost at the first step, so the rank order is visible.
  std::vector<std::vector<float>> in = {{1e8f}, {1.0f}, {-1e8f}};
  EXPECT_EQ(reduceVia<float>(ncclFloat32, Reduction::kSum, in)[0], 0.0f);
  std::vector<std::vector<float>> reordered = {{1e8f}, {-1e8f}, {1.0f}};
  EXPECT_EQ(reduceVia<float>(ncclFloat32, Reduction::kSum, reordered)[0], 1.0f);
  std::vector<std::vector<double>> d = {{1.5, -2}, {2.5, 8}};
  EXPECT_EQ(reduceVia<double>(ncclFloat64, Reduction::kProd, d), (std::vector<double>{3.75, -16}));
  EXPECT_EQ(reduceVia<double>(ncclFloat64, Reduction::kMin, d), (std::vector<double>{1.5, -2}));
  EXPECT_EQ(reduceVia<double>(ncclFloat64, Reduction::kMax, d), (std::vector<double>{2.5, 8}));
}

TEST(Reductions, HalfMatchesStepwiseFloat16Arithmetic) {
  std::mt19937 random(3);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 2 + trial % 7;
    std::vector<std::vector<uint16_t>> in(n, std::vector<uint16_t>(1));
    _Float16 sum = 0, product = 1, maximum = -65504, minimum = 65504;
    for (int r = 0; r < n; ++r) {
      const _Float16 value = static_cast<_Float16>(
          static_cast<float>(static_cast<int>(random() % 2001) - 1000) / 64.0f);
      std::memcpy(&in[r][0], &value, 2);
      sum = r == 0 ? value : static_cast<_Float16>(sum + value);
      product = r == 0 ? value : static_cast<_Float16>(product * value);
      maximum = value > maximum ? value : maximum;
      minimum = value < minimum ? value : minimum;
    }
    // NaN payloads and signs are not part of the contract: compare every NaN as one value.
    auto bits = [](_Float16 v) {
      uint16_t b;
      std::memcpy(&b, &v, 2);
      return v != v ? uint16_t{0x7e00} : b;
    };
    auto canonical = [](uint16_t b) { return std::isnan(decodeHalf(b)) ? uint16_t{0x7e00} : b; };
    ASSERT_EQ(canonical(reduceVia<uint16_t>(ncclFloat16, Reduction::kSum, in)[0]), bits(sum));
    ASSERT_EQ(canonical(reduceVia<uint16_t>(ncclFloat16, Reduction::kProd, in)[0]), bits(product));
    ASSERT_EQ(canonical(reduceVia<uint16_t>(ncclFloat16, Reduction::kMax, in)[0]), bits(maximum));
    ASSERT_EQ(canonical(reduceVia<uint16_t>(ncclFloat16, Reduction::kMin, in)[0]), bits(minimum));
  }
}

TEST(Reductions, Bfloat16AndFp8SumSaturateAndRound) {
  // bfloat16: 256 + 1 is a tie between 256 and 258: even mantissa keeps 256.
  std::vector<std::vector<uint16_t>> b = {
      {encodeBfloat16(256)}, {encodeBfloat16(1)}, {encodeBfloat16(1)}};
  EXPECT_EQ(decodeBfloat16(reduceVia<uint16_t>(ncclBfloat16, Reduction::kSum, b)[0]), 256.0);
  // e4m3 saturates instead of overflowing.
  std::vector<std::vector<uint8_t>> e4 = {{encodeFp8E4M3(448)}, {encodeFp8E4M3(448)}};
  EXPECT_EQ(reduceVia<uint8_t>(ncclFloat8e4m3, Reduction::kSum, e4)[0], 0x7e);
  EXPECT_EQ(reduceVia<uint8_t>(ncclFloat8e4m3, Reduction::kProd, e4)[0], 0x7e);
  std::vector<std::vector<uint8_t>> e5 = {
      {encodeFp8E5M2(3)}, {encodeFp8E5M2(-5)}, {encodeFp8E5M2(2)}};
  EXPECT_EQ(decodeFp8E5M2(reduceVia<uint8_t>(ncclFloat8e5m2, Reduction::kSum, e5)[0]), 0.0);
  EXPECT_EQ(decodeFp8E5M2(reduceVia<uint8_t>(ncclFloat8e5m2, Reduction::kMin, e5)[0]), -5.0);
  // 3 * -5 = -15 is a tie between -14 and -16; ties to even gives -16, then * 2 = -32.
  EXPECT_EQ(decodeFp8E5M2(reduceVia<uint8_t>(ncclFloat8e5m2, Reduction::kProd, e5)[0]), -32.0);
}

TEST(Reductions, PreMulSumScalesEachRankByItsOwnScalar) {
  std::vector<std::vector<float>> in = {{1, 2}, {3, 4}};
  const auto out =
      reduceVia<float>(ncclFloat32, Reduction::kPreMulSum, in,
                       {scalarFromDouble(ncclFloat32, 0.5), scalarFromDouble(ncclFloat32, 2)});
  EXPECT_EQ(out, (std::vector<float>{6.5f, 9.0f}));
  // Float Avg is PreMulSum by 1/n rounded to the element type.
  Scalar third = averageScalar(ncclFloat16, 3);
  uint16_t bits;
  std::memcpy(&bits, third.bytes, 2);
  EXPECT_EQ(bits, encodeHalf(static_cast<float>(1.0 / 3)));
}

TEST(CommHash, MatchesHandDerivedVectors) {
  unsigned char id[128];
  for (int i = 0; i < 128; ++i) id[i] = static_cast<unsigned char>(i);
  const uint64_t root = rootCommHash(id, sizeof id);
  EXPECT_EQ(root, 0x6afe1cc17717e1f4ull);
  EXPECT_EQ(childCommHash(root, 1, 3), 0x221160334d3def2eull);
  EXPECT_EQ(childCommHash(root, 0, 0), 0x3ab8d78e8fb6dbdaull);
  EXPECT_EQ(rootCommHash("abc", 3), 0x751c1b124ef01f18ull);
}

TEST(Config, ParsesFaults) {
  std::vector<Fault> faults;
  std::string error;
  ASSERT_TRUE(
      parseFaults("slow:rank=1,us=500;stall:rank=2,seq=7,comm=1;neterror:rank=0,seq=3,error=system",
                  &faults, &error))
      << error;
  ASSERT_EQ(faults.size(), 3u);
  EXPECT_EQ(faults[0].kind, FaultKind::kSlow);
  EXPECT_EQ(faults[0].delayUs, 500u);
  EXPECT_EQ(faults[1].kind, FaultKind::kStall);
  EXPECT_EQ(faults[1].seq, 7u);
  EXPECT_EQ(faults[1].commIndex, 1);
  EXPECT_TRUE(faults[2].systemError);
  faults.clear();
  EXPECT_FALSE(parseFaults("explode:rank=1", &faults, &error));
  EXPECT_NE(error.find("explode"), std::string::npos);
  EXPECT_FALSE(parseFaults("crash:seq=3", &faults, &error));
  EXPECT_FALSE(parseFaults("crash:rank=1,seq=0", &faults, &error));
  EXPECT_FALSE(parseFaults("crash:rank=x", &faults, &error));
}

TEST(Config, ReadsEnvironmentThroughLookup) {
  static std::map<std::string, std::string> env;
  env = {{"NCCLSIM_MISMATCH", "corrupt"},
         {"NCCLSIM_INSTANT", "1"},
         {"NCCLSIM_DEBUG", "1"},
         {"NCCLSIM_DEBUG_WAIT_MS", "50"},
         {"NCCLSIM_FAULT", "crash:rank=3,seq=2"}};
  const SimConfig config = parseSimConfig([](const char* name) -> const char* {
    auto found = env.find(name);
    return found == env.end() ? nullptr : found->second.c_str();
  });
  EXPECT_TRUE(config.mismatchCorrupt);
  EXPECT_TRUE(config.instant);
  EXPECT_TRUE(config.debug);
  EXPECT_EQ(config.debugWaitMs, 50);
  ASSERT_EQ(config.faults.size(), 1u);
  EXPECT_EQ(config.faults[0].rank, 3);
}

TEST(ProfilerNames, FollowsNccl228Rules) {
  auto names = [](const char* env) {
    std::vector<std::string> out;
    for (auto& candidate : planProfilerPluginLoad(env).candidates)
      out.push_back(candidate ? *candidate : "<global>");
    return out;
  };
  EXPECT_TRUE(planProfilerPluginLoad("none").disabled);
  EXPECT_TRUE(planProfilerPluginLoad("NoNe").disabled);
  EXPECT_EQ(names(nullptr), (std::vector<std::string>{"libnccl-profiler.so"}));
  EXPECT_EQ(names(""), (std::vector<std::string>{"libnccl-profiler.so"}));
  EXPECT_EQ(names("mytool"), (std::vector<std::string>{"mytool", "libnccl-profiler-mytool.so"}));
  EXPECT_EQ(names("/opt/x/libfoo.so"), (std::vector<std::string>{"/opt/x/libfoo.so"}));
  EXPECT_EQ(names("libfoo.so"), (std::vector<std::string>{"libfoo.so"}));
  EXPECT_EQ(names("libfoo.so.1"),
            (std::vector<std::string>{"libfoo.so.1", "libnccl-profiler-libfoo.so.1.so"}));
  EXPECT_EQ(names("STATIC_PLUGIN"),
            (std::vector<std::string>{"<global>", "libnccl-profiler-STATIC_PLUGIN.so"}));
  EXPECT_EQ(names("static"), (std::vector<std::string>{"<global>", "libnccl-profiler-static.so"}));
  EXPECT_EQ(names("s")[0], "<global>");
}

}  // namespace
}  // namespace ncclsim
