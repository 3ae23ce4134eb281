// NVTX ranges as a profiler sees them: allreduce_loop runs on the sim under libncclwatch.so
// with a real NVTX injection tool attached (tests/interpose/nvtx_capture_tool.cc, loaded by NVTX
// itself from NVTX_INJECTION64_PATH), and what the tool captured is checked against the trace
// files: one range per recorded call, in the domain "ncclwatch", naming the call's op, the
// communicator's commHash, its seq and its size in bytes.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <tuple>

#include "job.h"
#include "trace/ring_reader.h"
#include "traces.h"

namespace {

using namespace std::chrono_literals;
using ncclwatch::trace::CallRecord;
using ncclwatch::trace::OpKind;
using ncclwatch::trace::TraceFile;

constexpr int kRanks = 2;
constexpr int kIterations = 25;
constexpr uint64_t kCount = 4096;

// One line of the capture file.
struct Event {
  bool push = false;
  std::string domain;
  uint32_t category = 0;
  std::string payload;
  std::string op;
  std::string comm;
  uint64_t seq = 0;
  bool hasBytes = false;
  uint64_t bytes = 0;
  std::string line;
};

struct LoopRun {
  std::vector<TraceFile> files;             // by rank
  std::map<int, std::vector<Event>> byPid;  // capture events, in order, per process
  std::vector<std::string> problems;        // capture lines that did not parse
  std::map<int, int> inits;                 // tool initialisations per process
};

std::string hex16(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, value);
  return text;
}

// In a sanitizer build libncclwatch.so is instrumented: the sanitizer's runtime must come first
// in the initial library list, so it is preloaded ahead of it.
std::string preloadList() {
  const std::string runtime = NCCLWATCH_SANITIZER_RUNTIME;
  return runtime.empty() ? std::string(NCCLWATCH_PRELOAD) : runtime + ":" + NCCLWATCH_PRELOAD;
}

void parseCapture(const std::string& path, LoopRun& run) {
  static const std::regex push(R"(^(\d+) push (\S+) category=(\d+) payload=(\S+) (.*)$)");
  static const std::regex message(R"(^([A-Za-z]+) comm=([0-9a-f]{16}) seq=(\d+)( bytes=(\d+))?$)");
  static const std::regex pop(R"(^(\d+) pop (\S+)$)");
  static const std::regex other(R"(^(\d+) (init|domain .*)$)");
  std::ifstream in(path);
  std::smatch match;
  for (std::string line; std::getline(in, line);) {
    Event event;
    event.line = line;
    int pid = 0;
    if (std::regex_match(line, match, push)) {
      pid = std::stoi(match[1]);
      event.push = true;
      event.domain = match[2];
      event.category = static_cast<uint32_t>(std::stoul(match[3]));
      event.payload = match[4];
      std::string text = match[5];
      if (event.domain == "ncclwatch") {
        std::smatch parts;
        if (!std::regex_match(text, parts, message)) {
          run.problems.push_back(line);
          continue;
        }
        event.op = parts[1];
        event.comm = parts[2];
        event.seq = std::stoull(parts[3]);
        event.hasBytes = parts[4].matched;
        if (event.hasBytes) event.bytes = std::stoull(parts[5]);
      }
    } else if (std::regex_match(line, match, pop)) {
      pid = std::stoi(match[1]);
      event.domain = match[2];
    } else if (std::regex_match(line, match, other)) {
      if (match[2] == "init") ++run.inits[std::stoi(match[1])];
      continue;
    } else {
      run.problems.push_back(line);
      continue;
    }
    run.byPid[pid].push_back(event);
  }
}

// allreduce_loop on kRanks ranks of the sim, preloaded, with `env` added.
LoopRun runLoop(const std::string& name, std::vector<std::pair<std::string, std::string>> env) {
  std::string directory = testsupport::freshDirectory("nvtx-" + name, true);
  std::string logs = directory + "/logs";
  std::string capture = directory + "/capture.txt";
  testsupport::JobSpec spec;
  spec.program = testsupport::buildDir() + "/examples/allreduce_loop";
  spec.args = {"--iters", std::to_string(kIterations), "--count", std::to_string(kCount)};
  spec.ranks = kRanks;
  spec.env = {
      {"LD_PRELOAD", preloadList()}, {"NCCLWATCH_DIR", logs}, {"NVTX_CAPTURE_FILE", capture}};
  if (!std::string(NCCLWATCH_SANITIZER_RUNTIME).empty()) {
    // An instrumented reader takes seconds over the default 4 MiB ring; a run makes ~30 calls.
    spec.env.push_back({"NCCLWATCH_RING_RECORDS", "1024"});
  }
  for (auto& entry : env) spec.env.push_back(std::move(entry));
  LoopRun run;
  testsupport::Job job(spec);
  EXPECT_TRUE(job.waitExit(60s));
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(job.exitStatus(rank), 0) << job.output(rank);
    // A sanitizer build: no race, memory error or undefined behaviour reported by any rank.
    for (const char* marker : {"Sanitizer", "runtime error:"}) {
      EXPECT_EQ(job.output(rank).find(marker), std::string::npos) << job.output(rank);
    }
  }
  EXPECT_NE(job.output(0).find("iterations on 2 ranks ok"), std::string::npos) << job.output(0);
  if (std::filesystem::exists(logs)) run.files = testsupport::readTraceFiles(logs);
  parseCapture(capture, run);
  return run;
}

// A record as the run made it, without what differs between runs (hashes, times, pointers).
using Shape = std::tuple<OpKind, uint64_t, uint64_t, int, int, int>;
std::vector<Shape> shapeOf(const TraceFile& file) {
  std::vector<Shape> shape;
  for (const CallRecord& record : file.records) {
    shape.emplace_back(record.op, record.seq, record.count, record.dtype, record.redop,
                       record.result);
  }
  return shape;
}

void expectAllRecorded(const LoopRun& run) {
  ASSERT_EQ(run.files.size(), static_cast<size_t>(kRanks));
  for (const TraceFile& file : run.files) {
    EXPECT_TRUE(file.problems.empty());
    EXPECT_EQ(file.header.cleanShutdown, 1u);
    int allReduces = 0;
    for (const CallRecord& record : file.records) allReduces += record.op == OpKind::kAllReduce;
    EXPECT_EQ(allReduces, kIterations);
  }
}

class Nvtx : public testing::Test {
 protected:
  // The job inherits the test's environment: only what a case sets may reach it.
  void SetUp() override {
    unsetenv("NVTX_INJECTION64_PATH");
    unsetenv("NVTX_INJECTION32_PATH");
    unsetenv("NCCLWATCH_NVTX");
    unsetenv("NCCLWATCH_ENABLE");
  }
};

TEST_F(Nvtx, OneRangePerRecordedCallInDomainNcclwatch) {
  LoopRun run = runLoop("on", {{"NVTX_INJECTION64_PATH", NCCLWATCH_NVTX_TOOL}});
  expectAllRecorded(run);
  EXPECT_TRUE(run.problems.empty()) << run.problems.front();
  ASSERT_EQ(run.files.size(), static_cast<size_t>(kRanks));
  for (const TraceFile& file : run.files) {
    int pid = file.header.pid;
    SCOPED_TRACE("rank " + std::to_string(file.header.rank) + " pid " + std::to_string(pid));
    EXPECT_EQ(run.inits.count(pid) ? run.inits.at(pid) : 0, 1) << "the tool was not attached";
    ASSERT_TRUE(run.byPid.count(pid));
    const std::vector<Event>& events = run.byPid.at(pid);

    // Balanced: every pop closes a push of the same domain, and nothing stays open.
    std::vector<std::string> open;
    int pushes = 0;
    for (const Event& event : events) {
      if (event.push) {
        open.push_back(event.domain);
        pushes += event.domain == "ncclwatch";
      } else {
        ASSERT_FALSE(open.empty()) << "pop without push: " << event.line;
        EXPECT_EQ(open.back(), event.domain);
        open.pop_back();
      }
    }
    EXPECT_TRUE(open.empty()) << open.size() << " ranges left open";

    // Every ncclwatch range names a call of this process's trace: op, comm and seq.
    std::vector<const CallRecord*> allReduces;
    for (const CallRecord& record : file.records) {
      if (record.op == OpKind::kAllReduce) allReduces.push_back(&record);
    }
    ASSERT_EQ(allReduces.size(), static_cast<size_t>(kIterations));
    std::vector<const Event*> allReducePushes;
    for (const Event& event : events) {
      if (!event.push || event.domain != "ncclwatch") continue;
      bool known = false;
      for (const CallRecord& record : file.records) {
        known = known || (ncclwatch::trace::opName(record.op) == event.op &&
                          hex16(record.commHash) == event.comm && record.seq == event.seq);
      }
      EXPECT_TRUE(known) << "no recorded call for: " << event.line;
      if (event.op == "AllReduce") allReducePushes.push_back(&event);
    }
    EXPECT_GE(pushes, kIterations);

    // Exactly one range per recorded allreduce, in order, with what the record says.
    ASSERT_EQ(allReducePushes.size(), allReduces.size());
    for (size_t i = 0; i < allReduces.size(); ++i) {
      const CallRecord& record = *allReduces[i];
      const Event& event = *allReducePushes[i];
      SCOPED_TRACE(event.line);
      EXPECT_EQ(event.comm, hex16(record.commHash));
      EXPECT_EQ(event.comm, hex16(file.comms.at(0).commHash));
      EXPECT_EQ(event.seq, record.seq);
      if (i > 0) {
        EXPECT_EQ(event.seq, allReducePushes[i - 1]->seq + 1);
      }
      EXPECT_EQ(event.payload, std::to_string(record.seq));
      EXPECT_EQ(event.category, 1u);  // collective
      ASSERT_TRUE(event.hasBytes);
      EXPECT_EQ(record.count, kCount);
      EXPECT_EQ(event.bytes, record.count * sizeof(float));
    }
  }
  // Both ranks' tools saw the same communicator.
  EXPECT_EQ(run.files[0].comms.at(0).commHash, run.files[1].comms.at(0).commHash);
}

TEST_F(Nvtx, OffMeansNoRangesEvenWithAToolAttached) {
  for (const char* value : {"0", "off"}) {
    SCOPED_TRACE(std::string("NCCLWATCH_NVTX=") + value);
    LoopRun run =
        runLoop(std::string("off") + value,
                {{"NVTX_INJECTION64_PATH", NCCLWATCH_NVTX_TOOL}, {"NCCLWATCH_NVTX", value}});
    expectAllRecorded(run);
    for (const auto& [pid, events] : run.byPid) {
      for (const Event& event : events) {
        EXPECT_NE(event.domain, "ncclwatch") << event.line;
      }
    }
  }
}

TEST_F(Nvtx, WithoutAToolTheRunIsUnchanged) {
  LoopRun without = runLoop("notool", {});
  expectAllRecorded(without);
  EXPECT_TRUE(without.byPid.empty());
  EXPECT_TRUE(without.inits.empty());
  LoopRun with = runLoop("tool", {{"NVTX_INJECTION64_PATH", NCCLWATCH_NVTX_TOOL}});
  expectAllRecorded(with);
  ASSERT_EQ(without.files.size(), with.files.size());
  for (size_t rank = 0; rank < without.files.size(); ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(shapeOf(without.files[rank]), shapeOf(with.files[rank]));
  }
}

}  // namespace
