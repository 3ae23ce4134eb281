// The sim's libnccl.so.2 exports the same dynamic symbols as the toolkit's real one (weak ncclX,
// strong pncclX aliases, and the one strong internal ncclResetDebugInitInternal), plus the host
// API of NCCL 2.29-2.32 that PyPI's PyTorch links against, each of which PyPI's 2.32.3 exports.
#include <gtest/gtest.h>

#include <cstdio>
#include <iterator>
#include <map>
#include <string>

namespace {

std::map<std::string, char> definedSymbols(const std::string& library) {
  std::map<std::string, char> symbols;
  FILE* pipe = popen(("nm -D --defined-only " + library + " 2>/dev/null").c_str(), "r");
  if (!pipe) return symbols;
  char line[512];
  while (std::fgets(line, sizeof line, pipe)) {
    char address[64], type = 0, name[400];
    if (std::sscanf(line, "%63s %c %399s", address, &type, name) == 3) symbols[name] = type;
  }
  pclose(pipe);
  return symbols;
}

// The functions after 2.28.9 that the sim implements (sim/nccl/newer_api.cc), by their NCCL names.
const char* const kNewerApi[] = {"ncclAllGatherConfig",
                                 "ncclAllReduceConfig",
                                 "ncclAlltoAllConfig",
                                 "ncclBroadcastConfig",
                                 "ncclCommGetUniqueId",
                                 "ncclCommGrow",
                                 "ncclCommMemStats",
                                 "ncclCommResume",
                                 "ncclCommSuspend",
                                 "ncclGatherConfig",
                                 "ncclGetLsaMultimemDevicePointer",
                                 "ncclGetPeerDevicePointer",
                                 "ncclPutSignal",
                                 "ncclReduceConfig",
                                 "ncclReduceScatterConfig",
                                 "ncclScatterConfig",
                                 "ncclSignal",
                                 "ncclWaitSignal",
                                 "ncclWinGetUserPtr"};

TEST(ExportShape, MatchesRealLibncclPlusTheNewerApi) {
  const auto real = definedSymbols(REAL_NCCL_PATH);
  const auto sim = definedSymbols(SIM_NCCL_PATH);
  ASSERT_GE(real.size(), 105u) << "could not read " << REAL_NCCL_PATH;
  for (const auto& [name, type] : real) {
    auto found = sim.find(name);
    ASSERT_NE(found, sim.end()) << "the sim lacks " << name;
    EXPECT_EQ(found->second, type) << name;
  }
  std::map<std::string, char> expectedExtra;
  if (SIM_HAS_NEWER_API) {
    for (const char* name : kNewerApi) {
      expectedExtra[name] = 'W';
      expectedExtra[std::string("p") + name] = 'T';
    }
  }
  std::map<std::string, char> extra;
  for (const auto& [name, type] : sim) {
    if (real.count(name) == 0) extra[name] = type;
  }
  EXPECT_EQ(extra, expectedExtra);
  const auto wheel = definedSymbols(WHEEL_NCCL_PATH);
  if (!wheel.empty()) {  // PyPI's 2.32.3, when it was fetched: every extra is a real NCCL name
    for (const auto& [name, type] : extra) EXPECT_EQ(wheel.count(name), 1u) << name;
  }
  int weak = 0, strong = 0;
  for (const auto& [name, type] : sim) {
    if (name.rfind("pnccl", 0) == 0) {
      EXPECT_EQ(type, 'T') << name;
      ++strong;
      EXPECT_EQ(sim.count(name.substr(1)), 1u) << name;
    } else if (name != "ncclResetDebugInitInternal") {
      EXPECT_EQ(type, 'W') << name;
      ++weak;
    }
  }
  const int newer = SIM_HAS_NEWER_API ? static_cast<int>(std::size(kNewerApi)) : 0;
  EXPECT_EQ(weak, 52 + newer);
  EXPECT_EQ(strong, 52 + newer);
}

}  // namespace
