// The sim loads NCCL_PROFILER_PLUGIN by NCCL 2.28's rules and calls init/finalize per comm, with
// commId equal to NCCL's commHash (checked against comm_hash.h, an independent computation of
// the same algorithm as trace/'s).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "comm_hash.h"
#include "harness.h"

using simtest::RankContext;

namespace {

std::string tempPath(const char* tag) {
  return std::string("/tmp/ncclsim-profiler-") + tag + "-" + std::to_string(getpid()) + ".log";
}

std::string hex(uint64_t value) {
  char text[32];
  std::snprintf(text, sizeof text, "%016" PRIx64, value);
  return text;
}

int countOf(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++count;
  return count;
}

// World plus one split child, both destroyed: two inits and two finalizes per rank.
int worldAndSplit(const RankContext& c) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.commName = "world";
  ncclComm_t world = nullptr;
  SIMTEST_NCCL(ncclCommInitRankConfig(&world, c.nranks, c.id, c.rank, &config), c);
  ncclComm_t child = nullptr;
  SIMTEST_NCCL(ncclCommSplit(world, 7, c.rank, &child, nullptr), c);
  SIMTEST_NCCL(ncclCommDestroy(child), c);
  SIMTEST_NCCL(ncclCommDestroy(world), c);
  return 0;
}

TEST(ProfilerPlugin, AbsolutePathGetsCommHashInitAndFinalize) {
  const std::string log = tempPath("abs");
  unlink(log.c_str());
  simtest::JobOptions options;
  options.env = {{"NCCL_PROFILER_PLUGIN", SIMTEST_PLUGIN_PATH}, {"SIMTEST_PROFILER_LOG", log}};
  const auto result = simtest::runJob(options, worldAndSplit);
  ASSERT_TRUE(result.allExitedZero()) << result.summary();
  const std::string text = simtest::readFile(log);
  unlink(log.c_str());
  const uint64_t root = ncclsim::rootCommHash(result.id.internal, sizeof result.id.internal);
  const uint64_t child = ncclsim::childCommHash(root, 1, 7);
  EXPECT_EQ(countOf(text, "init commId=" + hex(root) + " nranks=2"), 2) << text;
  EXPECT_EQ(countOf(text, "nNodes=1 name=world"), 4)
      << text;  // a split with config NULL inherits it
  EXPECT_EQ(countOf(text, "init commId=" + hex(child) + " nranks=2"), 2) << text;
  EXPECT_EQ(countOf(text, "finalize commId=" + hex(root)), 2) << text;
  EXPECT_EQ(countOf(text, "finalize commId=" + hex(child)), 2) << text;
  EXPECT_EQ(countOf(text, "log=1"), 4) << text;
}

TEST(ProfilerPlugin, NoneDisablesAndOldVersionsAreOnlyDetected) {
  for (const std::string& value : {std::string("NONE"), std::string(SIMTEST_OLD_PLUGIN_PATH),
                                   std::string("/no/such/plugin.so")}) {
    const std::string log = tempPath("none");
    unlink(log.c_str());
    simtest::JobOptions options;
    options.env = {{"NCCL_PROFILER_PLUGIN", value}, {"SIMTEST_PROFILER_LOG", log}};
    const auto result = simtest::runJob(options, worldAndSplit);
    ASSERT_TRUE(result.allExitedZero()) << result.summary();
    EXPECT_EQ(simtest::readFile(log), "") << value;
    if (value == SIMTEST_OLD_PLUGIN_PATH) {
      EXPECT_NE(result.err[0].find("exports only ncclProfiler_v4"), std::string::npos)
          << result.err[0];
    }
    unlink(log.c_str());
  }
}

TEST(ProfilerPlugin, FailedLoadIsNeverRetried) {
  const std::string log = tempPath("retry");
  unlink(log.c_str());
  simtest::JobOptions options;
  options.env = {{"NCCL_PROFILER_PLUGIN", "/no/such/plugin.so"}, {"SIMTEST_PROFILER_LOG", log}};
  const auto result = simtest::runJob(options, [](const RankContext& c) {
    ncclComm_t world = simtest::initComm(c);
    SIMTEST_CHECK(world != nullptr, c, "init");
    setenv("NCCL_PROFILER_PLUGIN", SIMTEST_PLUGIN_PATH, 1);  // too late: loading already failed
    ncclComm_t child = nullptr;
    SIMTEST_NCCL(ncclCommSplit(world, 0, c.rank, &child, nullptr), c);
    SIMTEST_NCCL(ncclCommDestroy(child), c);
    SIMTEST_NCCL(ncclCommDestroy(world), c);
    return 0;
  });
  ASSERT_TRUE(result.allExitedZero()) << result.summary();
  EXPECT_EQ(simtest::readFile(log), "");
  unlink(log.c_str());
}

TEST(ProfilerPlugin, StaticPluginPrefixSearchesTheGlobalScope) {
  const std::string log = tempPath("static");
  unlink(log.c_str());
  simtest::JobOptions options;
  options.env = {{"NCCL_PROFILER_PLUGIN", "Static"}, {"SIMTEST_PROFILER_LOG", log}};
  const auto result = simtest::runJob(options, [](const RankContext& c) {
    // As if the plugin were linked into the program: put it in the global scope first.
    SIMTEST_CHECK(dlopen(SIMTEST_PLUGIN_PATH, RTLD_NOW | RTLD_GLOBAL) != nullptr, c,
                  "dlopen of the test plugin");
    return worldAndSplit(c);
  });
  ASSERT_TRUE(result.allExitedZero()) << result.summary();
  EXPECT_EQ(countOf(simtest::readFile(log), "init commId="), 4);
  unlink(log.c_str());
}

// The short name "simtest" expands to libnccl-profiler-simtest.so, found on LD_LIBRARY_PATH,
// which the loader reads at process start: so each rank re-executes this binary as a worker.
TEST(ProfilerPlugin, ShortNameExpandsToLibncclProfilerName) {
  const std::string log = tempPath("short");
  unlink(log.c_str());
  simtest::JobOptions options;
  const auto result = simtest::runJob(options, [&log](const RankContext& c) {
    std::string idHex;
    for (unsigned char byte : c.id.internal) {
      char two[3];
      std::snprintf(two, sizeof two, "%02x", byte);
      idHex += two;
    }
    const std::string libraryPath = std::string(SIMTEST_PLUGIN_DIR) + ":" +
                                    (getenv("LD_LIBRARY_PATH") ? getenv("LD_LIBRARY_PATH") : "");
    setenv("LD_LIBRARY_PATH", libraryPath.c_str(), 1);
    setenv("NCCL_PROFILER_PLUGIN", "simtest", 1);
    setenv("SIMTEST_PROFILER_LOG", log.c_str(), 1);
    setenv("SIMTEST_WORKER",
           (std::to_string(c.rank) + ":" + std::to_string(c.nranks) + ":" + idHex).c_str(), 1);
    execl("/proc/self/exe", "sim_nccl_profiler_test", "--gtest_filter=ProfilerWorker.Run", nullptr);
    return 127;
  });
  ASSERT_TRUE(result.allExitedZero()) << result.summary();
  EXPECT_EQ(countOf(simtest::readFile(log), "init commId="), 4) << simtest::readFile(log);
  unlink(log.c_str());
}

TEST(ProfilerWorker, Run) {
  const char* worker = getenv("SIMTEST_WORKER");
  if (!worker) GTEST_SKIP() << "only runs re-executed by ShortNameExpandsToLibncclProfilerName";
  RankContext context{};
  std::istringstream in(worker);
  std::string rank, nranks, idHex;
  std::getline(in, rank, ':');
  std::getline(in, nranks, ':');
  std::getline(in, idHex);
  context.rank = std::stoi(rank);
  context.nranks = std::stoi(nranks);
  for (size_t i = 0; i < sizeof context.id.internal; ++i) {
    context.id.internal[i] = static_cast<char>(std::stoi(idHex.substr(2 * i, 2), nullptr, 16));
  }
  ASSERT_EQ(worldAndSplit(context), 0);
}

}  // namespace
