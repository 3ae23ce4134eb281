// The sim's libnccl.so.2 exports the same dynamic symbols as the toolkit's real one: weak ncclX,
// strong pncclX aliases, and the one strong internal (ncclResetDebugInitInternal).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>

namespace {

std::map<std::string, char> definedSymbols(const std::string& library) {
  std::map<std::string, char> symbols;
  FILE* pipe = popen(("nm -D --defined-only " + library).c_str(), "r");
  if (!pipe) return symbols;
  char line[512];
  while (std::fgets(line, sizeof line, pipe)) {
    char address[64], type = 0, name[400];
    if (std::sscanf(line, "%63s %c %399s", address, &type, name) == 3) symbols[name] = type;
  }
  pclose(pipe);
  return symbols;
}

TEST(ExportShape, MatchesRealLibnccl) {
  const auto real = definedSymbols(REAL_NCCL_PATH);
  const auto sim = definedSymbols(SIM_NCCL_PATH);
  ASSERT_GE(real.size(), 105u) << "could not read " << REAL_NCCL_PATH;
  EXPECT_EQ(sim, real);
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
  EXPECT_EQ(weak, 52);
  EXPECT_EQ(strong, 52);
}

}  // namespace
