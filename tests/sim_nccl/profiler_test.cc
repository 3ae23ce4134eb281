// The sim loads NCCL_PROFILER_PLUGIN by NCCL 2.28's rules and calls init/finalize per comm, with
// commId equal to NCCL's commHash (checked against comm_hash.h, an independent computation of
// the same algorithm as trace/'s).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <tuple>
#include <vector>

#include "comm_hash.h"
#include "harness.h"
#include "plugin/abi/profiler_abi.h"

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
  EXPECT_EQ(countOf(text, "init v=5 commId=" + hex(root) + " nranks=2"), 2) << text;
  EXPECT_EQ(countOf(text, "nNodes=1 name=world"), 4)
      << text;  // a split with config NULL inherits it
  EXPECT_EQ(countOf(text, "init v=5 commId=" + hex(child) + " nranks=2"), 2) << text;
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
      EXPECT_NE(result.err[0].find("exports only ncclProfiler_v2"), std::string::npos)
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
  EXPECT_EQ(countOf(simtest::readFile(log), " init v=5 commId="), 4);
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
  EXPECT_EQ(countOf(simtest::readFile(log), " init v=5 commId="), 4) << simtest::readFile(log);
  unlink(log.c_str());
}

// ---- events ----

namespace abi = nccl_profiler_abi;

// One line of the recording plugin's log, split into its "key=value" words.
struct LogLine {
  int pid = 0;
  std::string verb;  // init, start, state, stop, finalize
  std::map<std::string, std::string> fields;
  std::string get(const std::string& key) const {
    auto it = fields.find(key);
    return it == fields.end() ? "" : it->second;
  }
};

std::vector<LogLine> parseLog(const std::string& text) {
  std::vector<LogLine> lines;
  std::istringstream in(text);
  std::string raw;
  while (std::getline(in, raw)) {
    std::istringstream words(raw);
    std::string word;
    LogLine line;
    while (words >> word) {
      size_t equals = word.find('=');
      if (equals == std::string::npos) {
        line.verb = word;
      } else if (word.compare(0, equals, "pid") == 0) {
        line.pid = std::stoi(word.substr(equals + 1));
      } else {
        line.fields[word.substr(0, equals)] = word.substr(equals + 1);
      }
    }
    lines.push_back(line);
  }
  return lines;
}

// The lines of one rank: its init says which (v3's init does not: then its first operation).
std::vector<LogLine> rankLines(const std::vector<LogLine>& all, int rank) {
  std::map<int, int> rankOfPid;
  for (const LogLine& line : all) {
    if (rankOfPid.count(line.pid) != 0 && rankOfPid[line.pid] >= 0) continue;
    std::string field = line.get("rank");
    bool says = line.verb == "init" ||
                (line.verb == "start" && (line.get("type") == "Coll" || line.get("type") == "P2p"));
    if (says && !field.empty()) rankOfPid[line.pid] = std::stoi(field);
  }
  std::vector<LogLine> mine;
  for (const LogLine& line : all) {
    auto it = rankOfPid.find(line.pid);
    if (it != rankOfPid.end() && it->second == rank) mine.push_back(line);
  }
  return mine;
}

std::vector<LogLine> startsOf(const std::vector<LogLine>& lines, const std::string& type) {
  std::vector<LogLine> starts;
  for (const LogLine& line : lines) {
    if (line.verb == "start" && line.get("type") == type) starts.push_back(line);
  }
  return starts;
}

bool hasLine(const std::vector<LogLine>& lines, const std::string& verb, const std::string& handle,
             const std::string& state = "") {
  for (const LogLine& line : lines) {
    if (line.verb == verb && line.get("h") == handle && (state.empty() || line.get("s") == state))
      return true;
  }
  return false;
}

struct EventJob {
  std::string log;
  simtest::JobResult result;
  std::vector<LogLine> lines;
};

EventJob runWithEvents(const std::string& tag, int mask, int maxVersion,
                       const std::function<int(const RankContext&)>& scenario,
                       std::vector<std::pair<std::string, std::string>> extraEnv = {},
                       int nranks = 2) {
  EventJob job;
  job.log = tempPath(tag.c_str());
  unlink(job.log.c_str());
  simtest::JobOptions options;
  options.nranks = nranks;
  options.env = {{"NCCL_PROFILER_PLUGIN", SIMTEST_PLUGIN_PATH},
                 {"SIMTEST_PROFILER_LOG", job.log},
                 {"SIMTEST_PROFILER_MASK", std::to_string(mask)},
                 {"NCCLSIM_PROFILER_MAX_VERSION", std::to_string(maxVersion)}};
  for (auto& entry : extraEnv) options.env.push_back(entry);
  job.result = simtest::runJob(options, scenario);
  job.lines = parseLog(simtest::readFile(job.log));
  unlink(job.log.c_str());
  return job;
}

// Two allreduces, a broadcast, an allgather and a send/recv pair in a group, all completed.
int mixedCalls(const RankContext& c) {
  ncclComm_t comm = simtest::initComm(c);
  SIMTEST_CHECK(comm != nullptr, c, "init");
  float* buffer = nullptr;
  SIMTEST_CHECK(cudaMalloc(&buffer, 4096 * sizeof(float)) == cudaSuccess, c, "cudaMalloc");
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  SIMTEST_NCCL(ncclAllReduce(buffer, buffer, 64, ncclFloat32, ncclSum, comm, stream), c);
  SIMTEST_NCCL(ncclAllReduce(buffer, buffer, 64, ncclFloat32, ncclSum, comm, stream), c);
  SIMTEST_NCCL(ncclBroadcast(buffer, buffer, 16, ncclFloat32, 0, comm, stream), c);
  SIMTEST_NCCL(ncclAllGather(buffer, buffer + 1024, 8, ncclFloat32, comm, stream), c);
  SIMTEST_NCCL(ncclGroupStart(), c);
  SIMTEST_NCCL(ncclSend(buffer, 4, ncclFloat32, 1 - c.rank, comm, stream), c);
  SIMTEST_NCCL(ncclRecv(buffer + 2048, 4, ncclFloat32, 1 - c.rank, comm, stream), c);
  SIMTEST_NCCL(ncclGroupEnd(), c);
  SIMTEST_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, c, "sync");
  SIMTEST_NCCL(ncclCommDestroy(comm), c);
  return 0;
}

constexpr int kAllEvents = abi::kGroupApi | abi::kCollApi | abi::kP2pApi | abi::kGroup |
                           abi::kColl | abi::kP2p | abi::kKernelCh | abi::kProxyOp |
                           abi::kProxyStep;

class ProfilerEvents : public ::testing::TestWithParam<int> {};

TEST_P(ProfilerEvents, EachVersionGetsItsEventsWithNcclSeqNumbersAndKernelChannels) {
  const int version = GetParam();
  EventJob job =
      runWithEvents("events-v" + std::to_string(version), kAllEvents, version, mixedCalls);
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<LogLine> lines = rankLines(job.lines, rank);
    ASSERT_FALSE(lines.empty());
    EXPECT_EQ(lines.front().get("v"), std::to_string(version));
    std::vector<LogLine> colls = startsOf(lines, "Coll");
    ASSERT_EQ(colls.size(), 4u);
    // Per-function counters from 0: AllReduce 0 and 1, Broadcast 0, AllGather 0.
    EXPECT_EQ(colls[0].get("func"), "AllReduce");
    EXPECT_EQ(colls[0].get("seq"), "0");
    EXPECT_EQ(colls[1].get("seq"), "1");
    EXPECT_EQ(colls[2].get("func"), "Broadcast");
    EXPECT_EQ(colls[2].get("seq"), "0");
    EXPECT_EQ(colls[2].get("count"), "64");  // bytes of int8, as NCCL reports Broadcast
    EXPECT_EQ(colls[2].get("dtype"), "ncclInt8");
    EXPECT_EQ(colls[3].get("func"), "AllGather");
    EXPECT_EQ(colls[3].get("count"), "32");
    EXPECT_EQ(colls[0].get("rank"), std::to_string(rank));
    std::vector<LogLine> p2ps = startsOf(lines, "P2p");
    ASSERT_EQ(p2ps.size(), 2u);
    EXPECT_EQ(p2ps[0].get("peer"), std::to_string(1 - rank));
    std::vector<LogLine> apis = startsOf(lines, "CollApi");
    std::vector<LogLine> groups = startsOf(lines, "GroupApi");
    if (version >= 5) {
      ASSERT_EQ(apis.size(), 4u);
      EXPECT_EQ(apis[2].get("count"), "16");  // the user's view
      EXPECT_EQ(apis[2].get("dtype"), "ncclFloat32");
      EXPECT_EQ(apis[2].get("root"), "0");
      EXPECT_EQ(colls[0].get("parent"), apis[0].get("h"));  // Coll under its CollApi
      ASSERT_EQ(groups.size(), 5u);  // four implicit groups and the send/recv group
      EXPECT_EQ(groups[0].get("depth"), "1");
      EXPECT_EQ(groups[4].get("depth"), "2");
      EXPECT_EQ(startsOf(lines, "P2pApi").size(), 2u);
    } else {
      EXPECT_TRUE(apis.empty());
      EXPECT_TRUE(groups.empty());
      std::vector<LogLine> legacy = startsOf(lines, "Group");
      ASSERT_FALSE(legacy.empty());
      EXPECT_EQ(colls[0].get("parent"), legacy[0].get("h"));  // v4/v3: under the legacy group
    }
    // Every Coll's kernel ran on its two channels and stopped.
    for (const LogLine& coll : colls) {
      int channels = 0;
      for (const LogLine& kernel : startsOf(lines, "KernelCh")) {
        if (kernel.get("parent") != coll.get("h")) continue;
        ++channels;
        EXPECT_TRUE(hasLine(lines, "stop", kernel.get("h")));
        if (version >= 4) {
          EXPECT_TRUE(hasLine(lines, "state", kernel.get("h"), "22"));
        }
      }
      EXPECT_EQ(channels, 2) << coll.get("func");
      EXPECT_TRUE(hasLine(lines, "stop", coll.get("h")));  // "enqueued"
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Versions, ProfilerEvents, ::testing::Values(7, 6, 5, 4, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "v" + std::to_string(info.param);
                         });

TEST(ProfilerEventsMask, NoMaskNoEventsCollMaskNoKernelChannels) {
  EventJob none = runWithEvents("mask-none", 0, 5, mixedCalls);
  ASSERT_TRUE(none.result.allExitedZero()) << none.result.summary();
  for (const LogLine& line : none.lines) EXPECT_NE(line.verb, "start");
  EventJob coll = runWithEvents("mask-coll", abi::kColl, 5, mixedCalls);
  ASSERT_TRUE(coll.result.allExitedZero()) << coll.result.summary();
  std::vector<LogLine> lines = rankLines(coll.lines, 0);
  EXPECT_EQ(startsOf(lines, "Coll").size(), 4u);
  EXPECT_EQ(startsOf(lines, "CollApi").size(), 4u);  // Coll implies its ancestors
  EXPECT_EQ(startsOf(lines, "GroupApi").size(), 5u);
  EXPECT_TRUE(startsOf(lines, "KernelCh").empty());
  EXPECT_TRUE(startsOf(lines, "P2p").empty());  // Coll does not imply P2p
  EXPECT_TRUE(startsOf(lines, "ProxyOp").empty());
}

TEST(ProfilerEventsShape, AlltoAllIsSendRecvPiecesAndCountZeroHasNoEvents) {
  EventJob job = runWithEvents("alltoall", kAllEvents, 5, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    float* buffer = nullptr;
    SIMTEST_CHECK(cudaMalloc(&buffer, 64 * sizeof(float)) == cudaSuccess, c, "cudaMalloc");
    SIMTEST_NCCL(ncclAlltoAll(buffer, buffer + 32, 4, ncclFloat32, comm, nullptr), c);
    SIMTEST_NCCL(ncclAllReduce(buffer, buffer, 0, ncclFloat32, ncclSum, comm, nullptr), c);
    SIMTEST_CHECK(cudaStreamSynchronize(nullptr) == cudaSuccess, c, "sync");
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  std::vector<LogLine> lines = rankLines(job.lines, 0);
  EXPECT_TRUE(startsOf(lines, "CollApi").empty());
  EXPECT_TRUE(startsOf(lines, "Coll").empty());
  EXPECT_EQ(startsOf(lines, "P2pApi").size(), 4u);  // a send and a receive per rank
  std::vector<LogLine> pieces = startsOf(lines, "P2p");
  ASSERT_EQ(pieces.size(), 4u);
  int sends = 0;
  for (const LogLine& piece : pieces) sends += piece.get("func") == "Send";
  EXPECT_EQ(sends, 2);
}

// A rank that skips an allreduce: its neighbours' proxy steps wait on it by name, and their
// kernels started and never stopped before the abort.
TEST(ProfilerEventsHang, WaitingStepsNameTheMissingRank) {
  EventJob job = runWithEvents(
      "hang", kAllEvents, 5,
      [](const RankContext& c) {
        ncclComm_t comm = simtest::initComm(c);
        SIMTEST_CHECK(comm != nullptr, c, "init");
        float* buffer = nullptr;
        SIMTEST_CHECK(cudaMalloc(&buffer, 64 * sizeof(float)) == cudaSuccess, c, "cudaMalloc");
        if (c.rank != 1) {
          SIMTEST_NCCL(ncclAllReduce(buffer, buffer, 8, ncclFloat32, ncclSum, comm, nullptr), c);
        }
        usleep(400'000);
        ncclCommAbort(comm);
        return 0;
      },
      {}, 3);
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  // Rank 2 receives from rank 1 in the ring (1 -> 2), rank 0 sends to it (0 -> 1).
  for (auto [rankIndex, state, send] : {std::tuple{2, "10", "0"}, std::tuple{0, "20", "1"}}) {
    std::vector<LogLine> lines = rankLines(job.lines, rankIndex);
    std::string waitingOp;
    for (const LogLine& op : startsOf(lines, "ProxyOp")) {
      if (op.get("peer") == "1" && op.get("send") == send) waitingOp = op.get("h");
    }
    ASSERT_FALSE(waitingOp.empty()) << "rank " << rankIndex;
    bool waited = false;
    for (const LogLine& step : startsOf(lines, "ProxyStep")) {
      if (step.get("parent") == waitingOp) waited = hasLine(lines, "state", step.get("h"), state);
    }
    EXPECT_TRUE(waited) << "rank " << rankIndex << " never waited in state " << state;
    std::vector<LogLine> kernels = startsOf(lines, "KernelCh");
    ASSERT_FALSE(kernels.empty());
    for (const LogLine& kernel : kernels)
      EXPECT_FALSE(hasLine(lines, "state", kernel.get("h"), "22"));
  }
  EXPECT_TRUE(startsOf(rankLines(job.lines, 1), "Coll").empty());  // the rank that skipped
}

// The stall fault: the stalled rank's kernel started and its send waits on its GPU; its peer
// receives nothing.
TEST(ProfilerEventsHang, AStalledRankWaitsOnItsGpu) {
  EventJob job = runWithEvents(
      "stall", kAllEvents, 5,
      [](const RankContext& c) {
        ncclComm_t comm = simtest::initComm(c);
        SIMTEST_CHECK(comm != nullptr, c, "init");
        float* buffer = nullptr;
        SIMTEST_CHECK(cudaMalloc(&buffer, 64 * sizeof(float)) == cudaSuccess, c, "cudaMalloc");
        SIMTEST_NCCL(ncclAllReduce(buffer, buffer, 8, ncclFloat32, ncclSum, comm, nullptr), c);
        usleep(400'000);
        ncclCommAbort(comm);
        return 0;
      },
      {{"NCCLSIM_FAULT", "stall:rank=1,seq=1"}});
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  std::vector<LogLine> stalled = rankLines(job.lines, 1);
  std::vector<LogLine> steps = startsOf(stalled, "ProxyStep");
  ASSERT_FALSE(steps.empty());
  EXPECT_TRUE(hasLine(stalled, "state", steps.front().get("h"), "8"));    // SendGPUWait
  EXPECT_FALSE(hasLine(stalled, "state", steps.front().get("h"), "20"));  // never got further
  EXPECT_FALSE(startsOf(stalled, "KernelCh").empty());
  std::vector<LogLine> peer = rankLines(job.lines, 0);
  bool receiving = false;
  for (const LogLine& step : startsOf(peer, "ProxyStep")) {
    receiving |= hasLine(peer, "state", step.get("h"), "10");
  }
  EXPECT_TRUE(receiving);
}

TEST(ProfilerVersion, TheLoaderTakesTheNewestTableItKnows) {
  for (int maxVersion : {7, 6, 5, 4, 3}) {
    EventJob job = runWithEvents("version", 0, maxVersion, worldAndSplit);
    ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
    ASSERT_FALSE(job.lines.empty());
    EXPECT_EQ(job.lines.front().get("v"), std::to_string(maxVersion));
  }
  // A plugin with only v4 (NCCL 2.27's) is taken by 2.28's loader, which still knows v4.
  const std::string log = tempPath("v4only");
  unlink(log.c_str());
  simtest::JobOptions options;
  options.env = {{"NCCL_PROFILER_PLUGIN", SIMTEST_V4_PLUGIN_PATH}, {"SIMTEST_PROFILER_LOG", log}};
  const auto result = simtest::runJob(options, worldAndSplit);
  ASSERT_TRUE(result.allExitedZero()) << result.summary();
  EXPECT_EQ(countOf(simtest::readFile(log), " init v=4 commId="), 4) << simtest::readFile(log);
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
