// libncclwatch.so as a user meets it: it exports nothing but NCCL's API and its own C API,
// loads with nothing but libc and libstdc++, wraps every host function NCCL exports, and records
// exactly the calls a program makes, with communicator ids that agree across ranks.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "command.h"
#include "job.h"
#include "trace/ring_reader.h"
#include "traces.h"

// Built with TSan (GCC says so with __SANITIZE_THREAD__, Clang with __has_feature).
#if defined(__SANITIZE_THREAD__)
#define NCCLWATCH_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define NCCLWATCH_TEST_TSAN 1
#endif
#endif
#ifndef NCCLWATCH_TEST_TSAN
#define NCCLWATCH_TEST_TSAN 0
#endif

namespace {

using namespace std::chrono_literals;
using ncclwatch::trace::CallRecord;
using ncclwatch::trace::OpKind;
using ncclwatch::trace::RecordState;
using ncclwatch::trace::TraceFile;

std::string command(const std::string& line) {
  return testsupport::command(line, "").text;
}

std::set<std::string> exportedNames(const std::string& library) {
  std::istringstream lines(command("nm -D --defined-only " + library + " | awk '{print $3}'"));
  std::set<std::string> names;
  for (std::string name; std::getline(lines, name);) {
    if (!name.empty()) names.insert(name);
  }
  return names;
}

const std::string kPreload = NCCLWATCH_PRELOAD;

TEST(ExportSurface, OnlyNcclApiAndOurCApi) {
  std::regex allowed("^(nccl[A-Z][A-Za-z0-9_]*|ncclProfiler_v[0-9]+|ncclwatch[A-Za-z0-9_]*)$");
  std::set<std::string> names = exportedNames(kPreload);
  ASSERT_FALSE(names.empty());
  for (const std::string& name : names) {
    EXPECT_TRUE(std::regex_match(name, allowed)) << name << " must not be exported";
    EXPECT_NE(name.rfind("pnccl", 0), 0u) << "pnccl* belong to NCCL";
  }
  std::istringstream needed(
      command("readelf -d " + kPreload + " | sed -n 's/.*Shared library: \\[\\(.*\\)\\]/\\1/p'"));
  std::regex allowedLibrary("^(libc|libm|libstdc\\+\\+|libgcc_s|ld-linux-x86-64)\\.so.*");
  for (std::string library; std::getline(needed, library);) {
    EXPECT_TRUE(std::regex_match(library, allowedLibrary)) << library << " would load into hosts";
  }
}

TEST(ExportSurface, EveryHostFunctionOfRealNcclIsWrapped) {
  std::set<std::string> ours = exportedNames(kPreload);
  // The device-API host helpers need no recording: a kernel does that communication.
  std::regex deviceApi("^nccl(DevComm|Team|Lsa|Gin|LLA2A).*|^ncclResetDebugInitInternal$");
  int checked = 0;
  for (const std::string& name :
       exportedNames(std::string(NCCLWATCH_REAL_CUDA_LIB_DIR) + "/libnccl.so.2")) {
    if (name.rfind("nccl", 0) != 0 || std::regex_match(name, deviceApi)) continue;
    EXPECT_TRUE(ours.count(name)) << name << " is not wrapped";
    ++checked;
  }
  EXPECT_EQ(checked, 41);
}

// The NCCL functions a list of interpose/ names: the first nccl name of each NCCL_* line.
std::set<std::string> listedFunctions(const std::string& defPath) {
  std::ifstream in(defPath);
  std::set<std::string> names;
  const std::regex name(R"(\bnccl[A-Z][A-Za-z0-9]*\b)");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("NCCL_", 0) != 0) continue;
    std::smatch found;
    if (std::regex_search(line, found, name)) names.insert(found[0]);
  }
  return names;
}

// The device-API host helpers of NCCL 2.28-2.32 (nccl_device/host.h) that set up what a kernel
// then does: neither list wraps them (see the top of interpose/nccl_api_newer.def).
const std::regex kDeviceApiHelper(
    "^nccl(DevComm|Team|Lsa|Gin|LLA2A|Cft).*|^ncclGet[A-Za-z]*Device(Pointer|LeInfo)$|"
    "^ncclResetDebugInitInternal$");

TEST(ExportSurface, EveryNewerHostFunctionOfTheWheelIsListedAndWrapped) {
  std::set<std::string> ours = exportedNames(kPreload);
  std::set<std::string> newer = listedFunctions(NCCLWATCH_NEWER_API_DEF);
  ASSERT_EQ(newer.size(), 35u) << "could not read " << NCCLWATCH_NEWER_API_DEF;
  if (!NCCLWATCH_HAS_NEWER_API) {
    // Built without NCCL 2.32's nccl.h: the list is left out, and none of it is exported.
    for (const std::string& name : newer) EXPECT_EQ(ours.count(name), 0u) << name;
    GTEST_SKIP() << "no NCCL 2.32 nccl.h in this build: the 2.29-2.32 list is left out";
  }
  std::set<std::string> wheel = exportedNames(NCCLWATCH_WHEEL_NCCL);
  ASSERT_FALSE(wheel.empty()) << "could not read " << NCCLWATCH_WHEEL_NCCL;
  int checked = 0;
  for (const std::string& name : newer) {
    EXPECT_TRUE(wheel.count(name)) << name << " is listed, but NCCL 2.32.3 does not export it";
    EXPECT_TRUE(ours.count(name)) << name << " is listed, but libncclwatch.so does not export it";
    ++checked;
  }
  EXPECT_EQ(checked, 35);
  // Every nccl* function of 2.32.3 is in one of the two lists or is a device-API helper.
  std::set<std::string> older = listedFunctions(NCCLWATCH_API_DEF);
  int helpers = 0;
  for (const std::string& name : wheel) {
    if (name.rfind("nccl", 0) != 0 || older.count(name) || newer.count(name)) continue;
    EXPECT_TRUE(std::regex_match(name, kDeviceApiHelper))
        << name << " is exported by NCCL 2.32.3 but neither wrapped nor a device-API helper";
    ++helpers;
  }
  EXPECT_GT(helpers, 0);
}

// The nccl* functions that PyTorch's libtorch_cuda.so imports (from the build's torch venv when
// it has one), or else those that PyTorch 2.15 was found to import beyond NCCL 2.28 (the set
// sim/nccl/newer_api.cc implements for it).
std::set<std::string> ncclImportsOfPyTorch(std::string* source) {
  std::error_code error;
  const std::filesystem::path lib = std::filesystem::path(NCCLWATCH_TORCH_VENV) / "lib";
  for (const auto& python : std::filesystem::directory_iterator(lib, error)) {
    std::filesystem::path torch = python.path() / "site-packages/torch/lib/libtorch_cuda.so";
    if (!std::filesystem::exists(torch)) continue;
    std::istringstream lines(command("nm -D --undefined-only " + torch.string() +
                                     " | awk '{print $2}' | sed 's/@.*//'"));
    std::set<std::string> names;
    for (std::string name; std::getline(lines, name);) {
      if (name.rfind("nccl", 0) == 0) names.insert(name);
    }
    *source = torch.string();
    return names;
  }
  *source = "PyTorch 2.15's known imports (no torch venv in this build)";
  return {"ncclCommGrow",
          "ncclCommSuspend",
          "ncclCommResume",
          "ncclCommGetUniqueId",
          "ncclCommMemStats",
          "ncclPutSignal",
          "ncclSignal",
          "ncclWaitSignal",
          "ncclWinGetUserPtr",
          "ncclGetPeerDevicePointer",
          "ncclGetLsaMultimemDevicePointer"};
}

TEST(ExportSurface, EveryNcclHostFunctionPyTorchImportsIsWrapped) {
  if (!NCCLWATCH_HAS_NEWER_API) GTEST_SKIP() << "no NCCL 2.32 nccl.h in this build";
  std::string source;
  std::set<std::string> imported = ncclImportsOfPyTorch(&source);
  ASSERT_FALSE(imported.empty()) << source;
  std::set<std::string> listed = listedFunctions(NCCLWATCH_API_DEF);
  listed.merge(listedFunctions(NCCLWATCH_NEWER_API_DEF));
  std::set<std::string> ours = exportedNames(kPreload);
  // Only the device-API helpers that 2.28 already left to NCCL (ncclDevCommCreate...) may be
  // missing: PyTorch's window pointer queries (ncclGet*DevicePointer) must be wrapped.
  const std::regex deviceApiOf228("^nccl(DevComm|Team|Lsa|Gin|LLA2A).*");
  int checked = 0;
  for (const std::string& name : imported) {
    if (std::regex_match(name, deviceApiOf228)) continue;
    ++checked;
    EXPECT_TRUE(listed.count(name)) << name << " (imported by " << source << ") is in no list";
    EXPECT_TRUE(ours.count(name)) << name << " (imported by " << source << ") is not exported";
  }
  std::printf("checked %d nccl* imports of %s\n", checked, source.c_str());
}

// In a sanitizer build libncclwatch.so is instrumented: the sanitizer's runtime must come first
// in the initial library list, so it is preloaded ahead of it.
std::string preloadList() {
  const std::string runtime = NCCLWATCH_SANITIZER_RUNTIME;
  return runtime.empty() ? kPreload : runtime + ":" + kPreload;
}

testsupport::JobSpec preloaded(const std::string& program, int ranks, const std::string& logDir,
                               std::vector<std::string> args = {}) {
  testsupport::JobSpec spec;
  spec.program = program;
  spec.args = std::move(args);
  spec.ranks = ranks;
  spec.env = {{"LD_PRELOAD", preloadList()}, {"NCCLWATCH_DIR", logDir}};
  if (!std::string(NCCLWATCH_SANITIZER_RUNTIME).empty()) {
    // An instrumented reader takes seconds over the default 4 MiB ring; these runs make far
    // fewer calls than 1024. A case that sets its own size overrides this (set later).
    spec.env.push_back({"NCCLWATCH_RING_RECORDS", "1024"});
  }
  return spec;
}

// The first sanitizer report (a race, a memory error, undefined behaviour, a leak) in a job's
// output, or "" when there is none.
std::string sanitizerReport(const testsupport::Job& job) {
  for (int rank = 0; rank < job.ranks(); ++rank) {
    std::string output = job.output(rank);
    for (const char* marker : {"Sanitizer", "runtime error:"}) {
      size_t at = output.find(marker);
      if (at == std::string::npos) continue;
      size_t begin = output.rfind('\n', at);
      begin = begin == std::string::npos ? 0 : begin + 1;
      return "rank " + std::to_string(rank) + ": " + output.substr(begin, 4000);
    }
  }
  return "";
}

// A job of preloaded programs that fails the test if any of its processes printed a sanitizer
// report, also one that the test killed or stopped waiting for.
class CheckedJob : public testsupport::Job {
 public:
  using Job::Job;
  ~CheckedJob() { EXPECT_EQ(sanitizerReport(*this), ""); }
};

TEST(Recording, BcastIsRecordedOnce) {
  std::string logs = testsupport::freshDirectory("bcast");
  CheckedJob job(preloaded(NCCLWATCH_BCAST_PROBE, 1, logs));
  ASSERT_TRUE(job.waitExit(30s));
  ASSERT_EQ(job.exitStatus(0), 0) << job.output(0);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 1u);
  std::map<OpKind, int> counts;
  for (const CallRecord& record : files[0].records) ++counts[record.op];
  EXPECT_EQ(counts[OpKind::kBroadcast], 1);
  EXPECT_EQ(counts[OpKind::kInit], 1);
  EXPECT_EQ(counts[OpKind::kDestroy], 1);
  EXPECT_EQ(files[0].header.cleanShutdown, 1u);
}

// Launched by MPICH's or Intel MPI's Hydra (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID), no RANK: the
// trace still says which rank it is (before, "rank -1" in every verdict).
TEST(Recording, TheRankComesFromMpiLaunchersVariablesToo) {
  std::string logs = testsupport::freshDirectory("pmi-rank");
  testsupport::JobSpec spec = preloaded(NCCLWATCH_BCAST_PROBE, 1, logs);
  spec.env.push_back({"PMI_RANK", "3"});
  spec.env.push_back({"PMI_SIZE", "8"});
  spec.env.push_back({"MPI_LOCALRANKID", "1"});
  spec.unsetEnv = {"RANK", "WORLD_SIZE", "LOCAL_RANK"};
  CheckedJob job(spec);
  ASSERT_TRUE(job.waitExit(30s));
  ASSERT_EQ(job.exitStatus(0), 0) << job.output(0);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].header.rank, 3);
  EXPECT_EQ(files[0].header.world, 8);
  EXPECT_EQ(files[0].header.localRank, 1);
}

// ncclCommInitAll in one process (nccl-tests' -g N): NCCL runs the inits on threads of its own,
// where no wrapper is on the stack. The interposer still records them (once each), and the
// plugin role must not take that for a statically linked NCCL that bypasses the wrappers.
TEST(Recording, InitAllIsTheInterposersAndNotABypass) {
  std::string logs = testsupport::freshDirectory("init-all");
  CheckedJob job(preloaded(NCCLWATCH_INIT_ALL_PROBE, 1, logs));
  ASSERT_TRUE(job.waitExit(30s));
  ASSERT_EQ(job.exitStatus(0), 0) << job.output(0);
  EXPECT_EQ(job.output(0).find("do not reach the LD_PRELOAD wrappers"), std::string::npos)
      << job.output(0);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 1u);
  std::map<OpKind, int> counts;
  for (const CallRecord& record : files[0].records) {
    ++counts[record.op];
    EXPECT_EQ(record.flags & ncclwatch::trace::kRecordFromPlugin, 0)
        << "a record from the plugin: op " << static_cast<int>(record.op);
  }
  EXPECT_EQ(counts[OpKind::kInit], 2);
  EXPECT_EQ(counts[OpKind::kAllReduce], 2);
  EXPECT_EQ(counts[OpKind::kDestroy], 2);
}

// NCCL 2.29-2.32's calls on the sim: ncclAllReduceConfig is recorded like ncclAllReduce (op,
// count, type, reduction, its place in the sequence); ncclCommGrow, which the sim does not
// model, is forwarded and its error reaches the program unchanged, recorded as a failed Grow
// with no grown communicator; ncclWaitSignal (not modelled either) is recorded outside the
// sequence with the signals it waits for.
TEST(Recording, NewerApiCallsAreRecordedAndTheirResultsUnchanged) {
  if (!NCCLWATCH_HAS_NEWER_API) GTEST_SKIP() << "no NCCL 2.32 nccl.h in this build";
  std::string logs = testsupport::freshDirectory("newer_api");
  CheckedJob job(preloaded(NCCLWATCH_NEWER_API_PROBE, 1, logs));
  ASSERT_TRUE(job.waitExit(30s));
  const std::string output = job.output(0);
  ASSERT_EQ(job.exitStatus(0), 0) << output;
  EXPECT_NE(output.find("allreduce-config=0\n"), std::string::npos) << output;
  EXPECT_NE(output.find("grow=5 newcomm-null=1 error=ncclCommGrow: growing a communicator is "
                        "not modelled by the sim"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("wait-signal=5\n"), std::string::npos) << output;

  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 1u);
  const TraceFile& file = files[0];
  ASSERT_EQ(file.comms.size(), 1u) << "a failed grow registers no communicator";
  std::map<OpKind, std::vector<const CallRecord*>> byOp;
  for (const CallRecord& record : file.records) byOp[record.op].push_back(&record);
  ASSERT_EQ(byOp[OpKind::kAllReduce].size(), 1u);
  const CallRecord& allReduce = *byOp[OpKind::kAllReduce][0];
  EXPECT_EQ(allReduce.seq, 1u);
  EXPECT_EQ(allReduce.count, 1000u);
  EXPECT_EQ(allReduce.dtype, 9);  // ncclBfloat16
  EXPECT_EQ(allReduce.redop, 2);  // ncclMax
  EXPECT_EQ(allReduce.state, RecordState::kCompleted);
  ASSERT_EQ(byOp[OpKind::kGrow].size(), 1u);
  const CallRecord& grow = *byOp[OpKind::kGrow][0];
  EXPECT_EQ(grow.commHash, allReduce.commHash);
  EXPECT_EQ(grow.seq, 2u);
  EXPECT_EQ(grow.count, 2u);
  EXPECT_EQ(grow.state, RecordState::kFailed);
  EXPECT_EQ(grow.result, 5);  // ncclInvalidUsage, as the sim returned it
  ASSERT_EQ(byOp[OpKind::kWaitSignal].size(), 1u);
  const CallRecord& wait = *byOp[OpKind::kWaitSignal][0];
  EXPECT_EQ(wait.seq, 0u) << "one-sided operations stay out of the sequence";
  EXPECT_EQ(wait.count, 3u);
  EXPECT_EQ(wait.rootOrPeer, 0);
  EXPECT_EQ(wait.state, RecordState::kFailed);
  EXPECT_EQ(wait.result, 5);

  std::string shown = command(std::string(NCCLWATCH_BINARY) + " show " + file.path);
  EXPECT_TRUE(std::regex_search(shown, std::regex(R"(\s1\s+AllReduce\s+1000\s+bfloat16\s+max\s)")))
      << shown;
  EXPECT_TRUE(std::regex_search(shown, std::regex(R"(\s2\s+Grow\s+2\s.*\sfailed\s)"))) << shown;
  EXPECT_TRUE(std::regex_search(shown, std::regex(R"(\s0\s+WaitSignal\s+3\s.*\sfailed\s)")))
      << shown;
}

// "A child never writes into its parent's ring; an exec'd child gets its own." fork_probe makes
// 3 allreduces, forks a child that makes its own communicator and 5 allreduces, makes 2 more,
// then spawns itself, and that exec'd child makes 7: three files of three processes, each holding
// exactly its own process's calls.
TEST(Recording, ForkChildNeverWritesIntoItsParentsRing) {
#if NCCLWATCH_TEST_TSAN
  // The fork child starts threads (the sim's engine, the watchdog) after a multi-threaded fork,
  // which TSan does not support: it stops checking the child and then dies in its own thread
  // registry ("dup thread with used id"), with or without die_after_fork=0.
  GTEST_SKIP() << "TSan does not support starting threads after a multi-threaded fork";
#endif
  std::string logs = testsupport::freshDirectory("fork");
  testsupport::JobSpec spec = preloaded(NCCLWATCH_FORK_PROBE, 1, logs);
  spec.env.push_back({"NCCLWATCH_POLL_MS", "20"});
  CheckedJob job(spec);
  ASSERT_TRUE(job.waitExit(60s)) << job.output(0);
  ASSERT_EQ(job.exitStatus(0), 0) << job.output(0);

  // The pid of each process, as it printed it.
  std::map<std::string, int> pidOf;
  const std::string output = job.output(0);
  const std::regex line(R"((parent|fork-child|exec-child) pid=(\d+))");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    pidOf[(*it)[1]] = std::stoi((*it)[2]);
  }
  ASSERT_EQ(pidOf.size(), 3u) << output;
  // The fork child starts with no watchdog thread (the parent's did not survive the fork) and
  // gets its own at its first communicator; the parent's keeps running.
  EXPECT_NE(output.find("fork-child watchdogs before=0 after=1"), std::string::npos) << output;
  EXPECT_NE(output.find("exec-child watchdogs before=0 after=1"), std::string::npos) << output;
  const std::map<std::string, int> allReducesOf = {
      {"parent", 5}, {"fork-child", 5}, {"exec-child", 7}};

  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 3u) << output;
  std::map<int, const TraceFile*> fileOf;
  std::set<uint64_t> commHashes;
  for (const TraceFile& file : files) fileOf[file.header.pid] = &file;
  ASSERT_EQ(fileOf.size(), 3u) << "three files of three distinct processes";
  for (const auto& [role, pid] : pidOf) {
    SCOPED_TRACE(role + " pid " + std::to_string(pid));
    ASSERT_TRUE(fileOf.count(pid)) << "no trace file of this process";
    const TraceFile& file = *fileOf.at(pid);
    EXPECT_TRUE(file.usable);
    EXPECT_TRUE(file.problems.empty()) << file.problems.front().what;
    EXPECT_NE(file.path.find("-" + std::to_string(pid) + ".ncclwatch"), std::string::npos)
        << file.path;
    // Nothing but this process's own calls, on its own communicator: no other process reserved
    // a slot of this ring (nextIndex counts every reservation).
    ASSERT_EQ(file.comms.size(), 1u);
    const uint64_t comm = file.comms[0].commHash;
    EXPECT_TRUE(commHashes.insert(comm).second) << "a communicator of another process";
    EXPECT_EQ(file.header.nextIndex, file.records.size());
    std::map<OpKind, int> counts;
    uint64_t lastSeq = 0;
    int otherThreads = 0, firstOther = 0;  // the probe calls NCCL on its main thread only
    for (const CallRecord& record : file.records) {
      ++counts[record.op];
      if (record.threadId != pid && otherThreads++ == 0) firstOther = record.threadId;
      EXPECT_EQ(record.commHash, comm) << opName(record.op) << " " << record.seq;
      EXPECT_EQ(record.result, 0);
      if (record.op != OpKind::kAllReduce) continue;
      EXPECT_EQ(record.seq, lastSeq + 1) << "sequence gap";
      lastSeq = record.seq;
    }
    EXPECT_EQ(otherThreads, 0) << otherThreads << " of " << file.records.size()
                               << " records name thread " << firstOther
                               << ", not this process's main thread";
    EXPECT_EQ(counts[OpKind::kAllReduce], allReducesOf.at(role));
    EXPECT_EQ(lastSeq, static_cast<uint64_t>(allReducesOf.at(role)));
    EXPECT_EQ(counts[OpKind::kInit], 1);
    EXPECT_EQ(counts[OpKind::kDestroy], 1);
  }
  // The processes that exited normally said so in their own files; the parent's calls all
  // completed (its watchdog thread did not die with the fork).
  EXPECT_EQ(fileOf.at(pidOf.at("parent"))->header.cleanShutdown, 1u);
  EXPECT_EQ(fileOf.at(pidOf.at("exec-child"))->header.cleanShutdown, 1u);
  for (const std::string role : {"parent", "exec-child"}) {
    for (const CallRecord& record : fileOf.at(pidOf.at(role))->records) {
      EXPECT_EQ(record.state, RecordState::kCompleted)
          << role << " " << opName(record.op) << " " << record.seq;
    }
  }
}

// What one rank's file of a clean train_loop run of `steps` steps holds: exactly the calls it
// made, each completed on the GPU, with contiguous sequences per communicator.
void expectTrainLoopCalls(const TraceFile& file, int steps) {
  SCOPED_TRACE("rank " + std::to_string(file.header.rank));
  EXPECT_TRUE(file.problems.empty());
  EXPECT_EQ(file.header.cleanShutdown, 1u);
  std::map<OpKind, int> counts;
  std::map<uint64_t, uint64_t> lastSeq;
  std::map<OpKind, std::map<uint64_t, int>> sitesOf;
  for (const CallRecord& record : file.records) {
    ++counts[record.op];
    EXPECT_EQ(record.result, 0);
    // Every call finished, on the GPU for communication (seen through its events).
    EXPECT_EQ(record.state, RecordState::kCompleted) << opName(record.op) << " " << record.seq;
    EXPECT_GE(record.completeNs, record.startNs);
    EXPECT_GE(record.startNs, record.issueNs);
    if (isCollective(record.op) || isPointToPoint(record.op)) {
      EXPECT_EQ(
          record.flags & (ncclwatch::trace::kRecordNoEvents | ncclwatch::trace::kRecordCaptured), 0)
          << "completion not tracked for " << opName(record.op) << " " << record.seq;
    }
    if (isPointToPoint(record.op)) {
      EXPECT_NE(record.flags & ncclwatch::trace::kRecordInGroup, 0);  // the pipeline ring
    }
    // Splits and destroys name where the program called them, as collectives do (a verdict on
    // a split shows its line).
    if (record.op == OpKind::kSplit || record.op == OpKind::kDestroy) {
      EXPECT_NE(record.callSite, 0u) << opName(record.op) << " " << record.seq;
      ++sitesOf[record.op][record.callSite];
    }
    if (record.op == OpKind::kInit) continue;
    EXPECT_EQ(record.seq, lastSeq[record.commHash] + 1) << "sequence gap";
    lastSeq[record.commHash] = record.seq;
  }
  // Per step: TP allreduce, 3 bucket allreduces, barrier allreduce; allgather; reducescatter;
  // one send and one receive; the learning-rate broadcast. Plus the start broadcast.
  EXPECT_EQ(counts[OpKind::kAllReduce], 5 * steps);
  EXPECT_EQ(counts[OpKind::kAllGather], steps);
  EXPECT_EQ(counts[OpKind::kReduceScatter], steps);
  EXPECT_EQ(counts[OpKind::kSend], steps);
  EXPECT_EQ(counts[OpKind::kRecv], steps);
  EXPECT_EQ(counts[OpKind::kBroadcast], steps + 1);
  EXPECT_EQ(counts[OpKind::kInit], 3);
  EXPECT_EQ(counts[OpKind::kSplit], 2);
  EXPECT_EQ(counts[OpKind::kDestroy], 3);
  EXPECT_EQ(sitesOf[OpKind::kSplit].size(), 2u);  // the two splits are two lines of train_loop
}

// train_loop on 8 ranks, 3 steps: each rank's file holds exactly the calls it made, with
// contiguous sequences per communicator and communicator ids that agree across ranks.
TEST(Recording, TrainLoopFilesHoldExactlyTheCallsMade) {
  constexpr int kRanks = 8, kSteps = 3, kTp = 2;
  std::string logs = testsupport::freshDirectory("train");
  CheckedJob job(preloaded(std::string(NCCLWATCH_BUILD_DIR) + "/examples/train_loop", kRanks, logs,
                           {"--steps", std::to_string(kSteps), "--quiet"}));
  ASSERT_TRUE(job.waitExit(120s));
  for (int rank = 0; rank < kRanks; ++rank) ASSERT_EQ(job.exitStatus(rank), 0) << job.output(rank);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), static_cast<size_t>(kRanks));
  std::map<int, uint64_t> worldHashByRank, tpHashByRank, dpHashByRank;
  for (const TraceFile& file : files) {
    expectTrainLoopCalls(file, kSteps);
    ASSERT_EQ(file.comms.size(), 3u);
    worldHashByRank[file.header.rank] = file.comms[0].commHash;
    tpHashByRank[file.header.rank] = file.comms[1].commHash;
    dpHashByRank[file.header.rank] = file.comms[2].commHash;
    EXPECT_EQ(file.comms[1].parentHash, file.comms[0].commHash);
    EXPECT_NE(std::string(file.header.ncclLibrary).find("libnccl.so"), std::string::npos);
  }
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(worldHashByRank[rank], worldHashByRank[0]);
    // Split children agree exactly within their group and differ across groups.
    EXPECT_EQ(tpHashByRank[rank], tpHashByRank[rank - rank % kTp]);
    EXPECT_EQ(dpHashByRank[rank], dpHashByRank[rank % kTp]);
    if (rank >= kTp) {
      EXPECT_NE(tpHashByRank[rank], tpHashByRank[0]);
    }
  }
  EXPECT_NE(dpHashByRank[0], dpHashByRank[1]);
}

// NCCLWATCH_TRACE=full with a ring far smaller than the run: the file still holds every call,
// from the segments the watchdog appended, with nothing lost.
TEST(Recording, FullTraceKeepsTheWholeRunBeyondTheRing) {
  constexpr int kRanks = 4, kSteps = 40;
  std::string logs = testsupport::freshDirectory("full");
  testsupport::JobSpec spec =
      preloaded(std::string(NCCLWATCH_BUILD_DIR) + "/examples/train_loop", kRanks, logs,
                {"--steps", std::to_string(kSteps), "--quiet"});
  spec.env.push_back({"NCCLWATCH_TRACE", "full"});
  spec.env.push_back({"NCCLWATCH_RING_RECORDS", "256"});
  CheckedJob job(spec);
  ASSERT_TRUE(job.waitExit(120s));
  for (int rank = 0; rank < kRanks; ++rank) ASSERT_EQ(job.exitStatus(rank), 0) << job.output(rank);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), static_cast<size_t>(kRanks));
  for (const TraceFile& file : files) {
    EXPECT_TRUE(file.continuous);
    EXPECT_EQ(file.lostRecords, 0u);
    EXPECT_GT(file.records.size(), 256u);  // more than the ring holds
    EXPECT_GT(file.segmentRecords, 0u);
    expectTrainLoopCalls(file, kSteps);
  }
}

// A rank SIGKILLed in a hang leaves a file that reads, holding its calls up to the kill.
TEST(Recording, SigkilledRankFileStillReads) {
  std::string logs = testsupport::freshDirectory("killed");
  CheckedJob job(preloaded(std::string(NCCLWATCH_BUILD_DIR) + "/examples/train_loop", 4, logs,
                           {"--steps", "5", "--bug", "skip:rank=1,step=2"}));
  ASSERT_TRUE(job.waitUntilQuiet(1500ms, 60s));
  // Quiet output is not yet a hang on a loaded machine (a sanitizer build under -j2 can pause a
  // rank that long): the ranks must also have reached the skipped step's calls.
  auto reachedTheHang = [&] {
    std::vector<TraceFile> now = testsupport::readTraceFiles(logs);
    return now.size() == 4u && std::all_of(now.begin(), now.end(), [](const TraceFile& file) {
             return file.records.size() > 20u;
           });
  };
  for (auto deadline = std::chrono::steady_clock::now() + 60s;
       !reachedTheHang() && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(200ms);
  }
  job.signalAll(SIGKILL);
  ASSERT_TRUE(job.waitExit(10s));
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 4u);
  for (const TraceFile& file : files) {
    EXPECT_TRUE(file.usable);
    EXPECT_EQ(file.header.cleanShutdown, 0u);
    EXPECT_GT(file.records.size(), 20u);
  }
  std::string shown = command(std::string(NCCLWATCH_BINARY) + " show " + files[1].path);
  EXPECT_NE(shown.find("ended: not cleanly"), std::string::npos) << shown;
  EXPECT_NE(shown.find("AllReduce"), std::string::npos);
}

const CallRecord* findRecord(const TraceFile& file, OpKind op, uint64_t seq) {
  for (const CallRecord& record : file.records) {
    if (record.op == op && record.seq == seq) return &record;
  }
  return nullptr;
}

// A GPU stall at seq 6 of rank 1 (the sim's stall fault: the operation never finishes on its
// stream): record 6 is seen started (everything ahead of it on the stream finished) and never
// completes, while every earlier record completed.
TEST(Completion, StalledCallStaysStartedAndEarlierCallsComplete) {
  constexpr uint64_t kStalledSeq = 6;
  std::string logs = testsupport::freshDirectory("stall");
  testsupport::JobSpec spec = preloaded(
      std::string(NCCLWATCH_BUILD_DIR) + "/examples/allreduce_loop", 2, logs, {"--iters", "10"});
  spec.env.push_back({"NCCLSIM_FAULT", "stall:rank=1,seq=" + std::to_string(kStalledSeq)});
  spec.env.push_back({"NCCLWATCH_POLL_MS", "20"});
  CheckedJob job(spec);
  auto rankOneFile = [&]() -> TraceFile {
    for (TraceFile& file : testsupport::readTraceFiles(logs)) {
      if (file.header.rank == 1) return file;
    }
    return TraceFile{};
  };
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  TraceFile file;
  for (;;) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << job.output(1);
    if (std::filesystem::exists(logs)) file = rankOneFile();
    const CallRecord* stalled = findRecord(file, OpKind::kAllReduce, kStalledSeq);
    if (stalled != nullptr && stalled->state != RecordState::kIssued) break;
    std::this_thread::sleep_for(50ms);
  }
  std::this_thread::sleep_for(300ms);  // fifteen more polls: still not complete
  file = rankOneFile();
  ASSERT_TRUE(job.alive(1)) << "the stalled rank must still hang";
  const CallRecord* stalled = findRecord(file, OpKind::kAllReduce, kStalledSeq);
  ASSERT_NE(stalled, nullptr);
  EXPECT_EQ(stalled->state, RecordState::kStarted);
  EXPECT_GT(stalled->startNs, 0);
  EXPECT_EQ(stalled->completeNs, 0);
  int earlier = 0;
  for (const CallRecord& record : file.records) {
    if (record.op != OpKind::kAllReduce || record.seq >= kStalledSeq) continue;
    ++earlier;
    EXPECT_EQ(record.state, RecordState::kCompleted) << "seq " << record.seq;
  }
  EXPECT_EQ(earlier, static_cast<int>(kStalledSeq - 1));
  job.signalAll(SIGKILL);
}

// abort_probe with its fourth allreduce stalled, under the watchdog's NCCLWATCH_ON_HANG=abort
// (0.6 s hang threshold).
testsupport::JobSpec abortedOnHang(const std::string& logs, std::vector<std::string> args) {
  testsupport::JobSpec spec = preloaded(NCCLWATCH_ABORT_PROBE, 1, logs, std::move(args));
  spec.env.push_back({"NCCLSIM_FAULT", "stall:rank=0,seq=4"});
  spec.env.push_back({"NCCLWATCH_HANG_MS", "600"});
  spec.env.push_back({"NCCLWATCH_WARN_MS", "300"});
  spec.env.push_back({"NCCLWATCH_POLL_MS", "50"});
  spec.env.push_back({"NCCLWATCH_ON_HANG", "abort"});
  spec.env.push_back({"NCCLWATCH_COLLECTOR", "off"});
  return spec;
}

// NCCLWATCH_ON_HANG=abort aborts a hung communicator behind the application's back, and NCCL
// frees it there. An application that then handles the failure as PyTorch does (its watchdog
// polls ncclCommGetAsyncError and aborts the communicator itself; its main thread calls NCCL on
// the handle again) must see a clean failure, never a use after free: the sim stops the
// process on one, as real NCCL may crash on it.
TEST(Completion, AnApplicationHandlingTheAbortLikePyTorchNeverUsesTheFreedCommunicator) {
  std::string logs = testsupport::freshDirectory("abort-handled");
  CheckedJob job(abortedOnHang(logs, {"3"}));
  ASSERT_TRUE(job.waitExit(60s)) << job.output(0);
  const std::string output = job.output(0);
  EXPECT_EQ(job.exitStatus(0), 0) << output;
  EXPECT_EQ(output.find("use after free"), std::string::npos) << output;
  EXPECT_NE(output.find("aborting comm"), std::string::npos) << output;
  EXPECT_NE(output.find("async error: remote process exited or there was a network error"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("application's abort: no error"), std::string::npos) << output;
  EXPECT_NE(output.find("allreduce after the abort: remote process exited"), std::string::npos)
      << output;
  EXPECT_NE(output.find("last error: ncclwatch aborted this communicator"), std::string::npos)
      << output;
  EXPECT_NE(output.find("destroy: no error"), std::string::npos) << output;
  // Said once, on the first call that was answered instead of NCCL.
  EXPECT_NE(output.find("on a communicator that ncclwatch aborted"), std::string::npos) << output;
  // The trace tells the abort: the stalled call ended aborted.
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 1u);
  const CallRecord* stalled = findRecord(files[0], OpKind::kAllReduce, 4);
  ASSERT_NE(stalled, nullptr);
  EXPECT_EQ(stalled->state, RecordState::kAborted);
  // The abort is ncclwatch's, and says so (the application's own, answered by the wrappers,
  // never reached NCCL): the analysis must not take it for the application's.
  int aborts = 0;
  for (const CallRecord& record : files[0].records) {
    if (record.op != OpKind::kAbort) continue;
    ++aborts;
    EXPECT_NE(record.flags & ncclwatch::trace::kRecordByNcclwatch, 0);
  }
  EXPECT_EQ(aborts, 1);
}

// A rank ncclwatch leaves unaborted: it says `why` once, and the rank stays where it would be
// without ncclwatch (alive, inside the call whose return the probe would print as `returned`),
// with no use after free.
void expectNotAbortedUnderIt(const testsupport::JobSpec& spec, const std::string& why,
                             const std::string& returned) {
  CheckedJob job(spec);
  ASSERT_TRUE(job.waitForOutput(0, why, 30s)) << job.output(0);
  std::this_thread::sleep_for(300ms);
  const std::string output = job.output(0);
  EXPECT_TRUE(job.alive(0)) << output;
  EXPECT_EQ(output.find("use after free"), std::string::npos) << output;
  EXPECT_EQ(output.find(returned), std::string::npos) << output;
  job.signalAll(SIGKILL);
}

// A rank blocked in its own ncclCommDestroy behind the hung call is not aborted by ncclwatch:
// NCCL would free the communicator twice, once in each.
TEST(Completion, ARankDestroyingItsCommunicatorIsNotAbortedUnderIt) {
  std::string logs = testsupport::freshDirectory("abort-in-destroy");
  expectNotAbortedUnderIt(abortedOnHang(logs, {"3", "destroy"}),
                          "not aborted by ncclwatch: the application is already aborting or "
                          "destroying it",
                          "destroy: ");
}

// A rank inside a split of the hung communicator (one that waits for a rank that never comes)
// is not aborted by ncclwatch: NCCL would free the parent under the split, which reads it (the
// sim's split crashed on it).
TEST(Completion, ARankSplittingItsCommunicatorIsNotAbortedUnderIt) {
  std::string logs = testsupport::freshDirectory("abort-in-split");
  testsupport::JobSpec spec = abortedOnHang(logs, {"3", "split"});
  for (auto& [name, value] : spec.env) {
    if (name == "NCCLSIM_FAULT") value = "stall:rank=0,seq=4;stall:rank=0,seq=5";  // the split too
  }
  expectNotAbortedUnderIt(spec,
                          "not aborted by ncclwatch: this process is inside a split or shrink of "
                          "it",
                          "split: ");
}

// `ncclwatch run --abort` on a program that handles the abort and then exits 0 (the aborted
// collective returned without its result): `run` still fails, and says why in one line.
TEST(Completion, RunAbortFailsAJobThatExitsZeroAfterItsCommunicatorWasAborted) {
  if (!std::string(NCCLWATCH_SANITIZER_RUNTIME).empty()) {
    GTEST_SKIP() << "`run` preloads the library ahead of the sanitizer's runtime";
  }
  std::string logs = testsupport::freshDirectory("run-abort-exit");
  testsupport::Output out =
      testsupport::command("LD_LIBRARY_PATH=" + testsupport::simLibDir() +
                           " NCCLSIM_FAULT=stall:rank=0,seq=4 timeout 60 " + NCCLWATCH_BINARY +
                           " run --abort --quiet-ms 500 --preload " + kPreload + " --dir " + logs +
                           " -- " + NCCLWATCH_ABORT_PROBE + " 3");
  EXPECT_EQ(out.status, 1) << out.text;
  EXPECT_NE(out.text.find("STUCK"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("destroy: no error"), std::string::npos) << out.text;  // it exited 0
  EXPECT_NE(
      out.text.find(
          "the job exited 0, but after a verdict --abort asked its ranks to abort 1 communicator"),
      std::string::npos)
      << out.text;
  EXPECT_EQ(out.text.find("use after free"), std::string::npos) << out.text;
}

// A call captured into a CUDA graph gets no events and is marked captured; the watchdog's
// polling during a global-mode capture on the application's thread leaves the capture valid.
TEST(Completion, CapturedCallIsMarkedAndPollingKeepsTheCaptureValid) {
  std::string logs = testsupport::freshDirectory("capture");
  testsupport::JobSpec spec = preloaded(NCCLWATCH_CAPTURE_PROBE, 1, logs);
  spec.env.push_back({"NCCLWATCH_POLL_MS", "20"});
  CheckedJob job(spec);
  ASSERT_TRUE(job.waitExit(30s));
  ASSERT_EQ(job.exitStatus(0), 0) << job.output(0);
  EXPECT_NE(job.output(0).find("capture ok"), std::string::npos) << job.output(0);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 1u);
  const CallRecord* pending = findRecord(files[0], OpKind::kAllReduce, 1);
  const CallRecord* captured = findRecord(files[0], OpKind::kAllReduce, 2);
  ASSERT_NE(pending, nullptr);
  ASSERT_NE(captured, nullptr);
  EXPECT_EQ(pending->state, RecordState::kCompleted);
  EXPECT_EQ(pending->flags & ncclwatch::trace::kRecordCaptured, 0);
  EXPECT_NE(captured->flags & ncclwatch::trace::kRecordCaptured, 0);
  EXPECT_EQ(captured->state, RecordState::kIssued);
}

// NCCLWATCH_EVENTS=0 with the profiler-plugin role off too: calls are recorded without
// completion tracking and say so.
TEST(Completion, EventsOffRecordsCallsAsUntracked) {
  std::string logs = testsupport::freshDirectory("noevents");
  testsupport::JobSpec spec = preloaded(
      std::string(NCCLWATCH_BUILD_DIR) + "/examples/allreduce_loop", 2, logs, {"--iters", "5"});
  spec.env.push_back({"NCCLWATCH_EVENTS", "0"});
  spec.env.push_back({"NCCLWATCH_PLUGIN", "off"});
  CheckedJob job(spec);
  ASSERT_TRUE(job.waitExit(30s));
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 2u);
  for (const TraceFile& file : files) {
    int allReduces = 0;
    for (const CallRecord& record : file.records) {
      if (record.op != OpKind::kAllReduce) continue;
      ++allReduces;
      EXPECT_NE(record.flags & ncclwatch::trace::kRecordNoEvents, 0);
      EXPECT_EQ(record.state, RecordState::kIssued);
    }
    EXPECT_EQ(allReduces, 5);
  }
}

// NCCLWATCH_EVENTS=0 with the plugin role on (the default): no CUDA events, yet every call is
// tracked to completion by NCCL's KernelCh events, and its record says so.
TEST(Completion, EventsOffThePluginStillTracksCompletion) {
  std::string logs = testsupport::freshDirectory("noevents-plugin");
  testsupport::JobSpec spec = preloaded(
      std::string(NCCLWATCH_BUILD_DIR) + "/examples/allreduce_loop", 2, logs, {"--iters", "5"});
  spec.env.push_back({"NCCLWATCH_EVENTS", "0"});
  CheckedJob job(spec);
  ASSERT_TRUE(job.waitExit(30s));
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 2u);
  for (const TraceFile& file : files) {
    EXPECT_EQ(file.header.recordingSources,
              ncclwatch::trace::kSourceInterposer | ncclwatch::trace::kSourcePlugin);
    int allReduces = 0;
    for (const CallRecord& record : file.records) {
      if (record.op != OpKind::kAllReduce) continue;
      ++allReduces;
      EXPECT_EQ(record.flags & ncclwatch::trace::kRecordNoEvents, 0);
      EXPECT_NE(record.flags & ncclwatch::trace::kRecordKernelTracked, 0);
      EXPECT_EQ(record.flags & ncclwatch::trace::kRecordFromPlugin, 0);  // the wrapper's record
      EXPECT_EQ(record.state, RecordState::kCompleted);
    }
    EXPECT_EQ(allReduces, 5);
  }
}

// Back-to-back calls on two ranks that drift apart: the rank ahead has thousands of operations
// in flight, more than the plugin's call slots find free near their cursor (one real stream
// holds about a thousand launches, several streams or a deeper queue more: here the sim's bound
// is lifted). Each call
// keeps exactly one record, its wrapper's, and its own sequence number. When the plugin found
// no API event to join, it made a second record of the call (no reduction op) that took the
// next sequence number: a healthy job's collector said MISMATCH every few thousand calls.
TEST(Recording, BackToBackCallsKeepOneRecordEachWhateverIsInFlight) {
  // Fewer under a sanitizer (TSan: 37 s for 30,000), still thousands ahead of the other rank.
  const int kIters = std::string(NCCLWATCH_SANITIZER_RUNTIME).empty() ? 30000 : 12000;
  std::string logs = testsupport::freshDirectory("back-to-back");
  testsupport::JobSpec spec =
      preloaded(std::string(NCCLWATCH_BUILD_DIR) + "/examples/allreduce_loop", 2, logs,
                {"--iters", std::to_string(kIters)});
  spec.env.push_back({"NCCLWATCH_TRACE", "full"});  // every record, not the ring's last
  spec.env.push_back({"CUDASIM_PENDING_LAUNCHES", "0"});
  // A ring that holds the whole run: a sanitizer build's 1024 records lap under back-to-back
  // calls before the watchdog persists them (losses a full trace counts, not this test's case).
  spec.env.push_back({"NCCLWATCH_RING_RECORDS", std::to_string(2 * kIters)});
  CheckedJob job(spec);
  ASSERT_TRUE(job.waitExit(120s));
  for (int rank = 0; rank < 2; ++rank) ASSERT_EQ(job.exitStatus(rank), 0) << job.output(rank);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 2u);
  for (const TraceFile& file : files) {
    SCOPED_TRACE("rank " + std::to_string(file.header.rank));
    EXPECT_EQ(file.header.recordingSources,
              ncclwatch::trace::kSourceInterposer | ncclwatch::trace::kSourcePlugin);
    int allReduces = 0, fromPlugin = 0, unknownRedop = 0, seqGaps = 0;
    uint64_t lastSeq = 0;
    for (const CallRecord& record : file.records) {
      if (record.op != OpKind::kAllReduce) continue;
      ++allReduces;
      if (record.flags & ncclwatch::trace::kRecordFromPlugin) ++fromPlugin;
      if (record.redop == ncclwatch::trace::kRedopUnknown) ++unknownRedop;
      if (record.seq != lastSeq + 1) ++seqGaps;
      lastSeq = record.seq;
    }
    EXPECT_EQ(allReduces, kIters);
    EXPECT_EQ(fromPlugin, 0);
    EXPECT_EQ(unknownRedop, 0);
    EXPECT_EQ(seqGaps, 0);
    EXPECT_EQ(lastSeq, static_cast<uint64_t>(kIters));
  }
}

// The watchdog thread polls every interval for the job's whole life, and must not allocate as
// it does: a process that forks while another thread holds its allocator's lock leaves the
// child a lock no thread releases, unless the allocator takes its locks around fork() (glibc's
// does; GCC 12's ASan runtime and some preloaded allocators do not: the fork probe's child hung
// so under ASan). alloc_probe counts the allocations on the thread named "ncclwatch" over 1.2 s
// of steady calls at a 20 ms poll (about 60 polls): it took one or more a poll (its progress
// and, with a collector, the communicator table copied each time, a frame buffer per wait
// notes). A buffer that grows to a new high still allocates, once: on a loaded machine, with a
// collector that reads late, up to a few times in the window (3 seen), far from one a poll.
TEST(Recording, WatchdogDoesNotAllocateWhilePolling) {
  if (!std::string(NCCLWATCH_SANITIZER_RUNTIME).empty()) {
    GTEST_SKIP() << "the probe defines malloc, which a sanitizer's runtime intercepts";
  }
  for (bool withCollector : {false, true}) {
    SCOPED_TRACE(withCollector ? "with rank 0's sidecar collector" : "without a collector");
    std::string logs = testsupport::freshDirectory(withCollector ? "alloc-collector" : "alloc");
    testsupport::JobSpec spec = preloaded(NCCLWATCH_ALLOC_PROBE, 1, logs);
    spec.env.push_back({"NCCLWATCH_POLL_MS", "20"});
    if (withCollector) {
      int port = testsupport::freeLoopbackPort();
      ASSERT_GT(port, 17);
      spec.env.push_back({"MASTER_ADDR", "127.0.0.1"});
      spec.env.push_back({"MASTER_PORT", std::to_string(port - 17)});  // the collector: +17
    }
    CheckedJob job(spec);
    ASSERT_TRUE(job.waitExit(60s)) << job.output(0);
    const std::string output = job.output(0);
    ASSERT_EQ(job.exitStatus(0), 0) << output;
    std::smatch counted;
    ASSERT_TRUE(
        std::regex_search(output, counted, std::regex(R"(watchdog allocations=(\d+) calls=(\d+))")))
        << output;
    EXPECT_GT(std::stol(counted[2]), 100) << output;
    EXPECT_LE(std::stol(counted[1]), 8) << output;
    if (withCollector) {
      EXPECT_NE(output.find("collector listening on port"), std::string::npos) << output;
    }
  }
}

// Plain real NCCL, no sim: init fails without a GPU driver; the error passes through unchanged
// and is recorded under the communicator it was meant to create.
TEST(RealNccl, InitErrorPassesThroughAndIsRecorded) {
  std::string logs = testsupport::freshDirectory("real");
  testsupport::JobSpec spec =
      preloaded(std::string(NCCLWATCH_BUILD_DIR) + "/examples/nccl_probe", 1, logs);
  spec.useSim = false;
  spec.env.push_back({"LD_LIBRARY_PATH", NCCLWATCH_REAL_CUDA_LIB_DIR});
  testsupport::Job job(spec);
  ASSERT_TRUE(job.waitExit(60s));
  EXPECT_NE(job.output(0).find("ncclCommInitRank: 1 (unhandled cuda error"), std::string::npos)
      << job.output(0);
  std::vector<TraceFile> files = testsupport::readTraceFiles(logs);
  ASSERT_EQ(files.size(), 1u);
  ASSERT_EQ(files[0].records.size(), 1u);
  EXPECT_EQ(files[0].records[0].op, OpKind::kInit);
  EXPECT_EQ(files[0].records[0].result, 1);
  EXPECT_EQ(files[0].records[0].state, ncclwatch::trace::RecordState::kFailed);
  EXPECT_NE(files[0].records[0].commHash, 0u);
  EXPECT_EQ(files[0].header.ncclVersion, 22809);
}

}  // namespace
