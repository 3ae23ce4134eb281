// Clock alignment across hosts, straggler statistics (golden text) and the timeline's
// trace-event JSON, on synthetic traces built in memory.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "analysis/analyze.h"
#include "analysis/timing.h"
#include "stragglers.h"
#include "synthetic.h"
#include "timeline.h"
#include "trace_event_check.h"

namespace {

using namespace ncclwatch;
using synthetic::OpKind;
using synthetic::RecordState;

constexpr uint64_t kWorld = 0x9f3a000000000001;
constexpr uint64_t kPair = 0x7b21000000000002;  // ranks 2 and 3
constexpr int64_t kSkew = 3'500'000;            // host b's monotonic clock runs 3.5 ms ahead

// Deterministic jitter in [-range, range].
int64_t jitter(int a, int b, int64_t range) {
  uint64_t x = static_cast<uint64_t>(a) * 0x9e3779b97f4a7c15ULL ^ static_cast<uint64_t>(b) * 31;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 32;
  return static_cast<int64_t>(x % static_cast<uint64_t>(2 * range + 1)) - range;
}

// Four ranks: 0 and 1 on host "a", 2 and 3 on host "b" when `twoHosts`. Host b's monotonic clock
// reads kSkew more than host a's at the same instant, and its wall clock hides it (both hosts'
// anchors claim monotonic + the same constant). Collective k happens at 1 s + k * 10 ms (true
// time); a rank issues it a little before (rank 3 `lateNs` later, except every tenth), all
// complete 1 ms after the last arrival, each seen with some polling noise.
std::vector<trace::TraceFile> fourRanks(bool twoHosts, int64_t lateNs, int calls = 40) {
  std::vector<trace::TraceFile> files;
  for (int rank = 0; rank < 4; ++rank) {
    synthetic::Rank r(rank, 4);
    bool hostB = twoHosts && rank >= 2;
    std::strncpy(r.file().header.host, hostB ? "b" : "a", sizeof r.file().header.host);
    int64_t clock = hostB ? kSkew : 0;  // this host's monotonic minus true time
    r.comm(kWorld, 4, rank);
    if (rank >= 2) r.comm(kPair, 2, rank - 2, kWorld, 1);
    for (int k = 0; k < calls; ++k) {
      int64_t at = 1'000'000'000 + int64_t{k} * 10'000'000;
      bool late = lateNs != 0 && k % 10 != 9;
      int64_t issue = at - 200'000 + jitter(rank, k, 100'000) + (rank == 3 && late ? lateNs : 0);
      int64_t done = at + (late ? lateNs : 0) + 1'000'000;
      auto& rec = r.call(kWorld, OpKind::kAllReduce, 1024, RecordState::kCompleted, issue + clock);
      rec.startNs = issue + clock + 1000;
      rec.completeNs = done + clock + jitter(rank + 7, k, 20'000);
      if (rank >= 2 && k % 4 == 0) {
        auto& b = r.call(kPair, OpKind::kBroadcast, 8, RecordState::kCompleted,
                         done + 100'000 + clock + jitter(rank, k + 100, 10'000), synthetic::kF32,
                         synthetic::kSum, 0);
        b.completeNs = done + 400'000 + clock;
      }
    }
    files.push_back(r.take());
  }
  return files;
}

TEST(ClockAlignment, FindsTheOffsetBetweenTwoHostsFromCollectiveCompletion) {
  std::vector<trace::TraceFile> files = fourRanks(true, 0);
  analysis::ClockAlignment clocks = analysis::alignClocks(files);
  ASSERT_EQ(clocks.hosts.size(), 2u);
  EXPECT_EQ(clocks.hostOfFile[0], clocks.hostOfFile[1]) << "same host, same clock";
  EXPECT_EQ(clocks.hostOfFile[2], clocks.hostOfFile[3]);
  const analysis::HostClock& a = clocks.hosts[static_cast<size_t>(clocks.hostOfFile[0])];
  const analysis::HostClock& b = clocks.hosts[static_cast<size_t>(clocks.hostOfFile[2])];
  EXPECT_TRUE(a.reference);
  EXPECT_FALSE(b.reference);
  EXPECT_EQ(a.offsetNs, a.wallOffsetNs) << "the reference host keeps its wall clock";
  EXPECT_EQ(b.collectives, 40u);
  // b's clock reads 3.5 ms more: aligning it takes 3.5 ms off what its wall clock said.
  EXPECT_NEAR(static_cast<double>(b.offsetNs - a.offsetNs), -static_cast<double>(kSkew), 30'000);
  EXPECT_NEAR(static_cast<double>(clocks.correctionNs(static_cast<size_t>(clocks.hostOfFile[2]))),
              -static_cast<double>(kSkew), 30'000);
  // The same collective now completes within the noise on both hosts.
  auto completion = [&](size_t file, uint64_t seq) {
    for (const trace::CallRecord& r : files[file].records) {
      if (r.commHash == kWorld && r.seq == seq) return clocks.aligned(file, r.completeNs);
    }
    return int64_t{0};
  };
  int64_t onA = completion(0, 6), onB = completion(2, 6);
  EXPECT_LT(std::llabs(onA - onB), 60'000);
}

TEST(ClockAlignment, OneHostNeedsNoCorrectionAndALoneHostKeepsItsWallClock) {
  std::vector<trace::TraceFile> files = fourRanks(false, 0);
  analysis::ClockAlignment clocks = analysis::alignClocks(files);
  ASSERT_EQ(clocks.hosts.size(), 1u);
  EXPECT_EQ(clocks.correctionNs(0), 0);
  // Host b without a collective shared with a: nothing to align on.
  std::vector<trace::TraceFile> split = fourRanks(true, 0);
  for (int rank = 2; rank < 4; ++rank) {
    std::vector<trace::CallRecord> records = split[static_cast<size_t>(rank)].records.toVector();
    std::erase_if(records, [](const trace::CallRecord& r) { return r.commHash == kWorld; });
    split[static_cast<size_t>(rank)].records = std::move(records);
  }
  clocks = analysis::alignClocks(split);
  ASSERT_EQ(clocks.hosts.size(), 2u);
  EXPECT_EQ(clocks.hosts[1].collectives, 0u);
  EXPECT_EQ(clocks.correctionNs(1), 0);
}

std::string golden(const std::string& name, const std::string& got) {
  std::string path = std::string(NCCLWATCH_TOOLS_GOLDEN_DIR) + "/" + name;
  if (std::getenv("NCCLWATCH_UPDATE_GOLDEN") != nullptr) std::ofstream(path) << got;
  std::ifstream in(path);
  std::stringstream want;
  want << in.rdbuf();
  return want.str();
}

TEST(Stragglers, Rank3IsTheStragglerAndTheTextReadsAsGolden) {
  std::vector<trace::TraceFile> files = fourRanks(false, 20'000'000);
  analysis::StragglerReport report = analysis::computeStragglers(files);
  ASSERT_FALSE(report.stragglers.empty());
  EXPECT_EQ(report.stragglers[0].rank, 3);
  EXPECT_EQ(report.stragglers[0].commHash, kWorld);
  EXPECT_NEAR(report.stragglers[0].lastShare, 0.9, 1e-9);
  std::ostringstream out;
  stragglers::Options options;
  stragglers::printText(report, files, options, false, out);
  EXPECT_EQ(out.str(), golden("stragglers.txt", out.str()));
}

TEST(Stragglers, TwoHostsAreAlignedBeforeLatenessIsMeasured) {
  // Rank 3 is 5 ms late; host b's 3.5 ms clock skew must not add to it (nor make rank 2 late).
  std::vector<trace::TraceFile> files = fourRanks(true, 5'000'000);
  analysis::StragglerReport report = analysis::computeStragglers(files);
  ASSERT_EQ(report.stragglers.size(), 1u);
  EXPECT_EQ(report.stragglers[0].rank, 3);
  EXPECT_NEAR(static_cast<double>(report.stragglers[0].medianNs), 5.1e6, 0.3e6);
  std::ostringstream out;
  stragglers::Options options;
  stragglers::printText(report, files, options, false, out);
  EXPECT_EQ(out.str(), golden("stragglers_two_hosts.txt", out.str()));
}

TEST(Stragglers, NoStragglerInABalancedJob) {
  std::vector<trace::TraceFile> files = fourRanks(false, 0);
  EXPECT_TRUE(analysis::computeStragglers(files).stragglers.empty());
}

TEST(Timeline, IsValidTraceEventJsonWithRanksTracksDumpsAndVerdicts) {
  std::vector<trace::TraceFile> files = fourRanks(true, 0, 12);
  // Rank 1 skips the last allreduce's partner: ranks 0, 2, 3 wait in one more, rank 1 dumps.
  for (int rank = 0; rank < 4; ++rank) {
    if (rank == 1) continue;
    auto& file = files[static_cast<size_t>(rank)];
    trace::CallRecord extra = file.records.back();
    extra.seq += 1;
    extra.issueNs += 10'000'000;
    extra.startNs = extra.issueNs + 5000;
    extra.completeNs = 0;
    extra.state = RecordState::kStarted;
    extra.ringIndex += 1;
    file.records.push_back(extra);
  }
  trace::Dump dump;
  dump.trigger = "hang";
  dump.reason = "calls pending past the hang threshold";
  dump.timeNs = files[0].records.back().issueNs + 1'000'000'000;
  files[0].dumps.push_back(dump);
  analysis::Options options;
  options.probeProcesses = false;
  options.aliveRanks = {0, 1, 2, 3};
  options.quietNs = 1;
  options.nowNs = synthetic::kAnchorWall + 100'000'000'000;
  analysis::Report report = analysis::analyze(files, options);
  std::ostringstream out;
  timeline::Stats stats = timeline::write(files, &report, out);
  tracecheck::Summary summary = tracecheck::check(out.str());
  ASSERT_EQ(summary.error, "") << out.str().substr(0, 2000);
  EXPECT_EQ(stats.processes, 4u);
  ASSERT_EQ(summary.processNames.size(), 4u);
  EXPECT_EQ(summary.processNames[0], "rank 0 (a:1000)");
  EXPECT_EQ(summary.processNames[3], "rank 3 (b:1003)");
  EXPECT_EQ(summary.slices, stats.slices);
  EXPECT_EQ(summary.byCategory["dump"], 1u);
  EXPECT_GE(summary.byCategory["running"], 4u * 12u);
  EXPECT_GE(summary.byCategory["queued"], 4u * 12u);
  EXPECT_GT(summary.byCategory["verdict"], 0u) << out.str().substr(0, 3000);
  EXPECT_NE(out.str().find("\"state\":\"started\""), std::string::npos);
  // Host b's slices are shifted onto host a's clock: the first allreduce completes together.
  EXPECT_NE(out.str().find("\"comm\":\"9f3a000000000001\""), std::string::npos);
}

}  // namespace
