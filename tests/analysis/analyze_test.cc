// The analysis on synthetic traces built in memory: one test per verdict kind, both
// identical-calls traps, an ordering deadlock that must not read as stuck, and asynchronous
// ranks that must produce no verdict.
#include "analysis/analyze.h"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <sstream>

#include "analysis/describe.h"
#include "synthetic.h"

namespace {

using namespace ncclwatch::analysis;
using synthetic::kF16;
using synthetic::kF32;
using synthetic::kSum;
using synthetic::OpKind;
using synthetic::Rank;
using synthetic::RecordState;
using synthetic::TraceFile;

constexpr uint64_t kWorld = 0x1111, kA = 0x2222, kB = 0x3333;
constexpr int64_t kMs = 1'000'000;

Options ended() {
  Options options;
  options.probeProcesses = false;
  options.nowNs = synthetic::kAnchorWall + 3600'000 * kMs;
  return options;
}

std::vector<Rank> world(int n, uint64_t hash = kWorld) {
  std::vector<Rank> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back(r, n);
    ranks.back().comm(hash, n, r);
  }
  return ranks;
}

std::vector<TraceFile> files(std::vector<Rank>& ranks) {
  std::vector<TraceFile> out;
  for (Rank& r : ranks) out.push_back(r.take());
  return out;
}

// `steps` completed AllReduces on `hash` for every rank.
void history(std::vector<Rank>& ranks, int steps, uint64_t hash = kWorld) {
  for (int s = 0; s < steps; ++s) {
    for (Rank& r : ranks)
      r.call(hash, OpKind::kAllReduce, 1024, RecordState::kCompleted, (s + 1) * kMs);
  }
}

const JobReport& onlyJob(const Report& report) {
  EXPECT_EQ(report.jobs.size(), 1u);
  return report.jobs.at(0);
}

const Verdict* find(const JobReport& job, VerdictKind kind) {
  for (const Verdict& v : job.verdicts) {
    if (v.kind == kind) return &v;
  }
  return nullptr;
}

std::string text(const Report& report) {
  std::ostringstream out;
  printText(report, out);
  return out.str();
}

// The only job's first verdict when it is of `kind` and blames `culprits`; null (with the
// failures said) otherwise.
const Verdict* firstIs(const Report& report, VerdictKind kind, const std::vector<int>& culprits) {
  const JobReport& job = onlyJob(report);
  if (job.verdicts.empty()) {
    ADD_FAILURE() << "no verdict\n" << text(report);
    return nullptr;
  }
  const Verdict& v = job.verdicts[0];
  EXPECT_EQ(v.kind, kind) << text(report);
  EXPECT_EQ(v.culprits, culprits) << text(report);
  return v.kind == kind && v.culprits == culprits ? &v : nullptr;
}

TEST(FormatRanks, Ranges) {
  EXPECT_EQ(formatRanks({7, 0, 1, 2, 3, 4, 6}), "0-4,6-7");
  EXPECT_EQ(formatRanks({5}), "5");
  EXPECT_EQ(formatRanks({3, 1, 3}), "1,3");
  EXPECT_EQ(formatRanks({}), "");
}

struct MismatchCase {
  const char* field;
  OpKind op;
  uint64_t count;
  int dtype;
  int redop;
  int root;
};

class Mismatch : public ::testing::TestWithParam<MismatchCase> {};

TEST_P(Mismatch, NamesTheFieldAndTheOddRank) {
  const MismatchCase& c = GetParam();
  auto ranks = world(8);
  history(ranks, 3);
  for (int r = 0; r < 8; ++r) {
    bool odd = r == 5;
    bool rooted = std::string(c.field) == "root";
    OpKind baseOp = rooted ? OpKind::kBroadcast : OpKind::kAllReduce;
    int baseRoot = rooted ? 0 : -1;
    ranks[r].call(kWorld, odd ? c.op : baseOp, odd ? c.count : 4194304, RecordState::kStarted,
                  10 * kMs + r, odd ? c.dtype : kF32, odd ? c.redop : kSum,
                  odd ? c.root : baseRoot);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kMismatch);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->fields, std::vector<std::string>{c.field});
  EXPECT_EQ(v->culprits, std::vector<int>{5});
  EXPECT_EQ(v->seq, 4u);
  EXPECT_EQ(v->comm.hash, kWorld);
  EXPECT_EQ(v->comm.name, "world");
  ASSERT_EQ(v->classes.size(), 2u);
  EXPECT_EQ(formatRanks(v->classes[0].ranks), "0-4,6-7");
  EXPECT_EQ(formatRanks(v->classes[1].ranks), "5");
  EXPECT_TRUE(v->primary);
  EXPECT_TRUE(report.hasFindings());
}

INSTANTIATE_TEST_SUITE_P(
    Fields, Mismatch,
    ::testing::Values(MismatchCase{"op", OpKind::kBroadcast, 4194304, kF32, kSum, 0},
                      MismatchCase{"count", OpKind::kAllReduce, 4194303, kF32, kSum, -1},
                      MismatchCase{"dtype", OpKind::kAllReduce, 4194304, kF16, kSum, -1},
                      MismatchCase{"redop", OpKind::kAllReduce, 4194304, kF32, 2, -1},
                      MismatchCase{"root", OpKind::kBroadcast, 4194304, kF32, kSum, 1}),
    [](const auto& info) { return std::string(info.param.field); });

TEST(Mismatch, TextShowsTheClasses) {
  auto ranks = world(8);
  for (int r = 0; r < 8; ++r) {
    if (r == 5) {
      ranks[r].call(kWorld, OpKind::kBroadcast, 4194304, RecordState::kStarted, kMs, kF32, kSum, 0);
    } else {
      ranks[r].call(kWorld, OpKind::kAllReduce, 4194304, RecordState::kStarted, kMs);
    }
  }
  auto traces = files(ranks);
  std::string out = text(analyze(traces, ended()));
  EXPECT_NE(
      out.find("[ncclwatch] MISMATCH on comm 0000\u2026(world, 8 ranks) at call #1 (op differ)"),
      std::string::npos)
      << out;
  EXPECT_NE(out.find("  ranks 0-4,6-7  AllReduce 4194304 x f32 sum"), std::string::npos) << out;
  EXPECT_NE(out.find("  rank 5         Broadcast 4194304 x f32 root=0"), std::string::npos) << out;
}

// A mismatch seen before every member issued the call: the absent members that are in the same
// place make one class (at thousands of ranks a class each made hundreds of identical lines).
TEST(Mismatch, AbsentRanksInTheSamePlaceAreOneClass) {
  auto ranks = world(8);
  history(ranks, 2);
  ranks[0].call(kWorld, OpKind::kAllReduce, 4194304, RecordState::kStarted, 10 * kMs);
  ranks[1].call(kWorld, OpKind::kAllReduce, 4194304, RecordState::kStarted, 10 * kMs);
  ranks[2].call(kWorld, OpKind::kAllReduce, 4194303, RecordState::kStarted, 10 * kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kMismatch);
  ASSERT_NE(v, nullptr) << text(report);
  ASSERT_EQ(v->classes.size(), 3u) << text(report);
  EXPECT_EQ(formatRanks(v->classes[2].ranks), "3-7") << text(report);
  EXPECT_NE(v->classes[2].call.note.find("never issued call #3"), std::string::npos)
      << v->classes[2].call.note;
  std::string out = text(report);
  EXPECT_NE(out.find("  ranks 3-7  never issued call #3"), std::string::npos) << out;
  // The explanation quotes the odd caller's call, not an absent class's.
  EXPECT_NE(v->explanation.find("rank 2 called AllReduce 4194303 x f32 sum where ranks 0-1"),
            std::string::npos)
      << v->explanation;
}

// After `steps` agreed calls, rank 1 records one call whose seq is damaged (2^50) and ranks 0
// and 2 disagree on their next call: the seq of the mismatch found, 0 if none.
uint64_t mismatchBesideADamagedSeq(int steps) {
  auto ranks = world(3);
  history(ranks, steps);
  ranks[1].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kCompleted, 5 * kMs).seq =
      uint64_t{1} << 50;
  ranks[0].call(kWorld, OpKind::kAllReduce, 4096, RecordState::kStarted, 10 * kMs);
  ranks[2].call(kWorld, OpKind::kAllReduce, 4095, RecordState::kStarted, 10 * kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kMismatch);
  EXPECT_NE(v, nullptr) << text(report);
  return v == nullptr ? 0 : v->seq;
}

// A damaged record (a seq far past any call the process made) must cost neither unbounded
// memory nor time: the alignment skips it, and the other ranks' mismatch is still found.
TEST(Damaged, ASeqFarAheadIsSkippedAndTheRealMismatchStillFound) {
  EXPECT_EQ(mismatchBesideADamagedSeq(2), 3u);
}

// A member whose only call is damaged far ahead of the others': the others' ordinals are read
// where they are, not walked one by one up to the damaged one.
TEST(Damaged, AMemberFarAheadIsNotWalkedTo) {
  EXPECT_EQ(mismatchBesideADamagedSeq(0), 1u);
}

// Trap 1: identical calls every step; rank 1 skipped one, so every call matched one later and
// the job hangs at teardown with no fingerprint difference.
TEST(IdenticalCalls, SkippedCallShowsAtTeardown) {
  auto ranks = world(4);
  for (int r = 0; r < 4; ++r) {
    int calls = r == 1 ? 9 : 10;
    for (int s = 0; s < calls; ++s) {
      bool last = s == calls - 1;
      ranks[r].call(kWorld, OpKind::kAllReduce, 1024,
                    last && r != 1 ? RecordState::kStarted : RecordState::kCompleted,
                    (s + 1) * kMs);
    }
  }
  ranks[1].call(kWorld, OpKind::kDestroy, 0, RecordState::kCompleted, 20 * kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const JobReport& job = onlyJob(report);
  ASSERT_FALSE(job.verdicts.empty()) << text(report);
  const Verdict& v = job.verdicts[0];
  EXPECT_EQ(v.kind, VerdictKind::kMissing) << text(report);
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_EQ(v.seq, 10u);
  EXPECT_NE(v.explanation.find("1 AllReduce 1024 x f32 sum fewer"), std::string::npos)
      << v.explanation;
}

// Trap 2: steps of two differently sized calls; rank 2 skips one, and the hang shows as a count
// mismatch one call later. The verdict still names rank 2 and the call it skipped.
TEST(IdenticalCalls, SkippedCallShowsAsALaterCountMismatch) {
  auto ranks = world(4);
  for (int r = 0; r < 4; ++r) {
    int64_t t = kMs;
    for (int step = 0; step < 5; ++step) {
      for (uint64_t count : {4096, 2048}) {
        if (r == 2 && step == 3 && count == 4096) continue;
        bool hung = step >= 3;
        ranks[r].call(kWorld, OpKind::kAllReduce, count,
                      hung ? (step == 3 && count == (r == 2 ? 2048u : 4096u) ? RecordState::kStarted
                                                                             : RecordState::kIssued)
                           : RecordState::kCompleted,
                      t += kMs);
      }
    }
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kMismatch);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->culprits, std::vector<int>{2});
  EXPECT_EQ(v->fields, std::vector<std::string>{"count"});
  EXPECT_EQ(v->seq, 7u);
  EXPECT_NE(v->explanation.find("skipped AllReduce 4096"), std::string::npos) << text(report);
}

// Ranks 0-2 wait in #5 on the world; rank 3 never issued it, and waits in comm A (shared with
// rank 2) instead.
std::vector<Rank> rank3HeldInA() {
  auto ranks = world(4);
  ranks[2].comm(kA, 2, 0, kWorld, 1);
  ranks[3].comm(kA, 2, 1, kWorld, 1);
  history(ranks, 4);
  for (int r = 0; r < 3; ++r)
    ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 10 * kMs);
  ranks[3].call(kA, OpKind::kAllReduce, 64, RecordState::kStarted, 10 * kMs);
  return ranks;
}

// Rank 2 never issued the call on A either (its host waits for the world's #5).
TEST(Missing, NamesTheRanksAndWhereTheyAre) {
  auto ranks = rank3HeldInA();
  ranks[3].call(kA, OpKind::kAllReduce, 64, RecordState::kIssued, 10 * kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kMissing);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->comm.hash, kWorld) << text(report);
  EXPECT_EQ(v->seq, 5u);
  EXPECT_EQ(v->culprits, std::vector<int>{3});
  ASSERT_EQ(v->classes.size(), 2u);
  EXPECT_EQ(formatRanks(v->classes[0].ranks), "0-2");
  EXPECT_EQ(v->classes[1].call.commHash, kA);
  EXPECT_EQ(find(onlyJob(report), VerdictKind::kDeadRank), nullptr) << text(report);
}

// Rank 2 did issue its call on A, queued on its stream behind the world's #5:
// a cycle through rank 3's blocked host. Rank 3, which left the order of calls it kept until
// then (world after world), is named.
TEST(Missing, AHeldRankWhosePeerQueuedTheCallIsADeadlock) {
  auto ranks = rank3HeldInA();
  ranks[2].call(kA, OpKind::kAllReduce, 64, RecordState::kIssued, 11 * kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = firstIs(report, VerdictKind::kDeadlock, {3});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->comm.hash, kA);
  EXPECT_EQ(find(onlyJob(report), VerdictKind::kMissing), nullptr) << text(report);
}

// exp26's sync_lock: rank 1's main thread holds a lock across the synchronize of the world's
// #3, and its other thread needs that lock to issue its call on A; ranks 0, 2 and 3 wait in A's
// call, so never issue the world's #3. Two missing verdicts, each blaming the other's waiters and
// sending the user to "the other verdicts": the cycle is said once, on rank 1.
TEST(Missing, TwoMissingCallsThatHoldEachOtherAreOneCycle) {
  std::vector<Rank> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back(r, 4);
    ranks.back().comm(kWorld, 4, r);
    ranks.back().comm(kA, 4, r);
  }
  // No order kept before to break: the first time either side goes on from A's first call.
  for (Rank& rank : ranks) {
    rank.call(kWorld, OpKind::kAllReduce, 64, RecordState::kCompleted, kMs);
    rank.call(kA, OpKind::kAllReduce, 4, RecordState::kCompleted, 2 * kMs);
  }
  ranks[1].call(kWorld, OpKind::kAllReduce, 64, RecordState::kStarted, 10 * kMs);
  for (int r : {0, 2, 3}) ranks[r].call(kA, OpKind::kAllReduce, 4, RecordState::kStarted, 10 * kMs);
  auto traces = files(ranks);
  Options options = ended();
  options.aliveRanks = {0, 1, 2, 3};
  options.quietNs = 3000 * kMs;
  options.nowNs = synthetic::kAnchorWall + 5000 * kMs;
  Report report = analyze(traces, options);
  std::vector<const Verdict*> primary;
  for (const Verdict& v : onlyJob(report).verdicts) {
    if (v.primary && v.kind != VerdictKind::kStraggler) primary.push_back(&v);
  }
  ASSERT_EQ(primary.size(), 1u) << text(report);
  const Verdict& v = *primary.front();
  EXPECT_EQ(v.kind, VerdictKind::kMissing) << text(report);
  EXPECT_EQ(v.comm.hash, kA) << text(report);
  EXPECT_EQ(v.culprits, std::vector<int>{1}) << text(report);
  EXPECT_NE(v.explanation.find("; and rank 1 waits in #2 on comm 0000000000001111 for ranks "
                               "0,2-3, which wait here: the two wait for each other"),
            std::string::npos)
      << v.explanation;
  EXPECT_EQ(v.explanation.find("see the other verdicts"), std::string::npos) << v.explanation;
}

// Asynchronous ranks: a running job with calls in flight and ranks a few calls apart is fine.
TEST(Asynchronous, RanksAFewCallsApartGiveNoVerdict) {
  auto ranks = world(4);
  history(ranks, 100);
  for (int r = 0; r < 4; ++r) {
    int ahead = r == 0 ? 5 : r == 1 ? 2 : 3;
    for (int k = 0; k < ahead; ++k) {
      ranks[r].call(kWorld, OpKind::kAllReduce, 1024,
                    k == 0 ? RecordState::kStarted : RecordState::kIssued, (101 + k) * kMs);
    }
  }
  auto traces = files(ranks);
  Options options = ended();
  options.aliveRanks = {0, 1, 2, 3};
  options.nowNs = synthetic::kAnchorWall + 2000 * kMs;  // ~2 s after the last activity
  Report report = analyze(traces, options);
  EXPECT_TRUE(onlyJob(report).verdicts.empty()) << text(report);
  EXPECT_FALSE(onlyJob(report).stalled);
  EXPECT_FALSE(report.hasFindings());
  // The same state, silent for a minute, is a hang: rank 1 is missing from #103.
  options.nowNs = synthetic::kAnchorWall + 60'000 * kMs;
  report = analyze(traces, options);
  EXPECT_TRUE(onlyJob(report).stalled);
}

TEST(UnmatchedP2p, CountDiffers) {
  auto ranks = world(2);
  history(ranks, 2);
  ranks[0].call(kWorld, OpKind::kSend, 512, RecordState::kStarted, 5 * kMs, kF32, 0, 1);
  ranks[1].call(kWorld, OpKind::kRecv, 256, RecordState::kStarted, 5 * kMs, kF32, 0, 0);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kUnmatchedP2p);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->fields, std::vector<std::string>{"count"});
}

// A tagged exchange (PyTorch's P2POp with tag=): rank 0 sends 512 then 64 floats to rank 1,
// which posts its receives in the other order. NCCL ignores the tags and pairs them in issue
// order, so each pair disagrees on its count; the verdict says it is an order, not a size.
TEST(UnmatchedP2p, TheSameSizesInAnotherOrderAreCalledAReordering) {
  auto ranks = world(2);
  history(ranks, 2);
  for (uint64_t count : {512, 64}) {
    ranks[0].call(kWorld, OpKind::kSend, count, RecordState::kStarted, 5 * kMs, kF32, 0, 1).flags |=
        ncclwatch::trace::kRecordInGroup;
  }
  for (uint64_t count : {64, 512}) {
    ranks[1].call(kWorld, OpKind::kRecv, count, RecordState::kStarted, 5 * kMs, kF32, 0, 0).flags |=
        ncclwatch::trace::kRecordInGroup;
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kUnmatchedP2p);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->fields, std::vector<std::string>{"count"});
  EXPECT_NE(v->explanation.find("the same sizes in another order (rank 0 sends rank 1 2048 then "
                                "256 bytes and rank 1 receives 256 then 2048 bytes)"),
            std::string::npos)
      << v->explanation;
  EXPECT_NE(v->explanation.find("ignores tags"), std::string::npos) << v->explanation;
}

// A plain wrong size is not called a reordering.
TEST(UnmatchedP2p, ADifferentSizeIsNotAReordering) {
  auto ranks = world(2);
  history(ranks, 2);
  for (uint64_t count : {512, 64}) {
    ranks[0].call(kWorld, OpKind::kSend, count, RecordState::kStarted, 5 * kMs, kF32, 0, 1);
  }
  for (uint64_t count : {256, 32}) {
    ranks[1].call(kWorld, OpKind::kRecv, count, RecordState::kStarted, 5 * kMs, kF32, 0, 0);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kUnmatchedP2p);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->explanation.find("another order"), std::string::npos) << v->explanation;
  EXPECT_NE(v->explanation.find("disagree on count"), std::string::npos) << v->explanation;
}

// Ring of sends; rank 2 sends to a peer it never used and who never receives from it.
TEST(UnmatchedP2p, WrongPeerIsTheCulprit) {
  auto ranks = world(4);
  for (int step = 0; step < 3; ++step) {
    for (int r = 0; r < 4; ++r) {
      bool hung = step == 2;
      int to = (r + 1) % 4;
      if (hung && r == 2) to = 0;
      RecordState st = hung ? RecordState::kStarted : RecordState::kCompleted;
      ranks[r].call(kWorld, OpKind::kSend, 64, st, (step + 1) * kMs, kF32, 0, to).flags |=
          ncclwatch::trace::kRecordInGroup;
      ranks[r].call(kWorld, OpKind::kRecv, 64, st, (step + 1) * kMs, kF32, 0, (r + 3) % 4).flags |=
          ncclwatch::trace::kRecordInGroup;
    }
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const JobReport& job = onlyJob(report);
  const Verdict* v = find(job, VerdictKind::kUnmatchedP2p);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->culprits, std::vector<int>{2}) << text(report);
  EXPECT_EQ(find(job, VerdictKind::kDeadlock), nullptr) << text(report);
}

// `recv(peer); send(peer)` on both sides of a pair, each on one stream, as PyTorch's dist.recv
// (which only makes the stream wait) lets a pipeline stage do: every send has its receive, yet
// each receive waits for a send its peer's stream holds behind the peer's own receive.
// Ranks 1 and 2 of 4 each receive from the other, then send (`sends`: its state; rank 2's send
// goes to `rankTwoSendsTo`); ranks 0 and 3 are idle.
Report receiveThenSend(RecordState sends, int rankTwoSendsTo) {
  auto ranks = world(4);
  history(ranks, 2);
  ranks[1].call(kWorld, OpKind::kRecv, 64, RecordState::kStarted, 5 * kMs, kF32, 0, 2);
  ranks[1].call(kWorld, OpKind::kSend, 64, sends, 5 * kMs, kF32, 0, 2);
  ranks[2].call(kWorld, OpKind::kRecv, 64, RecordState::kStarted, 5 * kMs, kF32, 0, 1);
  ranks[2].call(kWorld, OpKind::kSend, 64, sends, 5 * kMs, kF32, 0, rankTwoSendsTo);
  auto traces = files(ranks);
  return analyze(traces, ended());
}

TEST(P2pOrderDeadlock, TwoRanksThatEachReceiveBeforeTheySend) {
  Report report = receiveThenSend(RecordState::kIssued, 1);
  const JobReport& job = onlyJob(report);
  const Verdict* v = find(job, VerdictKind::kDeadlock);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->culprits, (std::vector<int>{1, 2})) << text(report);
  EXPECT_EQ(v->classes.size(), 2u) << text(report);
  EXPECT_NE(v->explanation.find("each receive from the other before they send to it"),
            std::string::npos)
      << v->explanation;
  EXPECT_NE(v->classes[0].call.note.find("which its stream holds behind its Recv"),
            std::string::npos)
      << v->classes[0].call.note;
  EXPECT_EQ(find(job, VerdictKind::kUnmatchedP2p), nullptr) << text(report);
}

// `send(peer); recv(peer)` on both sides of a pair, each call its own group (PyTorch's dist.send
// and dist.recv): a send past NCCL's buffers waits for its receive, which the peer's stream runs
// only after the peer's own send (sendsend in session 20's untuned programs: it read as STUCK,
// "GPU work queued before them never finished"). `sendSerial`, `recvSerial`: the two calls' group
// serials.
Report sendThenReceive(uint8_t sendSerial, uint8_t recvSerial) {
  auto ranks = world(4);
  history(ranks, 2);
  for (int r : {1, 2}) {
    ncclwatch::trace::CallRecord& send = ranks[r].call(
        kWorld, OpKind::kSend, 1 << 22, RecordState::kStarted, 5 * kMs, kF32, 0, 3 - r);
    ncclwatch::trace::CallRecord& recv = ranks[r].call(
        kWorld, OpKind::kRecv, 1 << 22, RecordState::kIssued, 5 * kMs, kF32, 0, 3 - r);
    send.flags |= ncclwatch::trace::kRecordInGroup;
    recv.flags |= ncclwatch::trace::kRecordInGroup;
    send.groupDepth = recv.groupDepth = 1;
    send.groupSerial = sendSerial;
    recv.groupSerial = recvSerial;
  }
  auto traces = files(ranks);
  return analyze(traces, ended());
}

TEST(P2pOrderDeadlock, TwoRanksThatEachSendBeforeTheyReceive) {
  Report report = sendThenReceive(7, 8);
  const Verdict* v = firstIs(report, VerdictKind::kDeadlock, {1, 2});
  ASSERT_NE(v, nullptr);
  EXPECT_NE(v->explanation.find("each send to the other before they receive from it"),
            std::string::npos)
      << v->explanation;
  EXPECT_NE(v->classes[0].call.note.find("which its stream holds behind its Send"),
            std::string::npos)
      << v->classes[0].call.note;
}

// The same two calls in one group (batch_isend_irecv) run as one launch: no such deadlock (nor
// where the records do not tell the groups apart: files before session 20).
TEST(P2pOrderDeadlock, NotWhenTheSendAndTheReceiveAreOneGroup) {
  for (uint8_t serial : {uint8_t{7}, uint8_t{0}}) {
    Report report = sendThenReceive(serial, serial);
    EXPECT_EQ(find(onlyJob(report), VerdictKind::kDeadlock), nullptr) << text(report);
  }
}

// The same order on every rank of a ring (each receives from its left before it sends right).
TEST(P2pOrderDeadlock, ARingWhereEveryRankReceivesFirst) {
  auto ranks = world(4);
  for (int r = 0; r < 4; ++r) {
    ranks[r].call(kWorld, OpKind::kRecv, 64, RecordState::kStarted, kMs, kF32, 0, (r + 3) % 4);
    ranks[r].call(kWorld, OpKind::kSend, 64, RecordState::kIssued, kMs, kF32, 0, (r + 1) % 4);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kDeadlock);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->culprits, (std::vector<int>{0, 1, 2, 3})) << text(report);
  EXPECT_NE(v->explanation.find("each receive from the next before they send on"),
            std::string::npos)
      << v->explanation;
}

// Grouped (batch_isend_irecv, ncclGroupStart/End): the send runs beside the receive, both
// started. A pair that hangs so is not this deadlock (here: nobody receives rank 2's send).
TEST(P2pOrderDeadlock, NotWhenTheSendRunsBesideTheReceive) {
  Report report = receiveThenSend(RecordState::kStarted, 3);
  const JobReport& job = onlyJob(report);
  EXPECT_EQ(find(job, VerdictKind::kDeadlock), nullptr) << text(report);
  EXPECT_NE(find(job, VerdictKind::kUnmatchedP2p), nullptr) << text(report);
}

TEST(Stuck, EveryRankStartedAndNoneCompleted) {
  auto ranks = world(4);
  history(ranks, 4);
  for (Rank& r : ranks)
    r.call(kWorld, OpKind::kAllGather, 128, RecordState::kStarted, 10 * kMs, kF32, 0);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const JobReport& job = onlyJob(report);
  ASSERT_EQ(job.verdicts.size(), 1u) << text(report);
  const Verdict& v = job.verdicts[0];
  EXPECT_EQ(v.kind, VerdictKind::kStuck);
  EXPECT_EQ(v.seq, 5u);
  EXPECT_NE(v.explanation.find("started"), std::string::npos);
  EXPECT_TRUE(v.culprits.empty());
}

// One event per call: every rank "reached" the call (its start inferred from stream order). On a
// real GPU that reads the same for a collective held by a compute kernel it waits on, so the
// verdict must not claim a network stall: it names both causes and how to tell them apart.
TEST(Stuck, ReachedOnEveryRankNamesBothCauses) {
  auto ranks = world(4);
  history(ranks, 4);
  for (Rank& r : ranks) {
    r.call(kWorld, OpKind::kAllReduce, 128, RecordState::kStarted, 10 * kMs, kF32, 0).flags |=
        ncclwatch::trace::kRecordStartInferred;
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kStuck);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_TRUE(v->culprits.empty());
  EXPECT_NE(v->explanation.find("reached"), std::string::npos) << v->explanation;
  EXPECT_NE(v->explanation.find("outside NCCL"), std::string::npos) << v->explanation;
  EXPECT_NE(v->explanation.find("NCCLWATCH_EVENTS=full"), std::string::npos) << v->explanation;
  EXPECT_EQ(v->explanation.find("started"), std::string::npos) << v->explanation;
}

TEST(Stuck, NeverStartedOnOneRank) {
  auto ranks = world(4);
  history(ranks, 4);
  for (int r = 0; r < 4; ++r) {
    ranks[r].call(kWorld, OpKind::kAllGather, 128,
                  r == 1 ? RecordState::kIssued : RecordState::kStarted, 10 * kMs, kF32, 0);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kStuck);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->culprits, std::vector<int>{1});
  EXPECT_NE(v->explanation.find("never started"), std::string::npos);
}

// Everyone issued everything and nothing completes: rank 0 takes A then B, rank 1 B then A, on
// one stream each. That is an ordering deadlock, not a stuck call.
// A ring exchange where rank 1's transfers stall: both pairs through rank 1 started on both sides
// and never completed; rank 1, in every stuck pair, is the culprit.
TEST(Stuck, TransfersStalledAtOneRankNameIt) {
  auto ranks = world(3);
  history(ranks, 2);
  ranks[0].call(kWorld, OpKind::kSend, 512, RecordState::kStarted, 5 * kMs, kF32, 0, 1);
  // Rank 1's receive and send are one group, as a ring exchange issues them.
  ranks[1].call(kWorld, OpKind::kRecv, 512, RecordState::kStarted, 5 * kMs, kF32, 0, 0).flags |=
      ncclwatch::trace::kRecordInGroup;
  ranks[1].call(kWorld, OpKind::kSend, 512, RecordState::kStarted, 5 * kMs, kF32, 0, 2).flags |=
      ncclwatch::trace::kRecordInGroup;
  ranks[2].call(kWorld, OpKind::kRecv, 512, RecordState::kStarted, 5 * kMs, kF32, 0, 1);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = firstIs(report, VerdictKind::kStuck, {1});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->seq, 3u);
  EXPECT_EQ(v->classes.size(), 4u);
}

TEST(Deadlock, OppositeOrderOnOneStream) {
  std::vector<Rank> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back(r, 2);
    ranks[r].comm(kWorld, 2, r).comm(kA, 2, r, kWorld, 0).comm(kB, 2, r, kWorld, 1);
    ranks[r].call(kWorld, OpKind::kAllReduce, 8, RecordState::kCompleted, kMs);
  }
  ranks[0].call(kA, OpKind::kAllReduce, 8, RecordState::kStarted, 2 * kMs);
  ranks[0].call(kB, OpKind::kAllReduce, 8, RecordState::kIssued, 2 * kMs);
  ranks[1].call(kB, OpKind::kAllReduce, 8, RecordState::kStarted, 2 * kMs);
  ranks[1].call(kA, OpKind::kAllReduce, 8, RecordState::kIssued, 2 * kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const JobReport& job = onlyJob(report);
  const Verdict* v = find(job, VerdictKind::kDeadlock);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(find(job, VerdictKind::kStuck), nullptr) << text(report);
  EXPECT_EQ(v->classes.size(), 2u);
  EXPECT_EQ(job.verdicts[0].kind, VerdictKind::kDeadlock);
}

// Two groups share ranks 0 and 1 (A = {0,1,2}, B = {0,1,3}); every rank reduces in A, then B,
// until rank 1 takes B first (its groups iterated from a set). Ranks 0 and 1 each wait in a call
// as many peers reached: the tie named both ("ranks 0-1 issued its calls in a different order");
// rank 1 alone left the order it kept until then.
TEST(Deadlock, TwoGroupsSharingTwoRanksNameTheRankThatChangedItsOrder) {
  std::vector<Rank> ranks;
  const int inA[] = {0, 1, 2, -1}, inB[] = {0, 1, -1, 2};
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back(r, 4);
    ranks[r].comm(kWorld, 4, r);
    if (inA[r] >= 0) ranks[r].comm(kA, 3, inA[r], kWorld, 0);
    if (inB[r] >= 0) ranks[r].comm(kB, 3, inB[r], kWorld, 0);
  }
  for (int step = 0; step < 2; ++step) {
    for (int r = 0; r < 4; ++r) {
      int64_t at = (step + 1) * kMs;
      if (inA[r] >= 0) ranks[r].call(kA, OpKind::kAllReduce, 8, RecordState::kCompleted, at);
      if (inB[r] >= 0) ranks[r].call(kB, OpKind::kAllReduce, 8, RecordState::kCompleted, at);
    }
  }
  ranks[0].call(kA, OpKind::kAllReduce, 8, RecordState::kStarted, 3 * kMs);
  ranks[0].call(kB, OpKind::kAllReduce, 8, RecordState::kIssued, 3 * kMs);
  ranks[1].call(kB, OpKind::kAllReduce, 8, RecordState::kStarted, 3 * kMs);
  ranks[1].call(kA, OpKind::kAllReduce, 8, RecordState::kIssued, 3 * kMs);
  ranks[2].call(kA, OpKind::kAllReduce, 8, RecordState::kStarted, 3 * kMs);
  ranks[3].call(kB, OpKind::kAllReduce, 8, RecordState::kStarted, 3 * kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = firstIs(report, VerdictKind::kDeadlock, {1});
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_NE(v->explanation.find("rank 1 broke the order of calls it kept until here"),
            std::string::npos)
      << v->explanation;
}

// Ranks 0, 1 and 3 wait in `op` for rank 2, gone after the history.
Report analyzeOthersWaitingForRank2In(OpKind op, RecordState state) {
  auto ranks = world(4);
  history(ranks, 3);
  for (int r = 0; r < 4; ++r) {
    if (r != 2) ranks[r].call(kWorld, op, op == OpKind::kAllReduce ? 1024 : 0, state, 10 * kMs);
  }
  auto traces = files(ranks);
  return analyze(traces, ended());
}

TEST(DeadRank, ProcessGoneWhileOthersWait) {
  Report report = analyzeOthersWaitingForRank2In(OpKind::kAllReduce, RecordState::kStarted);
  const JobReport& job = onlyJob(report);
  ASSERT_FALSE(job.verdicts.empty()) << text(report);
  const Verdict& v = job.verdicts[0];
  EXPECT_EQ(v.kind, VerdictKind::kDeadRank) << text(report);
  EXPECT_EQ(v.culprits, std::vector<int>{2});
  EXPECT_EQ(v.seq, 4u);
  EXPECT_EQ(find(job, VerdictKind::kMissing), nullptr) << text(report);
}

// How rank 2 ended, as far as its trace tells: a fatal signal its handler recorded; none in a
// header read from its ring (SIGKILL, _exit: no handler runs); or a header that cannot tell (the
// live collector's, built from HELLO, before it reread the ring).
TEST(DeadRank, ItsEndIsSaidAsFarAsItsTraceTells) {
  struct Case {
    int signal;
    bool endRecorded;
    const char* note;
    const char* explanation;
    bool sigtermDump = false;  // a SIGTERM its handler dumped for (exp26's loader_spin)
  };
  for (const Case& c :
       {Case{11, true, "process died of signal 11 (SIGSEGV)",
             "rank 2 died of signal 11 (SIGSEGV) while the others wait"},
        Case{0, true, "killed by SIGKILL (the OOM killer, a launcher) or ended by",
             "look for the OOM killer in the kernel log"},
        Case{0, false, "process ended without a clean shutdown (crashed or exited)",
             "rank 2 is gone while the others wait"},
        Case{0, true, "process terminated by SIGTERM (a launcher, a timeout, a scheduler)",
             "rank 2 stopped issuing NCCL calls while the others wait for it in #4, and was then "
             "terminated by SIGTERM",
             true}}) {
    auto ranks = world(4);
    history(ranks, 3);
    ranks[2].file().header.fatalSignal = c.signal;
    ranks[2].file().endRecorded = c.endRecorded;
    if (c.sigtermDump) {
      ranks[2].file().dumps.push_back({});
      ranks[2].file().dumps.back().trigger = "sigterm";
      ranks[2].file().dumps.back().timeNs = ranks[2].file().header.anchorMonotonicNs + 60'000 * kMs;
    }
    for (int r : {0, 1, 3}) {
      ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 10 * kMs);
    }
    auto traces = files(ranks);
    Report report = analyze(traces, ended());
    const Verdict* v = firstIs(report, VerdictKind::kDeadRank, {2});
    ASSERT_NE(v, nullptr) << text(report);
    EXPECT_NE(v->classes.back().call.note.find(c.note), std::string::npos) << text(report);
    EXPECT_NE(v->explanation.find(c.explanation), std::string::npos) << v->explanation;
  }
}

// The others wait for the gone rank in a teardown (ncclCommDestroy): a dead rank, not an init
// hang (a job's end is no initialisation; PyTorch after an abort showed it so).
TEST(DeadRank, AWaitInTeardownIsNotAnInitHang) {
  Report report = analyzeOthersWaitingForRank2In(OpKind::kDestroy, RecordState::kIssued);
  const JobReport& job = onlyJob(report);
  EXPECT_EQ(find(job, VerdictKind::kInitHang), nullptr) << text(report);
  const Verdict* v = firstIs(report, VerdictKind::kDeadRank, {2});
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->seq, 4u);
}

// Rank 2 ended through exit() before the call the others wait in: with status 1 (Python after
// an uncaught exception) it failed, and the verdict sends the user to its own error, not to an
// early return; with status 0 it left early.
TEST(DeadRank, AnExitWithAFailureStatusIsSaidAsAFailure) {
  for (int status : {1, 0}) {
    auto ranks = world(4);
    history(ranks, 3);
    for (int r = 0; r < 4; ++r) {
      if (r != 2) ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 10 * kMs);
    }
    ranks[2].exited(status);
    auto traces = files(ranks);
    Report report = analyze(traces, ended());
    const Verdict* v = firstIs(report, VerdictKind::kDeadRank, {2});
    ASSERT_NE(v, nullptr) << text(report);
    if (status == 1) {
      EXPECT_NE(v->explanation.find("rank 2 failed (exit status 1)"), std::string::npos)
          << v->explanation;
      EXPECT_NE(v->classes[1].call.note.find("exited with status 1"), std::string::npos)
          << v->classes[1].call.note;
      EXPECT_NE(text(report).find("1 exited with a non-zero status"), std::string::npos)
          << text(report);
    } else {
      EXPECT_NE(v->explanation.find("ended normally"), std::string::npos) << v->explanation;
      EXPECT_NE(v->classes[1].call.note.find("called exit 0"), std::string::npos)
          << v->classes[1].call.note;
    }
  }
}

// Ranks 0, 1 and 3 wait in an all_reduce issued from the native `callSite`, which rank 2, gone,
// never reached.
std::vector<Rank> waitingOnRankTwoFrom(uint64_t callSite) {
  auto ranks = world(4);
  history(ranks, 3);
  for (int r = 0; r < 4; ++r) {
    if (r == 2) continue;
    ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 10 * kMs).callSite =
        callSite;
  }
  return ranks;
}

// A call whose caller ran no Python frame keeps a return address; the rank's trace describes it
// as module + offset (a site line numbered 0), and the verdict says that where it had the raw
// address; in a Python process it adds why there is no line.
TEST(IssuedAt, ANativeCallSiteIsItsModuleAndOffset) {
  for (bool python : {false, true}) {
    auto ranks = waitingOnRankTwoFrom(0x7f0000001234);
    ranks[0].file().pythonSites.push_back(
        {0, 0x7f0000001234, {"/opt/lib/libframework.so+0x1234", "thread pt_autograd_0"}});
    if (python) ranks[0].file().pythonSites.push_back({1, 0x7f0000009999, {"train.py:3 main"}});
    auto traces = files(ranks);
    Report report = analyze(traces, ended());
    const Verdict* v = firstIs(report, VerdictKind::kDeadRank, {2});
    ASSERT_NE(v, nullptr) << text(report);
    EXPECT_EQ(v->classes[0].call.issuedAt,
              std::string("libframework.so+0x1234") +
                  (python ? " (no Python frame on PyTorch's autograd thread pt_autograd_0, a "
                            "gradient hook during backward() such as DDP's bucket all-reduce)"
                          : ""))
        << text(report);
  }
}

// A return address belongs to one process: the class's site is found in whichever of its ranks'
// traces describes it, not only the first rank's (a deadlock's class on another communicator
// showed a raw address offline for that).
TEST(IssuedAt, ANativeSiteIsFoundInAnyRankOfTheClass) {
  auto ranks = waitingOnRankTwoFrom(0x7f0000001234);
  ranks[3].file().pythonSites.push_back({0, 0x7f0000001234, {"/opt/lib/libframework.so+0x1234"}});
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = firstIs(report, VerdictKind::kDeadRank, {2});
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->classes[0].call.issuedAt, "libframework.so+0x1234") << text(report);
}

// exp22's barrier_rank0: rank 0 calls dist.barrier() inside `if rank == 0:` where the others go
// on to the next all_reduce. NCCL sees an AllReduce of one element against one of 64: the
// verdict names the two torch.distributed functions, or "count differ" sends the user looking
// at tensor sizes.
TEST(IssuedAt, AMismatchNamesTheTorchFunctionsWhereTheyDiffer) {
  const std::string torchDir = "/venv/lib/python3.11/site-packages/torch/distributed/";
  auto site = [&](uint32_t number, const std::string& api, int line) {
    return ncclwatch::trace::PythonSite{
        number,
        0,
        {torchDir + "distributed_c10d.py:4000 " + api, torchDir + "c10d_logger.py:83 wrapper",
         "train.py:" + std::to_string(line) + " step", "train.py:200 main"}};
  };
  // Rank 0's call goes through `rankZeroApi`, the others' through all_reduce.
  auto job = [&](const std::string& rankZeroApi) {
    auto ranks = world(4);
    history(ranks, 2);
    for (int r = 0; r < 4; ++r) {
      bool barrier = r == 0;
      uint32_t number = barrier ? 2 : 1;
      ranks[r].file().pythonSites = {site(1, "all_reduce", 119), site(2, rankZeroApi, 124)};
      ranks[r]
          .call(kWorld, OpKind::kAllReduce, barrier ? 1 : 64, RecordState::kStarted, 10 * kMs)
          .callSite = ncclwatch::trace::kPythonSiteTag | number;
    }
    return files(ranks);
  };
  auto traces = job("barrier");
  Report report = analyze(traces, ended());
  const Verdict* v = firstIs(report, VerdictKind::kMismatch, {0});
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_NE(v->explanation.find("(in Python: rank 0 barrier(), ranks 1-3 all_reduce())"),
            std::string::npos)
      << v->explanation;
  EXPECT_NE(text(report).find("issued by barrier() at train.py:124 step"), std::string::npos)
      << text(report);
  EXPECT_NE(onlyJob(report).summary.find("First cause: " + v->explanation + "."), std::string::npos)
      << onlyJob(report).summary;
  // Where every class called the same function, the lines stay as they were.
  traces = job("all_reduce");
  report = analyze(traces, ended());
  EXPECT_EQ(text(report).find("issued by"), std::string::npos) << text(report);
  EXPECT_EQ(text(report).find("in Python:"), std::string::npos) << text(report);
}

// exp24's gathermix: rank 0 calls dist.all_gather() where ranks 1-3 call dist.gather(dst=0),
// whose sends to rank 0 wait for receives it never posts: the verdict names both functions.
TEST(IssuedAt, AnUnmatchedTransferNamesTheTorchFunctionsWhereTheyDiffer) {
  const std::string torchDir = "/venv/lib/python3.11/site-packages/torch/distributed/";
  auto site = [&](uint32_t number, const std::string& api, int line) {
    return ncclwatch::trace::PythonSite{
        number,
        0,
        {torchDir + "distributed_c10d.py:4000 " + api, "train.py:" + std::to_string(line) + " step",
         "train.py:200 main"}};
  };
  auto ranks = world(4);
  history(ranks, 2);
  for (int r = 0; r < 4; ++r) {
    ranks[r].file().pythonSites = {site(1, "all_gather", 68), site(2, "gather", 70)};
    auto& call = r == 0 ? ranks[r].call(kWorld, OpKind::kBroadcast, 4, RecordState::kStarted,
                                        10 * kMs, kF32, kSum, 0)
                        : ranks[r].call(kWorld, OpKind::kSend, 4, RecordState::kStarted, 10 * kMs,
                                        kF32, kSum, 0);
    call.callSite = ncclwatch::trace::kPythonSiteTag | (r == 0 ? 1 : 2);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = firstIs(report, VerdictKind::kUnmatchedP2p, {0});
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_NE(v->explanation.find("(in Python: rank 0 all_gather(), ranks 1-3 gather())"),
            std::string::npos)
      << v->explanation;
  // Three ranks sending to one that never receives are one pattern, not three wrong peers.
  EXPECT_EQ(v->explanation.find("; or, as"), std::string::npos) << v->explanation;
}

// Rank 2 died right after a send its peer received: its own record of the send never saw the
// completion, but the send is done, so rank 2 waits for nothing and is the dead rank; and its
// dump says where it was.
TEST(DeadRank, AStaleSendOfTheDeadRankIsNotAWait) {
  auto ranks = world(4);
  history(ranks, 3);
  ranks[2].call(kWorld, OpKind::kSend, 64, RecordState::kStarted, 8 * kMs, kF32, 0, 3);
  ranks[3].call(kWorld, OpKind::kRecv, 64, RecordState::kCompleted, 8 * kMs, kF32, 0, 2);
  for (int r = 0; r < 4; ++r) {
    if (r != 2) ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 10 * kMs);
  }
  ncclwatch::trace::Dump dump;
  dump.trigger = "signal";
  ncclwatch::trace::DumpThread thread;
  thread.tid = ranks[2].file().header.pid;
  thread.name = "main";
  for (auto [function, module] :
       {std::pair{"raise", "/lib/libc.so.6"}, std::pair{"Trainer::step", "/app/train"},
        std::pair{"main", "/app/train"}}) {
    ncclwatch::trace::DumpFrame frame;
    frame.function = function;
    frame.module = module;
    thread.frames.push_back(frame);
  }
  dump.threads.push_back(thread);
  ranks[2].file().dumps.push_back(dump);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = firstIs(report, VerdictKind::kDeadRank, {2});
  ASSERT_NE(v, nullptr);
  ASSERT_EQ(v->classes.size(), 2u);
  EXPECT_EQ(v->classes[1].stackTop, "Trainer::step \u2190 main") << text(report);
  EXPECT_NE(text(report).find("in Trainer::step \u2190 main"), std::string::npos) << text(report);
}

// Frames the CLI gave lines (tools/source_lines.h): the stack top names file:line and inlined
// frames; the verdict's text shortens long C++ names, its JSON keeps them whole.
TEST(DeadRank, StackTopShowsLinesAndReadableNames) {
  auto ranks = world(2);
  history(ranks, 3);
  ranks[0].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 10 * kMs);
  const std::string sleepFor =
      "void std::this_thread::sleep_for<long, std::ratio<1l, 1000l> >(std::chrono::duration<long, "
      "std::ratio<1l, 1000l> > const&)";
  ncclwatch::trace::Dump dump;
  dump.trigger = "signal";
  ncclwatch::trace::DumpThread thread;
  thread.tid = ranks[1].file().header.pid;
  ncclwatch::trace::DumpFrame inlined;
  inlined.function = sleepFor;
  inlined.module = "/app/train";
  inlined.file = "/usr/include/c++/12/bits/this_thread_sleep.h";
  inlined.line = 82;
  inlined.inlined = true;
  ncclwatch::trace::DumpFrame step = inlined;
  step.function = "Trainer::step[abi:cxx11](int)";
  step.file = "train.cc";
  step.line = 142;
  step.inlined = false;
  thread.frames = {inlined, step};
  dump.threads.push_back(thread);
  ranks[1].file().dumps.push_back(dump);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = firstIs(report, VerdictKind::kDeadRank, {1});
  ASSERT_NE(v, nullptr) << text(report);
  ASSERT_EQ(v->classes.size(), 2u);
  const std::string full = sleepFor + " at /usr/include/c++/12/bits/this_thread_sleep.h:82 " +
                           "(inlined) \u2190 Trainer::step[abi:cxx11](int) at train.cc:142";
  EXPECT_EQ(v->classes[1].stackTop, full);
  EXPECT_NE(verdictJson(*v, "job", 0).find(full), std::string::npos);
  EXPECT_NE(text(report).find("in void std::this_thread::sleep_for<\u2026>(std::chrono::"
                              "duration<\u2026> const&) at "
                              "/usr/include/c++/12/bits/this_thread_sleep.h:82 (inlined) "
                              "\u2190 Trainer::step(int) at train.cc:142\n"),
            std::string::npos)
      << text(report);
}

TEST(ReadableNames, ShortensOnlyLongStdTemplatesAbiTagsAndLongParameterLists) {
  EXPECT_EQ(readableNames("TrainLoop::runStep(int) at examples/train_loop.cc:142"),
            "TrainLoop::runStep(int) at examples/train_loop.cc:142");
  EXPECT_EQ(readableNames("f[abi:cxx11](std::shared_ptr<cudasim::Stream> const&)"),
            "f(std::shared_ptr<cudasim::Stream> const&)");
  EXPECT_EQ(readableNames("g(std::vector<int, std::allocator<int> > const&)"),
            "g(std::vector<\u2026> const&)");
  EXPECT_EQ(readableNames("Mine<int, std::ratio<1l, 1000000000l>, Something<long> >::h()"),
            "Mine<int, std::ratio<1l, 1000000000l>, Something<long> >::h()");
  EXPECT_EQ(readableNames("(anonymous namespace)::operator<<(std::ostream&, int)"),
            "(anonymous namespace)::operator<<(std::ostream&, int)");
  EXPECT_EQ(readableNames("k(" + std::string(70, 'x') + ")"), "k(\u2026)");
  // Unbalanced text (a truncated name) is kept as it is.
  EXPECT_EQ(readableNames("broken<std::pair<int"), "broken<std::pair<int");
  EXPECT_EQ(readableNames("py: train.py:88 step"), "py: train.py:88 step");
}

TEST(InitHang, RankWithoutCommunicator) {
  auto ranks = world(3);
  ranks.emplace_back(3, 4);  // never finished ncclCommInitRank
  history(ranks, 0);
  for (int r = 0; r < 3; ++r)
    ranks[r].call(kWorld, OpKind::kAllReduce, 8, RecordState::kStarted, kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kInitHang);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->culprits, std::vector<int>{3});
}

// While the job runs, ranks waiting in a root init are a hang only once the last of them has
// waited initPatienceNs (30 s): a launch's ranks reach init seconds apart.
TEST(InitHang, ARunningJobsInitWaitIsAHangOnlyAfterThePatience) {
  std::vector<Rank> ranks;
  for (int r : {0, 1, 3}) {
    ranks.emplace_back(r, 4);
    ranks.back().call(kA, OpKind::kInit, 4, RecordState::kIssued, kMs, kF32, kSum, r);
  }
  auto traces = files(ranks);
  Options options = ended();
  options.aliveRanks = {0, 1, 3};
  options.quietNs = 3000 * kMs;
  options.nowNs = synthetic::kAnchorWall + 20'000 * kMs;  // 20 s after they arrived
  Report report = analyze(traces, options);
  EXPECT_EQ(find(onlyJob(report), VerdictKind::kInitHang), nullptr) << text(report);
  options.nowNs = synthetic::kAnchorWall + 32'000 * kMs;
  report = analyze(traces, options);
  const Verdict* v = find(onlyJob(report), VerdictKind::kInitHang);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->culprits, std::vector<int>{2}) << text(report);
}

// exp23's late_init: rank 2 never reaches dist.init_process_group (a download that never ends);
// ranks 0, 1 and 3 wait inside ncclCommInitRankConfig, their Init recorded pending before NCCL
// ran. Before, the verdict named the three waiting ranks as its culprits. `rankTwo`: "none" (no
// trace), "other" (its Init pending on another unique id's communicator).
Report analyzeInitWaitingForRankTwo(const std::string& rankTwo) {
  std::vector<Rank> ranks;
  for (int r = 0; r < 4; ++r) {
    if (r == 2 && rankTwo == "none") continue;
    ranks.emplace_back(r, 4);
    uint64_t hash = r == 2 ? kB : kA;
    ranks.back().call(hash, OpKind::kInit, 4, RecordState::kIssued, kMs, kF32, kSum, r);
  }
  auto traces = files(ranks);
  return analyze(traces, ended());
}

TEST(InitHang, TheRanksWaitingInARootInitNameTheRankThatNeverJoined) {
  Report report = analyzeInitWaitingForRankTwo("none");
  const Verdict* v = find(onlyJob(report), VerdictKind::kInitHang);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->culprits, std::vector<int>{2}) << text(report);
  EXPECT_EQ(v->comm.hash, kA);
  EXPECT_EQ(v->comm.size, 4);
  EXPECT_NE(v->explanation.find("ranks 0-1,3 wait in the init of a 4-rank communicator for rank "
                                "2, which never joined: it has no trace"),
            std::string::npos)
      << v->explanation;
  // The one rank without a trace, in words a user reads as one rank (it said "ranks 2 ... have").
  EXPECT_NE(std::find(v->doubts.begin(), v->doubts.end(), "rank 2 of the job has no trace"),
            v->doubts.end())
      << text(report);
  report = analyzeInitWaitingForRankTwo("other");
  v = find(onlyJob(report), VerdictKind::kInitHang);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->culprits, std::vector<int>{2}) << text(report);
  EXPECT_NE(v->explanation.find("it waits in the init of another communicator"), std::string::npos)
      << v->explanation;
}

// NCCL's message for a failed call, which PyTorch does not show without NCCL_DEBUG, is said with
// the error (exp23's dup_gpu: two ranks on one GPU).
TEST(Error, NcclsOwnMessageForTheFailedCallIsSaid) {
  std::vector<Rank> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back(r, 4);
    bool refused = r == 1 || r == 2;
    ncclwatch::trace::CallRecord& init = ranks.back().call(
        kA, OpKind::kInit, 4, refused ? RecordState::kFailed : RecordState::kIssued, kMs, kF32,
        kSum, r);
    if (!refused) continue;
    init.result = 5;  // ncclInvalidUsage
    ranks.back().file().lastNcclError = "Duplicate GPU detected : rank " + std::to_string(r) +
                                        " and rank " + std::to_string(3 - r) +
                                        " both on CUDA device 1000";
    ranks.back().file().lastNcclErrorIndex = init.ringIndex;
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kError);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->culprits, (std::vector<int>{1, 2})) << text(report);
  EXPECT_NE(v->explanation.find("returned ncclInvalidUsage (invalid usage): NCCL said \"Duplicate "
                                "GPU detected : rank 1 and rank 2 both on CUDA device 1000\""),
            std::string::npos)
      << v->explanation;
  EXPECT_EQ(v->explanation.find("log for NCCL's message"), std::string::npos) << v->explanation;
}

TEST(InitHang, SplitSomeRanksNeverCalled) {
  auto ranks = world(4);
  history(ranks, 2);
  for (int r = 0; r < 3; ++r)
    ranks[r].call(kWorld, OpKind::kSplit, 0, RecordState::kIssued, 5 * kMs, 0, 0, 0);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kInitHang);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->culprits, std::vector<int>{3});
  EXPECT_EQ(v->seq, 3u);
}

TEST(SplitColour, OneRankBreaksTheLayout) {
  auto ranks = world(8);
  for (int r = 0; r < 8; ++r) {
    int colour = r == 3 ? 2 : r / 2;
    ranks[r].call(kWorld, OpKind::kSplit, 0, RecordState::kCompleted, kMs, 0, 0, colour);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kMismatch);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->fields, std::vector<std::string>{"color"});
  EXPECT_EQ(v->culprits, std::vector<int>{3});
}

// PyTorch's new_group([0, 1]) on ranks 0-2 (rank 2 passes NCCL_SPLIT_NOCOLOR), while rank 3
// skipped it: the split's class names both colours, not its first rank's alone.
TEST(SplitColour, AClassOfSeveralColoursNamesEach) {
  auto ranks = world(4);
  history(ranks, 1);
  for (int r = 0; r < 3; ++r) {
    ranks[r].call(kWorld, OpKind::kSplit, 0, RecordState::kIssued, 5 * kMs, 0, 0, r == 2 ? -1 : 0);
  }
  ranks[3].call(kWorld, OpKind::kAllReduce, 16, RecordState::kStarted, 5 * kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kMismatch);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->culprits, std::vector<int>{3});
  EXPECT_NE(text(report).find("ranks 0-2  Split colors 0 and NOCOLOR"), std::string::npos)
      << text(report);
}

// exp24's grouporder: every rank makes the tensor-parallel groups [0, 1], [2, 3] and then the
// data-parallel ones [0, 2], [1, 3] with dist.new_group(), but rank 3 makes its data-parallel
// ones first. PyTorch's colour follows the rank list (its first rank here) and non-members pass
// NCCL_SPLIT_NOCOLOR: at the second and fourth splits ranks 2 and 3, then 1 and 3, pass two
// colours, and each got a communicator of one rank. Nothing hangs; the sums are wrong.
TEST(SplitColour, RanksMakingTheirNewGroupsInAnotherOrderAreNamed) {
  const std::vector<std::vector<int>> usual = {{0, 1}, {2, 3}, {0, 2}, {1, 3}};
  const std::vector<std::vector<int>> rankThree = {{0, 2}, {1, 3}, {0, 1}, {2, 3}};
  auto job = [&](const std::string& api) {
    auto ranks = world(4);
    for (int r = 0; r < 4; ++r) {
      ranks[r].file().pythonSites = {
          {1,
           0,
           {"/venv/site-packages/torch/distributed/distributed_c10d.py:5200 " + api,
            "train.py:102 build_groups", "train.py:200 main"}}};
      for (const std::vector<int>& group : r == 3 ? rankThree : usual) {
        bool member = std::find(group.begin(), group.end(), r) != group.end();
        ranks[r]
            .call(kWorld, OpKind::kSplit, 0, RecordState::kCompleted, kMs, 0, 0,
                  member ? group.front() : -1)
            .callSite = ncclwatch::trace::kPythonSiteTag | 1;
      }
    }
    return files(ranks);
  };
  auto traces = job("new_group");
  Report report = analyze(traces, ended());
  const Verdict* v = find(onlyJob(report), VerdictKind::kMismatch);
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->fields, std::vector<std::string>{"color"});
  EXPECT_EQ(v->culprits, std::vector<int>{3}) << text(report);
  EXPECT_EQ(v->effect, Effect::kSilentDataCorruption);
  EXPECT_EQ(v->seq, 2u) << text(report);
  EXPECT_NE(v->explanation.find("the ranks disagree on the group that one new_group() call makes "
                                "(rank 3 colour 1, rank 2 colour 2)"),
            std::string::npos)
      << v->explanation;
  EXPECT_NE(v->explanation.find("rank 3 disagrees at every such call (#2, #4)"), std::string::npos)
      << v->explanation;
  // split_group() (or a device mesh) makes several groups in one split: two colours are its
  // design, not a disagreement.
  traces = job("split_group");
  report = analyze(traces, ended());
  EXPECT_EQ(find(onlyJob(report), VerdictKind::kMismatch), nullptr) << text(report);
}

TEST(Straggler, ConsistentlyLastIsInformation) {
  auto ranks = world(4);
  for (int s = 0; s < 20; ++s) {
    for (int r = 0; r < 4; ++r) {
      ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kCompleted,
                    s * 100 * kMs + (r == 2 ? 30 * kMs : r * kMs / 10));
    }
  }
  for (Rank& r : ranks) r.clean();
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const JobReport& job = onlyJob(report);
  ASSERT_EQ(job.verdicts.size(), 1u) << text(report);
  EXPECT_EQ(job.verdicts[0].kind, VerdictKind::kStraggler);
  EXPECT_EQ(job.verdicts[0].culprits, std::vector<int>{2});
  EXPECT_FALSE(report.hasFindings());
}

TEST(Jobs, AttemptsAndJobsAreKeptApart) {
  std::vector<TraceFile> traces;
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (int r = 0; r < 2; ++r) {
      Rank rank(r, 2, "job-x", 100 + attempt * 10 + r);
      rank.file().header.anchorRealtimeNs += attempt * 1000 * kMs;
      rank.comm(kWorld + attempt, 2, r);
      rank.call(kWorld + attempt, OpKind::kAllReduce, 8, RecordState::kCompleted, kMs);
      rank.clean();
      traces.push_back(rank.take());
    }
  }
  Rank other(0, 1, "job-y");
  other.clean();
  traces.push_back(other.take());
  Report report = analyze(traces, ended());
  ASSERT_EQ(report.jobs.size(), 3u);
  EXPECT_EQ(report.jobs[0].jobId, "job-x");
  EXPECT_EQ(report.jobs[0].attempt, 0);
  EXPECT_EQ(report.jobs[1].attempt, 1);
  EXPECT_EQ(report.jobs[1].processes.size(), 2u);
  EXPECT_EQ(report.jobs[2].jobId, "job-y");
  EXPECT_FALSE(report.hasFindings()) << text(report);
}

TEST(Json, EveryVerdictIsOneParsableLine) {
  auto ranks = world(4);
  history(ranks, 3);
  for (int r = 0; r < 4; ++r) {
    ranks[r].call(kWorld, OpKind::kAllReduce, r == 1 ? 7 : 8, RecordState::kStarted, 10 * kMs);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const JobReport& job = onlyJob(report);
  ASSERT_FALSE(job.verdicts.empty());
  std::string line = verdictJson(job.verdicts[0], job.jobId, job.attempt);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(line);
  EXPECT_EQ(std::string_view(doc["kind"]), "mismatch");
  EXPECT_EQ(std::string_view(doc["comm"]["hash"]), "0000000000001111");
  EXPECT_EQ(int64_t(doc["seq"]), 4);
  EXPECT_EQ(std::string_view(doc["fields"].at(0)), "count");
  EXPECT_EQ(int64_t(doc["culprits"].at(0)), 1);
  EXPECT_EQ(std::string_view(doc["classes"].at(0)["ranks"]), "0,2-3");
  EXPECT_EQ(std::string_view(doc["classes"].at(1)["call"]["dtype"]), "f32");
  EXPECT_FALSE(std::string_view(doc["explanation"]).empty());
  std::ostringstream whole;
  printJson(report, whole);
  simdjson::padded_string padded(whole.str());
  simdjson::dom::element all = parser.parse(padded);
  EXPECT_EQ(simdjson::dom::array(all["jobs"]).size(), 1u);
}

}  // namespace

// A subgroup barrier between steps, as PyTorch issues it: ranks 0 and 1 make two world
// all-reduces (sites 33 and 42) and then a barrier on the pair (site 46), step after step; the
// pair's next call waits (by stream events) for the world's. `skipper` skips the barrier at the
// last step and goes on to the next step's world calls, its own next barrier queued behind
// them; `extra`, instead, makes a barrier none of the steps had before.
namespace subgroup {
constexpr uint64_t kSite33 = (1ull << 63) | 33, kSite42 = (1ull << 63) | 42,
                   kSite46 = (1ull << 63) | 46;
constexpr uint64_t kWorldStream = 1, kPairStream = 2;

std::vector<Rank> job(int steps, bool barriers) {
  auto ranks = world(4);
  ranks[0].comm(kA, 2, 0, kWorld, 0);
  ranks[1].comm(kA, 2, 1, kWorld, 0);
  int64_t t = kMs;
  for (int s = 0; s < steps; ++s) {
    for (Rank& r : ranks) {
      r.call(kWorld, OpKind::kAllReduce, 8, RecordState::kCompleted, t).callSite = kSite33;
      r.call(kWorld, OpKind::kAllReduce, 8, RecordState::kCompleted, t + 10).callSite = kSite42;
    }
    for (int r = 0; barriers && r < 2; ++r) {
      ranks[r]
          .call(kA, OpKind::kAllReduce, 1, RecordState::kCompleted, t + 20, kF32, kSum, -1,
                kPairStream)
          .callSite = kSite46;
    }
    t += kMs;
  }
  return ranks;
}

// The step where it hangs: `barrierFirst` (a rank) starts its barrier right after the world's
// second call; the others go on to the next step's first world call, which waits for it, and
// `queued` (the other pair member) has its own barrier queued behind that.
// A step's two world all-reduces (sites 33 and 42), completed on every rank, from `t`.
void worldCalls(std::vector<Rank>& ranks, int64_t t) {
  for (Rank& r : ranks) {
    r.call(kWorld, OpKind::kAllReduce, 8, RecordState::kCompleted, t).callSite = kSite33;
    r.call(kWorld, OpKind::kAllReduce, 8, RecordState::kCompleted, t + 10).callSite = kSite42;
  }
}

void hang(std::vector<Rank>& ranks, int barrierFirst, int queued, int64_t t) {
  worldCalls(ranks, t);
  ranks[barrierFirst]
      .call(kA, OpKind::kAllReduce, 1, RecordState::kStarted, t + 20, kF32, kSum, -1, kPairStream)
      .callSite = kSite46;
  for (int r = 0; r < 4; ++r) {
    if (r == barrierFirst) continue;
    ranks[r].call(kWorld, OpKind::kAllReduce, 8, RecordState::kStarted, t + 30).callSite = kSite33;
  }
  ranks[queued]
      .call(kA, OpKind::kAllReduce, 1, RecordState::kIssued, t + 40, kF32, kSum, -1, kPairStream)
      .callSite = kSite46;
}
}  // namespace subgroup

TEST(CrossComm, ASkippedSubgroupBarrierIsACycleBlamingTheRankThatSkippedIt) {
  auto ranks = subgroup::job(3, true);
  subgroup::hang(ranks, /*barrierFirst=*/0, /*queued=*/1, 10 * kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = firstIs(report, VerdictKind::kDeadlock, {1});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->comm.hash, kA);
  EXPECT_EQ(v->seq, 4u);  // the barrier rank 0 waits in
  EXPECT_NE(v->explanation.find("Rank 1 broke the order of calls it kept until here"),
            std::string::npos)
      << v->explanation;
  // No verdict blames rank 0 for the world call it never issued.
  for (const Verdict& other : onlyJob(report).verdicts) {
    EXPECT_FALSE(other.primary && other.kind == VerdictKind::kMissing) << text(report);
  }
}

TEST(CrossComm, ABarrierNoStepHadBeforeBlamesTheRankThatAddedIt) {
  auto ranks = subgroup::job(3, false);
  subgroup::hang(ranks, /*barrierFirst=*/0, /*queued=*/1, 10 * kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = firstIs(report, VerdictKind::kDeadlock, {0});
  ASSERT_NE(v, nullptr);
  EXPECT_NE(v->explanation.find("Rank 0 broke the order"), std::string::npos) << v->explanation;
}

// Rank 0's pair call goes to the world instead (PyTorch's group=None for a subgroup): it waits
// in the world with a call that is not the others' there, while its pair partner waits for it in
// the pair, its world call queued behind. The world's mismatch is the cause; the wait through
// it is no cycle of orders (it was a DEADLOCK of ranks 0-1 ahead of the mismatch).
TEST(CrossComm, ACallOnTheWrongCommunicatorIsAMismatchNotACycle) {
  auto ranks = subgroup::job(3, true);
  const int64_t t = 10 * kMs;
  subgroup::worldCalls(ranks, t);
  ranks[0].call(kWorld, OpKind::kAllReduce, 1, RecordState::kStarted, t + 20).callSite =
      subgroup::kSite46;
  ranks[1]
      .call(kA, OpKind::kAllReduce, 1, RecordState::kStarted, t + 20, kF32, kSum, -1,
            subgroup::kPairStream)
      .callSite = subgroup::kSite46;
  ranks[1].call(kWorld, OpKind::kAllReduce, 8, RecordState::kIssued, t + 30).callSite =
      subgroup::kSite33;
  for (int r = 2; r < 4; ++r) {
    ranks[r].call(kWorld, OpKind::kAllReduce, 8, RecordState::kStarted, t + 30).callSite =
        subgroup::kSite33;
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  ASSERT_NE(firstIs(report, VerdictKind::kMismatch, {0}), nullptr);
  EXPECT_EQ(find(onlyJob(report), VerdictKind::kDeadlock), nullptr) << text(report);
}

// Without call sites (or history) neither side broke an order the records show: both named.
TEST(CrossComm, WithoutCallSitesTheCycleNamesBothSides) {
  auto ranks = subgroup::job(0, true);
  subgroup::hang(ranks, 0, 1, 10 * kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = firstIs(report, VerdictKind::kDeadlock, {0, 1});
  ASSERT_NE(v, nullptr);
  EXPECT_NE(v->explanation.find("different orders"), std::string::npos) << v->explanation;
}

// The same skip in a program whose host waits for each collective (cudaStreamSynchronize): rank
// 1 never issues its next barrier at all. Each comm then misses one rank; the one that broke its
// order is the cause and the other verdict its consequence.
TEST(CrossComm, TwoMissingCallsThatHoldEachOtherBlameTheRankThatBrokeItsOrder) {
  auto ranks = subgroup::job(3, true);
  const int64_t t = 10 * kMs;
  subgroup::worldCalls(ranks, t);
  ranks[0]
      .call(kA, OpKind::kAllReduce, 1, RecordState::kStarted, t + 20, kF32, kSum, -1,
            subgroup::kPairStream)
      .callSite = subgroup::kSite46;
  for (int r = 1; r < 4; ++r) {
    ranks[r].call(kWorld, OpKind::kAllReduce, 8, RecordState::kStarted, t + 30).callSite =
        subgroup::kSite33;
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = firstIs(report, VerdictKind::kMissing, {1});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->comm.hash, kA);
  const Verdict* world = nullptr;
  for (const Verdict& other : onlyJob(report).verdicts) {
    if (other.comm.hash == kWorld) world = &other;
  }
  ASSERT_NE(world, nullptr) << text(report);
  EXPECT_FALSE(world->primary) << text(report);
  EXPECT_NE(world->explanation.find("a consequence"), std::string::npos) << world->explanation;
}

// Calls shed for want of a free event pair are an evidence gap the report names, with the
// rank and how many; calls untracked by choice (events off) are not "shed".
TEST(EvidenceGaps, ShedCallsAreNamedWithTheirRankAndCount) {
  auto ranks = world(2);
  history(ranks, 4);
  for (int i = 0; i < 3; ++i) {
    ranks[1].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kIssued, (10 + i) * kMs).flags |=
        ncclwatch::trace::kRecordNoEvents | ncclwatch::trace::kRecordShed;
    ranks[0].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kCompleted, (10 + i) * kMs);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const JobReport& job = onlyJob(report);
  bool named = false;
  for (const std::string& gap : job.evidenceGaps) {
    named |= gap ==
             "rank 1 left 3 of 7 calls untracked (no free CUDA event: its calls outran "
             "the watchdog)";
  }
  EXPECT_TRUE(named) << text(report);
}
