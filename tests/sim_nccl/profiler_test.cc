// The sim plays NCCL for a profiler plugin (docs/sim.md, "Profiler plugin"): it loads
// NCCL_PROFILER_PLUGIN by NCCL's rules and calls init/finalize per comm, with commId equal to
// NCCL's commHash (checked against comm_hash.h, an independent computation of the same algorithm
// as trace/'s), and emits each ABI version's events at NCCL's moments and on NCCL's threads. The
// recording plugin (test_profiler_plugin.cc) logs every callback with its fields; these tests
// read that log as a plugin author would. SIMTEST_KEEP_PROFILER_LOG=1 keeps the logs in /tmp.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
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

// The lines of one rank: its init says which (v3's init does not: then its first Coll or P2p).
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

std::vector<LogLine> startsOf(const std::vector<LogLine>& lines, const std::string& type,
                              const std::string& parent = "") {
  std::vector<LogLine> starts;
  for (const LogLine& line : lines) {
    if (line.verb == "start" && line.get("type") == type &&
        (parent.empty() || line.get("parent") == parent)) {
      starts.push_back(line);
    }
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

// The states a handle went through, in order ("8 20 9").
std::string statesOf(const std::vector<LogLine>& lines, const std::string& handle) {
  std::string states;
  for (const LogLine& line : lines) {
    if (line.verb != "state" || line.get("h") != handle) continue;
    states += (states.empty() ? "" : " ") + line.get("s");
  }
  return states;
}

// The event lines of one thread as "start:Type", "state:N" and "stop:Type" words.
std::string threadSequence(const std::vector<LogLine>& lines, const std::string& tid) {
  std::map<std::string, std::string> typeOf;
  std::string sequence;
  for (const LogLine& line : lines) {
    if (line.get("tid") != tid) continue;
    std::string word;
    if (line.verb == "start") {
      typeOf[line.get("h")] = line.get("type");
      word = "start:" + line.get("type");
    } else if (line.verb == "stop") {
      word = "stop:" + typeOf[line.get("h")];
    } else if (line.verb == "state") {
      word = "state:" + line.get("s");
    } else {
      continue;
    }
    sequence += (sequence.empty() ? "" : " ") + word;
  }
  return sequence;
}

struct EventJob {
  std::string log;
  simtest::JobResult result;
  std::vector<LogLine> lines;
};

struct EventOptions {
  int mask = 0;
  int maxVersion = 5;
  int nranks = 2;
  std::string plugin = SIMTEST_PLUGIN_PATH;
  std::vector<std::pair<std::string, std::string>> env;
};

EventJob runWithEvents(const std::string& tag, const EventOptions& options,
                       const std::function<int(const RankContext&)>& scenario) {
  EventJob job;
  job.log = tempPath(tag.c_str());
  unlink(job.log.c_str());
  simtest::JobOptions job_options;
  job_options.nranks = options.nranks;
  job_options.env = {{"NCCL_PROFILER_PLUGIN", options.plugin},
                     {"SIMTEST_PROFILER_LOG", job.log},
                     {"SIMTEST_PROFILER_MASK", std::to_string(options.mask)},
                     {"NCCLSIM_PROFILER_MAX_VERSION", std::to_string(options.maxVersion)}};
  for (auto& entry : options.env) job_options.env.push_back(entry);
  job.result = simtest::runJob(job_options, scenario);
  job.lines = parseLog(simtest::readFile(job.log));
  if (getenv("SIMTEST_KEEP_PROFILER_LOG") == nullptr) unlink(job.log.c_str());  // to look at it
  return job;
}

EventJob runWithEvents(const std::string& tag, int mask, int maxVersion,
                       const std::function<int(const RankContext&)>& scenario) {
  EventOptions options;
  options.mask = mask;
  options.maxVersion = maxVersion;
  return runWithEvents(tag, options, scenario);
}

struct Buffers {
  float* data = nullptr;
  cudaStream_t stream = nullptr;
};

Buffers buffers(size_t floats) {
  Buffers b;
  if (cudaMalloc(&b.data, floats * sizeof(float)) != cudaSuccess) b.data = nullptr;
  cudaStreamCreate(&b.stream);
  return b;
}

// Two allreduces, a broadcast, an allgather and a send/recv pair in a group, all completed.
int mixedCalls(const RankContext& c) {
  ncclComm_t comm = simtest::initComm(c);
  SIMTEST_CHECK(comm != nullptr, c, "init");
  Buffers b = buffers(4096);
  SIMTEST_CHECK(b.data != nullptr, c, "cudaMalloc");
  SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 64, ncclFloat32, ncclSum, comm, b.stream), c);
  SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 64, ncclFloat32, ncclSum, comm, b.stream), c);
  SIMTEST_NCCL(ncclBroadcast(b.data, b.data, 16, ncclFloat32, 0, comm, b.stream), c);
  SIMTEST_NCCL(ncclAllGather(b.data, b.data + 1024, 8, ncclFloat32, comm, b.stream), c);
  SIMTEST_NCCL(ncclGroupStart(), c);
  SIMTEST_NCCL(ncclSend(b.data, 4, ncclFloat32, 1 - c.rank, comm, b.stream), c);
  SIMTEST_NCCL(ncclRecv(b.data + 2048, 4, ncclFloat32, 1 - c.rank, comm, b.stream), c);
  SIMTEST_NCCL(ncclGroupEnd(), c);
  SIMTEST_CHECK(cudaStreamSynchronize(b.stream) == cudaSuccess, c, "sync");
  SIMTEST_NCCL(ncclCommDestroy(comm), c);
  return 0;
}

constexpr int kAllEvents = abi::kGroupApi | abi::kCollApi | abi::kP2pApi | abi::kGroup |
                           abi::kColl | abi::kP2p | abi::kKernelCh | abi::kProxyOp |
                           abi::kProxyStep;

class ProfilerEvents : public ::testing::TestWithParam<int> {};

// Each loader version gives the plugin its own descriptor (the plugin reads it through its
// version's struct, so a layout slip shows as wrong values here).
TEST_P(ProfilerEvents, EachVersionGetsItsDescriptorsSeqNumbersAndKernelChannels) {
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
    EXPECT_EQ(colls[0].get("count"), "64");
    EXPECT_EQ(colls[0].get("dtype"), "ncclFloat32");
    EXPECT_EQ(colls[0].get("root"), "-1");
    EXPECT_EQ(colls[0].get("nch"), "2");
    EXPECT_EQ(colls[0].get("nwarps"), "8");
    EXPECT_EQ(colls[0].get("algo"), "RING");
    EXPECT_EQ(colls[0].get("proto"), "SIMPLE");
    EXPECT_NE(colls[0].get("sendbuff"), "0");
    EXPECT_EQ(colls[0].get("sendbuff"), colls[0].get("recvbuff"));  // in place
    EXPECT_EQ(colls[1].get("seq"), "1");
    EXPECT_EQ(colls[2].get("func"), "Broadcast");
    EXPECT_EQ(colls[2].get("seq"), "0");
    EXPECT_EQ(colls[2].get("count"), "64");  // bytes of int8, as NCCL reports Broadcast
    EXPECT_EQ(colls[2].get("dtype"), "ncclInt8");
    EXPECT_EQ(colls[2].get("root"), "0");
    EXPECT_EQ(colls[3].get("func"), "AllGather");
    EXPECT_EQ(colls[3].get("count"), "32");
    EXPECT_EQ(colls[0].get("rank"), std::to_string(rank));
    std::vector<LogLine> p2ps = startsOf(lines, "P2p");
    ASSERT_EQ(p2ps.size(), 2u);
    EXPECT_EQ(p2ps[0].get("func"), "Send");
    EXPECT_EQ(p2ps[0].get("peer"), std::to_string(1 - rank));
    EXPECT_EQ(p2ps[0].get("count"), "4");
    EXPECT_NE(p2ps[0].get("buff"), "0");
    EXPECT_EQ(p2ps[1].get("func"), "Recv");
    EXPECT_EQ(p2ps[1].get("nch"), version >= 4 ? "1" : "0");  // v3's P2p has no nChannels
    std::vector<LogLine> apis = startsOf(lines, "CollApi");
    std::vector<LogLine> groups = startsOf(lines, "GroupApi");
    std::vector<LogLine> legacy = startsOf(lines, "Group");
    ASSERT_EQ(legacy.size(), 5u);  // one per launch
    if (version >= 5) {
      ASSERT_EQ(apis.size(), 4u);
      EXPECT_EQ(apis[2].get("count"), "16");  // the user's view
      EXPECT_EQ(apis[2].get("dtype"), "ncclFloat32");
      EXPECT_EQ(apis[2].get("root"), "0");
      EXPECT_EQ(apis[2].get("captured"), "0");
      EXPECT_NE(apis[2].get("stream"), "0");
      EXPECT_EQ(apis[0].get("parent"), groups[0].get("h"));
      EXPECT_EQ(colls[0].get("parent"), apis[0].get("h"));  // Coll under its CollApi
      EXPECT_EQ(colls[0].get("pgroup"), legacy[0].get("h"));
      ASSERT_EQ(groups.size(), 5u);  // four implicit groups and the send/recv group
      EXPECT_EQ(groups[0].get("depth"), "1");
      EXPECT_EQ(groups[4].get("depth"), "2");
      std::vector<LogLine> p2pApis = startsOf(lines, "P2pApi");
      ASSERT_EQ(p2pApis.size(), 2u);
      EXPECT_EQ(p2pApis[0].get("parent"), groups[4].get("h"));
      EXPECT_EQ(p2ps[0].get("parent"), p2pApis[0].get("h"));
    } else {
      EXPECT_TRUE(apis.empty());
      EXPECT_TRUE(groups.empty());
      EXPECT_EQ(colls[0].get("parent"), legacy[0].get("h"));  // v4/v3: under the legacy group
      EXPECT_EQ(p2ps[0].get("parent"), legacy[4].get("h"));
    }
    if (version == 3) {
      // NCCL 2.26 itself (the loader plays it at 3) names the communicator in v3's Coll.
      const uint64_t hash = ncclsim::rootCommHash(job.result.id.internal, 128);
      EXPECT_EQ(colls[0].get("hash"), hex(hash));
    }
    // Every Coll's kernel ran on its two channels, off the user's thread, and stopped.
    for (const LogLine& coll : colls) {
      std::vector<LogLine> kernels = startsOf(lines, "KernelCh", coll.get("h"));
      ASSERT_EQ(kernels.size(), 2u) << coll.get("func");
      for (const LogLine& kernel : kernels) {
        EXPECT_NE(kernel.get("tid"), coll.get("tid"));
        EXPECT_TRUE(hasLine(lines, "stop", kernel.get("h")));
        if (version >= 4) {
          EXPECT_NE(kernel.get("ptimer"), "0");
          EXPECT_EQ(statesOf(lines, kernel.get("h")), "22");
        }
      }
      EXPECT_EQ(kernels[0].get("ch"), "0");
      EXPECT_EQ(kernels[1].get("ch"), "1");
      EXPECT_TRUE(hasLine(lines, "stop", coll.get("h")));  // "enqueued"
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Versions, ProfilerEvents, ::testing::Values(7, 6, 5, 4, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "v" + std::to_string(info.param);
                         });

// Plugins with one old table under the default (2.28) loader: v4's shim and v3's shim, which
// no longer knows the communicator in Coll and P2p.
TEST(ProfilerOldTables, V4AndV3OnlyPluginsGetTheirShimsEvents) {
  for (const auto& [path, version] :
       {std::pair{SIMTEST_V4_PLUGIN_PATH, "4"}, std::pair{SIMTEST_V3_PLUGIN_PATH, "3"}}) {
    EventOptions options;
    options.mask = kAllEvents;
    options.plugin = path;
    EventJob job = runWithEvents(std::string("old-v") + version, options, mixedCalls);
    ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
    std::vector<LogLine> lines = rankLines(job.lines, 1);
    ASSERT_FALSE(lines.empty());
    EXPECT_EQ(lines.front().get("v"), version);
    std::vector<LogLine> colls = startsOf(lines, "Coll");
    ASSERT_EQ(colls.size(), 4u) << version;
    EXPECT_EQ(colls[3].get("func"), "AllGather");
    EXPECT_EQ(colls[3].get("dtype"), "ncclInt8");
    EXPECT_EQ(colls[3].get("algo"), "RING");
    if (std::string(version) == "3") {
      EXPECT_EQ(colls[0].get("hash"), hex(0));
    }
    EXPECT_TRUE(startsOf(lines, "CollApi").empty());
    EXPECT_EQ(startsOf(lines, "KernelCh").size(), 2u * 4 + 2);
    EXPECT_FALSE(startsOf(lines, "ProxyStep").empty());
    for (const LogLine& line : lines) {
      // v3 has no SendPeerWait (20), ProxyOp InProgress (19) or KernelChStop (22).
      if (std::string(version) == "3" && line.verb == "state") {
        EXPECT_LT(std::stoi(line.get("s")), 19);
      }
    }
  }
}

// GroupApi brackets the whole group on the user's thread: state 23 at its first operation,
// 24 when ncclGroupEnd starts, the launch's KernelLaunch, legacy Group and Coll events, and its
// stop when ncclGroupEnd returns (a bare call is its own implicit group).
TEST(ProfilerEventsOrder, GroupApiBracketsTheLaunchOnTheUsersThread) {
  EventJob job =
      runWithEvents("order", kAllEvents | abi::kKernelLaunch, 5, [](const RankContext& c) {
        ncclComm_t comm = simtest::initComm(c);
        SIMTEST_CHECK(comm != nullptr, c, "init");
        Buffers b = buffers(1024);
        SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 64, ncclFloat32, ncclSum, comm, b.stream), c);
        SIMTEST_CHECK(cudaStreamSynchronize(b.stream) == cudaSuccess, c, "sync");
        SIMTEST_NCCL(ncclGroupStart(), c);
        SIMTEST_NCCL(ncclGroupStart(), c);  // nested: still one group
        SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 64, ncclFloat32, ncclSum, comm, b.stream), c);
        SIMTEST_NCCL(ncclGroupEnd(), c);
        SIMTEST_NCCL(ncclBroadcast(b.data, b.data, 64, ncclFloat32, 0, comm, b.stream), c);
        SIMTEST_NCCL(ncclGroupEnd(), c);
        SIMTEST_CHECK(cudaStreamSynchronize(b.stream) == cudaSuccess, c, "sync");
        SIMTEST_NCCL(ncclCommDestroy(comm), c);
        return 0;
      });
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<LogLine> lines = rankLines(job.lines, rank);
    std::vector<LogLine> apis = startsOf(lines, "CollApi");
    ASSERT_EQ(apis.size(), 3u);
    const std::string user = apis[0].get("tid");
    EXPECT_EQ(threadSequence(lines, user),
              "start:GroupApi state:23 start:CollApi stop:CollApi state:24 start:KernelLaunch "
              "stop:KernelLaunch start:Group start:Coll stop:Coll stop:Group stop:GroupApi "
              "start:GroupApi state:23 start:CollApi stop:CollApi start:CollApi stop:CollApi "
              "state:24 start:KernelLaunch stop:KernelLaunch start:Group start:Coll stop:Coll "
              "start:Coll stop:Coll stop:Group stop:GroupApi");
    std::vector<LogLine> groups = startsOf(lines, "GroupApi");
    ASSERT_EQ(groups.size(), 2u);
    EXPECT_EQ(groups[0].get("depth"), "1");
    EXPECT_EQ(groups[1].get("depth"), "3");  // ncclGroupDepth at the first call: two opened + 1
    std::vector<LogLine> launches = startsOf(lines, "KernelLaunch");
    ASSERT_EQ(launches.size(), 2u);
    EXPECT_EQ(launches[1].get("parent"), groups[1].get("h"));
    EXPECT_EQ(launches[1].get("stream"), apis[1].get("stream"));
    // KernelCh and proxy events: never on the user's thread.
    for (const LogLine& line : lines) {
      const std::string type = line.get("type");
      if (type == "KernelCh" || type == "ProxyOp" || type == "ProxyStep") {
        EXPECT_NE(line.get("tid"), user) << type;
      }
    }
  }
}

// A group over two communicators is one GroupApi and one plan per communicator: its own
// KernelLaunch and legacy Group, its Coll events together, each communicator counting its own.
TEST(ProfilerEventsOrder, AGroupOverTwoCommunicatorsHasAPlanPerCommunicator) {
  EventJob job =
      runWithEvents("two-comms", abi::kColl | abi::kKernelLaunch, 5, [](const RankContext& c) {
        ncclComm_t world = simtest::initComm(c);
        SIMTEST_CHECK(world != nullptr, c, "init");
        ncclComm_t child = nullptr;
        SIMTEST_NCCL(ncclCommSplit(world, 0, c.rank, &child, nullptr), c);
        Buffers b = buffers(1024);
        SIMTEST_NCCL(ncclGroupStart(), c);
        SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 8, ncclFloat32, ncclSum, world, b.stream), c);
        SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 16, ncclFloat32, ncclSum, child, b.stream), c);
        SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 32, ncclFloat32, ncclSum, world, b.stream), c);
        SIMTEST_NCCL(ncclGroupEnd(), c);
        SIMTEST_CHECK(cudaStreamSynchronize(b.stream) == cudaSuccess, c, "sync");
        SIMTEST_NCCL(ncclCommDestroy(child), c);
        SIMTEST_NCCL(ncclCommDestroy(world), c);
        return 0;
      });
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  std::vector<LogLine> lines = rankLines(job.lines, 1);
  EXPECT_EQ(startsOf(lines, "GroupApi").size(), 1u);
  EXPECT_EQ(startsOf(lines, "KernelLaunch").size(), 2u);
  std::vector<LogLine> groups = startsOf(lines, "Group");
  ASSERT_EQ(groups.size(), 2u);
  std::string plan;
  for (const LogLine& coll : startsOf(lines, "Coll")) {
    plan += coll.get("count") + ":" + coll.get("seq") +
            (coll.get("pgroup") == groups[0].get("h") ? "a " : "b ");
  }
  EXPECT_EQ(plan, "8:0a 32:1a 16:0b ");
}

TEST(ProfilerEventsMask, EachBitBringsItsEventsAndTheirAncestors) {
  auto typesSeen = [](const std::vector<LogLine>& lines) {
    std::set<std::string> types;
    for (const LogLine& line : lines) {
      if (line.verb == "start") types.insert(line.get("type"));
    }
    std::string text;
    for (const std::string& type : types) text += (text.empty() ? "" : " ") + type;
    return text;
  };
  const std::vector<std::pair<int, std::string>> cases = {
      {0, ""},
      {abi::kColl, "Coll CollApi Group GroupApi"},
      {abi::kKernelCh, "Coll CollApi Group GroupApi KernelCh P2p P2pApi"},
      {abi::kP2p, "Group GroupApi P2p P2pApi"},
      {abi::kProxyStep, "Coll CollApi Group GroupApi P2p P2pApi ProxyOp ProxyStep"},
      {abi::kKernelLaunch, "GroupApi KernelLaunch"},
      {abi::kGroup, "Group GroupApi"},
      {abi::kProxyCtrl, ""},
  };
  for (const auto& [mask, expected] : cases) {
    EventJob job = runWithEvents("mask", mask, 5, mixedCalls);
    ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
    EXPECT_EQ(typesSeen(rankLines(job.lines, 0)), expected) << "mask " << mask;
  }
}

// The plugin may change the mask at any time; each API call samples it.
TEST(ProfilerEventsMask, AChangedMaskTakesEffectAtTheNextCall) {
  EventJob job = runWithEvents("mask-change", 0, 5, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    void* plugin = dlopen(SIMTEST_PLUGIN_PATH, RTLD_NOW | RTLD_NOLOAD);
    SIMTEST_CHECK(plugin != nullptr, c, "the plugin is loaded");
    auto setMask = reinterpret_cast<void (*)(int)>(dlsym(plugin, "simtestSetMask"));
    SIMTEST_CHECK(setMask != nullptr, c, "simtestSetMask");
    Buffers b = buffers(256);
    for (int mask : std::vector<int>{0, abi::kColl, 0, abi::kColl | abi::kKernelCh}) {
      setMask(mask);
      SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 8, ncclFloat32, ncclSum, comm, b.stream), c);
      SIMTEST_CHECK(cudaStreamSynchronize(b.stream) == cudaSuccess, c, "sync");
    }
    dlclose(plugin);
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  std::vector<LogLine> lines = rankLines(job.lines, 0);
  std::vector<LogLine> colls = startsOf(lines, "Coll");
  ASSERT_EQ(colls.size(), 2u);
  // The counter counts every launched collective, with or without events.
  EXPECT_EQ(colls[0].get("seq"), "1");
  EXPECT_EQ(colls[1].get("seq"), "3");
  EXPECT_TRUE(startsOf(lines, "KernelCh", colls[0].get("h")).empty());
  EXPECT_EQ(startsOf(lines, "KernelCh", colls[1].get("h")).size(), 2u);
}

// NULL handles from the plugin: children get a NULL parent, and nothing else changes.
TEST(ProfilerEventsShape, NullHandlesAreValidParents) {
  EventOptions options;
  options.mask = kAllEvents;
  options.env = {{"SIMTEST_PROFILER_NULL_TYPES",
                  std::to_string(abi::kGroupApi | abi::kCollApi | abi::kGroup | abi::kP2p)}};
  EventJob job = runWithEvents("null", options, mixedCalls);
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  std::vector<LogLine> lines = rankLines(job.lines, 0);
  std::vector<LogLine> colls = startsOf(lines, "Coll");
  ASSERT_EQ(colls.size(), 4u);
  for (const LogLine& coll : colls) {
    EXPECT_EQ(coll.get("parent"), "0");  // its CollApi's NULL, not the group's
    EXPECT_EQ(coll.get("pgroup"), "0");
    EXPECT_EQ(startsOf(lines, "KernelCh", coll.get("h")).size(), 2u);
  }
  EXPECT_EQ(startsOf(lines, "GroupApi").size(), 5u);  // a NULL GroupApi still opens one group
  for (const LogLine& api : startsOf(lines, "P2pApi")) EXPECT_EQ(api.get("parent"), "0");
  std::set<std::string> parents;  // the collectives', or NULL (the P2p pieces')
  for (const LogLine& coll : colls) parents.insert(coll.get("h"));
  int underNull = 0;
  for (const LogLine& line : startsOf(lines, "ProxyOp")) {
    EXPECT_TRUE(parents.count(line.get("parent")) != 0 || line.get("parent") == "0");
    underNull += line.get("parent") == "0";
  }
  EXPECT_EQ(underNull, 2);  // the send's and the receive's
  for (const LogLine& line : lines) {
    if (line.verb == "stop" || line.verb == "state") {
      EXPECT_NE(line.get("h"), "0");
    }
  }
}

// Coll seqNumbers on three ranks: per function, from 0, the same on every rank, for bare calls
// and a group (whose Coll events follow the call order in the sim).
TEST(ProfilerEventsShape, SeqNumbersArePerFunctionAndEqualOnEveryRank) {
  EventOptions options;
  options.mask = abi::kColl;
  options.nranks = 3;
  EventJob job = runWithEvents("seq", options, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    Buffers b = buffers(4096);
    SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 64, ncclFloat32, ncclSum, comm, b.stream), c);
    SIMTEST_NCCL(ncclBroadcast(b.data, b.data, 16, ncclFloat32, 1, comm, b.stream), c);
    SIMTEST_NCCL(ncclAllGather(b.data, b.data + 1024, 8, ncclFloat32, comm, b.stream), c);
    SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 32, ncclFloat32, ncclSum, comm, b.stream), c);
    SIMTEST_NCCL(ncclGroupStart(), c);
    SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 1024, ncclFloat32, ncclSum, comm, b.stream), c);
    SIMTEST_NCCL(ncclBroadcast(b.data, b.data, 16, ncclFloat32, 2, comm, b.stream), c);
    SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 8, ncclFloat32, ncclSum, comm, b.stream), c);
    SIMTEST_NCCL(ncclGroupEnd(), c);
    SIMTEST_NCCL(ncclReduceScatter(b.data, b.data + 2048, 4, ncclFloat32, ncclSum, comm, b.stream),
                 c);
    SIMTEST_NCCL(ncclReduce(b.data, b.data + 3072, 4, ncclFloat32, ncclMax, 0, comm, b.stream), c);
    SIMTEST_CHECK(cudaStreamSynchronize(b.stream) == cudaSuccess, c, "sync");
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  for (int rank = 0; rank < 3; ++rank) {
    std::string sequence;
    for (const LogLine& coll : startsOf(rankLines(job.lines, rank), "Coll"))
      sequence += coll.get("func") + ":" + coll.get("seq") + " ";
    EXPECT_EQ(sequence,
              "AllReduce:0 Broadcast:0 AllGather:0 AllReduce:1 AllReduce:2 Broadcast:1 "
              "AllReduce:3 ReduceScatter:0 Reduce:0 ")
        << "rank " << rank;
  }
}

TEST(ProfilerEventsShape, AlltoAllIsSendRecvPiecesAndCountZeroHasNoEvents) {
  EventJob job = runWithEvents("alltoall", kAllEvents, 5, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    float* buffer = nullptr;
    SIMTEST_CHECK(cudaMalloc(&buffer, 64 * sizeof(float)) == cudaSuccess, c, "cudaMalloc");
    SIMTEST_NCCL(ncclAlltoAll(buffer, buffer + 32, 4, ncclFloat32, comm, nullptr), c);
    SIMTEST_NCCL(ncclAllReduce(buffer, buffer, 0, ncclFloat32, ncclSum, comm, nullptr), c);
    SIMTEST_NCCL(ncclAllReduce(buffer, buffer, 4, ncclFloat32, ncclSum, comm, nullptr), c);
    SIMTEST_CHECK(cudaStreamSynchronize(nullptr) == cudaSuccess, c, "sync");
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  });
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  std::vector<LogLine> lines = rankLines(job.lines, 0);
  EXPECT_EQ(startsOf(lines, "CollApi").size(), 1u);  // the count-0 allreduce made none
  std::vector<LogLine> colls = startsOf(lines, "Coll");
  ASSERT_EQ(colls.size(), 1u);
  EXPECT_EQ(colls[0].get("seq"), "0");  // NCCL never counted the count-0 one
  EXPECT_EQ(startsOf(lines, "GroupApi").size(), 2u);
  std::vector<LogLine> apis = startsOf(lines, "P2pApi");
  ASSERT_EQ(apis.size(), 4u);  // a send and a receive per rank
  EXPECT_EQ(apis[0].get("count"), "4");
  std::vector<LogLine> pieces = startsOf(lines, "P2p");
  ASSERT_EQ(pieces.size(), 4u);
  int sends = 0;
  for (const LogLine& piece : pieces) sends += piece.get("func") == "Send";
  EXPECT_EQ(sends, 2);
}

// The proxy steps of one rank's ProxyOps toward `peer` in one direction.
struct ProxySteps {
  std::vector<LogLine> ops;
  std::vector<LogLine> steps;
};
ProxySteps proxySteps(const std::vector<LogLine>& lines, int peer, bool send) {
  ProxySteps found;
  for (const LogLine& op : startsOf(lines, "ProxyOp")) {
    if (op.get("peer") != std::to_string(peer) || op.get("send") != (send ? "1" : "0")) continue;
    found.ops.push_back(op);
    for (const LogLine& step : startsOf(lines, "ProxyStep", op.get("h")))
      found.steps.push_back(step);
  }
  return found;
}

// Whether a step of these sits in `state` as its last state and was never stopped.
bool waitsIn(const std::vector<LogLine>& lines, const ProxySteps& proxy, const std::string& state,
             const std::string& step = "") {
  for (const LogLine& line : proxy.steps) {
    if (!step.empty() && line.get("step") != step) continue;
    const std::string states = statesOf(lines, line.get("h"));
    const bool last =
        states.size() >= state.size() &&
        states.compare(states.size() - state.size(), state.size(), state) == 0 &&
        (states.size() == state.size() || states[states.size() - state.size() - 1] == ' ');
    if (last && !hasLine(lines, "stop", line.get("h"))) return true;
  }
  return false;
}

bool kernelsStartedNotStopped(const std::vector<LogLine>& lines) {
  std::vector<LogLine> kernels = startsOf(lines, "KernelCh");
  if (kernels.empty()) return false;
  for (const LogLine& kernel : kernels) {
    if (hasLine(lines, "stop", kernel.get("h"))) return false;
  }
  return true;
}

// A rank that skips an allreduce in a ring of four: the ranks around it wait on it by name, the
// one further downstream waits at its last step on the neighbour the data must come through;
// every waiting rank's kernel started and never stopped before the abort.
TEST(ProfilerEventsHang, WaitingStepsNameTheMissingRank) {
  EventOptions options;
  options.mask = kAllEvents;
  options.nranks = 4;
  EventJob job = runWithEvents("hang", options, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    Buffers b = buffers(64);
    if (c.rank != 1) {
      SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 8, ncclFloat32, ncclSum, comm, b.stream), c);
    }
    usleep(1'000'000);  // the proxies reach their waits (slow under sanitizers)
    ncclCommAbort(comm);
    return 0;
  });
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  const std::vector<LogLine> rank0 = rankLines(job.lines, 0), rank2 = rankLines(job.lines, 2),
                             rank3 = rankLines(job.lines, 3);
  // Rank 2 receives from rank 1 (step 0); rank 0 sends to it and gets no room (step 0).
  EXPECT_TRUE(waitsIn(rank2, proxySteps(rank2, 1, false), "10", "0"));
  EXPECT_TRUE(waitsIn(rank0, proxySteps(rank0, 1, true), "20", "0"));
  EXPECT_EQ(statesOf(rank0, proxySteps(rank0, 1, true).steps.front().get("h")), "8 20");
  // Rank 3 got rank 2's own data and waits at the last step for what rank 1 would add.
  EXPECT_TRUE(waitsIn(rank3, proxySteps(rank3, 2, false), "10", "1"));
  EXPECT_FALSE(waitsIn(rank3, proxySteps(rank3, 2, false), "10", "0"));
  EXPECT_EQ(proxySteps(rank2, 1, false).ops.size(), 2u);  // one per channel
  for (const LogLine& op : proxySteps(rank2, 1, false).ops) {
    EXPECT_EQ(op.get("nsteps"), "2");
    EXPECT_EQ(op.get("ownpid"), "1");
  }
  for (const auto* lines : {&rank0, &rank2, &rank3}) EXPECT_TRUE(kernelsStartedNotStopped(*lines));
  EXPECT_TRUE(startsOf(rankLines(job.lines, 1), "Coll").empty());  // the rank that skipped
}

// Point-to-point waits: a receive nobody sends waits on its sender by name; a send nobody
// receives was posted (the sim's sends are eager) and waits for completion toward its receiver.
TEST(ProfilerEventsHang, UnmatchedSendAndReceiveWaitOnTheirPeers) {
  EventOptions options;
  options.mask = kAllEvents;
  options.nranks = 3;
  EventJob job = runWithEvents("p2p-hang", options, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    Buffers b = buffers(64);
    if (c.rank == 0) SIMTEST_NCCL(ncclSend(b.data, 8, ncclFloat32, 1, comm, b.stream), c);
    if (c.rank == 1) SIMTEST_NCCL(ncclRecv(b.data, 8, ncclFloat32, 2, comm, b.stream), c);
    usleep(1'000'000);  // the proxies reach their waits (slow under sanitizers)
    ncclCommAbort(comm);
    return 0;
  });
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  const std::vector<LogLine> rank0 = rankLines(job.lines, 0), rank1 = rankLines(job.lines, 1);
  EXPECT_TRUE(waitsIn(rank0, proxySteps(rank0, 1, true), "9", "0"));
  EXPECT_EQ(statesOf(rank0, proxySteps(rank0, 1, true).steps.front().get("h")), "8 20 9");
  EXPECT_TRUE(waitsIn(rank1, proxySteps(rank1, 2, false), "10", "0"));
  EXPECT_TRUE(kernelsStartedNotStopped(rank0));
  EXPECT_TRUE(kernelsStartedNotStopped(rank1));
}

// The stall fault at seq 2: the stalled rank's kernel started, its send waits on its own GPU and
// its receive holds data the GPU never takes; its peer waits to receive from it.
TEST(ProfilerEventsHang, AStalledRankWaitsOnItsGpu) {
  EventOptions options;
  options.mask = kAllEvents;
  options.env = {{"NCCLSIM_FAULT", "stall:rank=1,seq=2"}};
  EventJob job = runWithEvents("stall", options, [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    Buffers b = buffers(64);
    SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 8, ncclFloat32, ncclSum, comm, b.stream), c);
    SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 8, ncclFloat32, ncclSum, comm, b.stream), c);
    usleep(1'000'000);  // the proxies reach their waits (slow under sanitizers)
    ncclCommAbort(comm);
    return 0;
  });
  ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
  const std::vector<LogLine> stalled = rankLines(job.lines, 1), peer = rankLines(job.lines, 0);
  std::vector<LogLine> colls = startsOf(stalled, "Coll");
  ASSERT_EQ(colls.size(), 2u);
  std::vector<LogLine> kernels = startsOf(stalled, "KernelCh", colls[1].get("h"));
  ASSERT_EQ(kernels.size(), 2u);
  for (const LogLine& kernel : kernels) EXPECT_FALSE(hasLine(stalled, "stop", kernel.get("h")));
  ProxySteps sends = proxySteps(stalled, 0, true);
  ASSERT_EQ(sends.ops.size(), 4u);  // two channels, two collectives
  EXPECT_EQ(sends.ops[2].get("parent"), colls[1].get("h"));
  EXPECT_TRUE(waitsIn(stalled, sends, "8", "0"));
  EXPECT_TRUE(waitsIn(stalled, proxySteps(stalled, 0, false), "12", "0"));  // RecvGPUWait
  EXPECT_TRUE(waitsIn(peer, proxySteps(peer, 1, false), "10", "0"));
  EXPECT_TRUE(waitsIn(peer, proxySteps(peer, 1, true), "20", "0"));
}

// A captured allreduce replayed three times. Without proxy work NCCL runs its Coll events once,
// at capture, with a seqNumber it does not count; with KernelCh it runs them at every replay
// (from the host callback) and counts them.
TEST(ProfilerEventsGraph, CapturedCollectivesFollowNcclsReplayRule) {
  auto scenario = [](const RankContext& c) {
    ncclComm_t comm = simtest::initComm(c);
    SIMTEST_CHECK(comm != nullptr, c, "init");
    Buffers b = buffers(64);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    SIMTEST_CHECK(cudaStreamBeginCapture(b.stream, cudaStreamCaptureModeGlobal) == cudaSuccess, c,
                  "begin capture");
    SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 8, ncclFloat32, ncclSum, comm, b.stream), c);
    SIMTEST_CHECK(cudaStreamEndCapture(b.stream, &graph) == cudaSuccess, c, "end capture");
    SIMTEST_CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, c, "instantiate");
    for (int replay = 0; replay < 3; ++replay) {
      SIMTEST_CHECK(cudaGraphLaunch(exec, b.stream) == cudaSuccess, c, "launch");
    }
    // Replays' Coll events come from the stream, a launch's from this thread: wait, so that the
    // numbering does not depend on which comes first (in NCCL neither).
    SIMTEST_CHECK(cudaStreamSynchronize(b.stream) == cudaSuccess, c, "sync");
    SIMTEST_NCCL(ncclAllReduce(b.data, b.data, 8, ncclFloat32, ncclSum, comm, b.stream), c);
    SIMTEST_CHECK(cudaStreamSynchronize(b.stream) == cudaSuccess, c, "sync");
    SIMTEST_NCCL(ncclCommDestroy(comm), c);
    return 0;
  };
  EventJob once = runWithEvents("graph-coll", abi::kColl, 5, scenario);
  ASSERT_TRUE(once.result.allExitedZero()) << once.result.summary();
  std::vector<LogLine> lines = rankLines(once.lines, 0);
  std::vector<LogLine> apis = startsOf(lines, "CollApi");
  ASSERT_EQ(apis.size(), 2u);
  EXPECT_EQ(apis[0].get("captured"), "1");
  EXPECT_EQ(startsOf(lines, "GroupApi").front().get("captured"), "1");
  EXPECT_EQ(apis[1].get("captured"), "0");
  std::vector<LogLine> colls = startsOf(lines, "Coll");
  ASSERT_EQ(colls.size(), 2u);
  EXPECT_EQ(colls[0].get("seq"), "0");
  EXPECT_EQ(colls[1].get("seq"), "0");  // the captured one was not counted

  EventJob replayed = runWithEvents("graph-kernel", abi::kColl | abi::kKernelCh, 5, scenario);
  ASSERT_TRUE(replayed.result.allExitedZero()) << replayed.result.summary();
  lines = rankLines(replayed.lines, 0);
  colls = startsOf(lines, "Coll");
  ASSERT_EQ(colls.size(), 4u);
  std::string sequence;
  for (const LogLine& coll : colls) sequence += coll.get("seq") + " ";
  EXPECT_EQ(sequence, "0 1 2 3 ");
  apis = startsOf(lines, "CollApi");
  ASSERT_EQ(apis.size(), 2u);
  for (int replay = 0; replay < 3; ++replay) {
    EXPECT_EQ(colls[replay].get("parent"), apis[0].get("h"));
    EXPECT_NE(colls[replay].get("tid"), apis[0].get("tid"));  // the host callback's thread
    EXPECT_EQ(startsOf(lines, "KernelCh", colls[replay].get("h")).size(), 2u);
  }
}

TEST(ProfilerVersion, TheLoaderTakesTheNewestTableItKnows) {
  for (int maxVersion : {7, 6, 5, 4, 3}) {
    EventJob job = runWithEvents("version", 0, maxVersion, worldAndSplit);
    ASSERT_TRUE(job.result.allExitedZero()) << job.result.summary();
    ASSERT_FALSE(job.lines.empty());
    EXPECT_EQ(job.lines.front().get("v"), std::to_string(maxVersion));
  }
  // A plugin with only v4 (NCCL 2.27's) is taken by 2.28's loader, which still knows v4; a
  // 2.26 loader (v3 and older) finds nothing it knows in it.
  for (const auto& [maxVersion, expected] : {std::pair{"5", 4}, std::pair{"3", 0}}) {
    const std::string log = tempPath("v4only");
    unlink(log.c_str());
    simtest::JobOptions options;
    options.env = {{"NCCL_PROFILER_PLUGIN", SIMTEST_V4_PLUGIN_PATH},
                   {"SIMTEST_PROFILER_LOG", log},
                   {"NCCLSIM_PROFILER_MAX_VERSION", maxVersion}};
    const auto result = simtest::runJob(options, worldAndSplit);
    ASSERT_TRUE(result.allExitedZero()) << result.summary();
    EXPECT_EQ(countOf(simtest::readFile(log), " init v=4 commId="), expected)
        << simtest::readFile(log);
    if (expected == 0) {
      EXPECT_NE(result.err[0].find("no ncclProfiler_v3..v3 table"), std::string::npos)
          << result.err[0];
    }
    unlink(log.c_str());
  }
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
  cudaSetDevice(context.rank % 8);  // a GPU each, as the harness gives its ranks (NCCL refuses two)
  ASSERT_EQ(worldAndSplit(context), 0);
}

}  // namespace
