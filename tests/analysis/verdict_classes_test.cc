// The verdict classes of issue 14 on synthetic traces: errors as findings, a rank that ends
// normally while others wait, the smallest culprit set of unmatched sends and receives, silent
// data corruption, substitution against insertion, ties in 2-rank communicators, confidence and
// evidence gaps, ncclCommShrink's excluded ranks, and a hang an abort ended.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "analysis/analyze.h"
#include "analysis/before_aborts.h"
#include "analysis/describe.h"
#include "synthetic.h"

namespace {

using namespace ncclwatch::analysis;
using synthetic::kF32;
using synthetic::kI64;
using synthetic::kMax;
using synthetic::kSum;
using synthetic::OpKind;
using synthetic::Rank;
using synthetic::RecordState;
using synthetic::TraceFile;

constexpr uint64_t kWorld = 0x1111, kB = 0x3333, kShrunk = 0x4444;
constexpr int64_t kMs = 1'000'000;
constexpr int kI32 = 2;

// Every process ended (killed, unless marked clean): the state `ncclwatch inspect` sees after
// a hung job was stopped.
Options ended() {
  Options options;
  options.probeProcesses = false;
  options.nowNs = synthetic::kAnchorWall + 3600'000 * kMs;
  return options;
}

// A running job `sinceLastMs` after its last activity, with `alive` ranks still running.
Options running(std::vector<int> alive, int64_t sinceLastMs, int64_t lastMs) {
  Options options = ended();
  options.aliveRanks = std::move(alive);
  options.quietNs = 3000 * kMs;
  options.nowNs = synthetic::kAnchorWall + (lastMs + sinceLastMs) * kMs;
  return options;
}

std::vector<Rank> world(int n) {
  std::vector<Rank> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back(r, n);
    ranks.back().comm(kWorld, n, r);
  }
  return ranks;
}

std::vector<TraceFile> files(std::vector<Rank>& ranks) {
  std::vector<TraceFile> out;
  for (Rank& r : ranks) out.push_back(r.take());
  return out;
}

void history(std::vector<Rank>& ranks, int steps) {
  for (int s = 0; s < steps; ++s) {
    for (Rank& r : ranks)
      r.call(kWorld, OpKind::kAllReduce, 1024, RecordState::kCompleted, (s + 1) * kMs);
  }
}

std::string text(const Report& report) {
  std::ostringstream out;
  printText(report, out);
  return out.str();
}

const JobReport& job(const Report& report) {
  EXPECT_EQ(report.jobs.size(), 1u);
  return report.jobs.at(0);
}

std::vector<const Verdict*> primaries(const Report& report) {
  std::vector<const Verdict*> out;
  for (const Verdict& v : job(report).verdicts) {
    if (v.primary && v.kind != VerdictKind::kStraggler) out.push_back(&v);
  }
  return out;
}

// The only primary verdict, when it is of `kind` and blames `culprits`.
const Verdict* onlyPrimary(const Report& report, VerdictKind kind, std::vector<int> culprits) {
  std::vector<const Verdict*> found = primaries(report);
  if (found.size() != 1) {
    ADD_FAILURE() << found.size() << " primary verdicts\n" << text(report);
    return nullptr;
  }
  EXPECT_EQ(found[0]->kind, kind) << text(report);
  EXPECT_EQ(found[0]->culprits, culprits) << text(report);
  return found[0]->kind == kind && found[0]->culprits == culprits ? found[0] : nullptr;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ----- errors -----

TEST(Error, AFailedCallWithOthersWaitingNamesTheRankTheCallAndTheError) {
  auto ranks = world(4);
  history(ranks, 3);
  for (int r = 0; r < 4; ++r) {
    auto& call = ranks[r].call(kWorld, OpKind::kBroadcast, 1024, RecordState::kStarted, 10 * kMs,
                               kF32, kSum, r == 2 ? 7 : 0);
    if (r == 2) {
      call.state = RecordState::kFailed;
      call.result = 4;  // ncclInvalidArgument
    }
  }
  ranks[2].clean();  // it printed the error and exited
  auto traces = files(ranks);
  Report report = analyze(traces, running({0, 1, 3}, 100, 10));
  const Verdict* v = onlyPrimary(report, VerdictKind::kError, {2});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->effect, Effect::kError);
  EXPECT_EQ(v->seq, 4u);
  EXPECT_EQ(v->classes[0].call.note, "returned ncclInvalidArgument (invalid argument)");
  EXPECT_TRUE(contains(v->explanation,
                       "rank 2's Broadcast 1024 x f32 root=7 #4 returned "
                       "ncclInvalidArgument (invalid argument), and it then exited"))
      << v->explanation;
  EXPECT_TRUE(contains(v->explanation, "ranks 0-1,3 wait for its part there")) << v->explanation;
  // The root mismatch the failed call leaves behind is its consequence.
  bool mismatchIsConsequence = false;
  for (const Verdict& other : job(report).verdicts) {
    mismatchIsConsequence |= other.kind == VerdictKind::kMismatch && !other.primary;
  }
  EXPECT_TRUE(mismatchIsConsequence) << text(report);
  EXPECT_TRUE(contains(job(report).summary, "An NCCL call failed and the others hang"))
      << job(report).summary;
}

TEST(Error, AFailedInitOfACommunicatorNobodyCreatedIsAnErrorTooAndAStaleIdSaysSo) {
  for (bool stale : {false, true}) {
    auto ranks = world(4);
    history(ranks, 3);
    uint64_t hash = stale ? kWorld : kB;
    auto& init = ranks[3].call(hash, OpKind::kInit, 4, RecordState::kFailed, 20 * kMs);
    init.seq = 0;
    init.result = 5;  // ncclInvalidUsage
    ranks[3].clean();
    auto traces = files(ranks);
    Report report = analyze(traces, running({0, 1, 2}, 100, 20));
    const Verdict* v = onlyPrimary(report, VerdictKind::kError, {3});
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->comm.hash, hash);
    EXPECT_EQ(v->classes.back().ranks, (std::vector<int>{0, 1, 2})) << text(report);
    EXPECT_TRUE(contains(v->classes.back().call.note, "never finished creating")) << text(report);
    EXPECT_EQ(contains(v->explanation, "a stale id"), stale) << v->explanation;
  }
}

TEST(Error, ACallThatFailedAndWasRetriedIsNoFinding) {
  auto ranks = world(4);
  history(ranks, 3);
  auto& failed = ranks[1].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kFailed, 10 * kMs);
  failed.result = 4;
  for (Rank& r : ranks) r.call(kWorld, OpKind::kAllReduce, 1024, RecordState::kCompleted, 20 * kMs);
  for (Rank& r : ranks) r.clean();
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  for (const Verdict& v : job(report).verdicts)
    EXPECT_NE(v.kind, VerdictKind::kError) << text(report);
}

// ----- a rank that ends normally while the others wait -----

TEST(EarlyExit, ARankThatReturnedFromMainWhileOthersWaitIsDeadAtOnce) {
  auto ranks = world(4);
  history(ranks, 3);
  for (int r : {0, 1, 3}) {
    ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 10 * kMs);
  }
  ranks[2].clean();  // exit code 0, its communicator never destroyed
  auto traces = files(ranks);
  // 100 ms after the last activity: long before the quiet time.
  Report report = analyze(traces, running({0, 1, 3}, 100, 10));
  const Verdict* v = onlyPrimary(report, VerdictKind::kDeadRank, {2});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->seq, 4u);
  EXPECT_TRUE(contains(v->explanation, "ended normally")) << v->explanation;
  EXPECT_DOUBLE_EQ(v->confidence, 1.0) << "a process that ended is no timing guess";
}

TEST(EarlyExit, DestroyAndAbortWhileOthersWaitAreMissingWithTheirOwnWords) {
  for (OpKind teardown : {OpKind::kDestroy, OpKind::kAbort}) {
    auto ranks = world(4);
    history(ranks, 3);
    for (int r : {0, 1, 3}) {
      ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 10 * kMs);
    }
    ranks[2].call(kWorld, teardown, 0, RecordState::kCompleted, 10 * kMs);
    auto traces = files(ranks);
    Report report = analyze(traces, running({0, 1, 2, 3}, 100, 10));
    const Verdict* v = onlyPrimary(report, VerdictKind::kMissing, {2});
    ASSERT_NE(v, nullptr);
    EXPECT_TRUE(contains(v->explanation, teardown == OpKind::kAbort ? "aborted the communicator"
                                                                    : "reached teardown (Destroy)"))
        << v->explanation;
    // Missing, not a call with another op: no "(op differ)" in its headline.
    EXPECT_TRUE(v->fields.empty()) << text(report);
    EXPECT_FALSE(contains(text(report), "differ)")) << text(report);
  }
}

// ----- point-to-point -----

// A ring exchange in a group (sends to rank+1, receives from rank-1) where `wrong` sends to
// rank+2, or `noRecv` posts no receive.
std::vector<TraceFile> ring(int n, int wrong, int noRecv, int smallRecv = -1) {
  auto ranks = world(n);
  history(ranks, 2);
  auto next = [&](int r) { return (r + (r == wrong ? 2 : 1)) % n; };
  auto previous = [&](int r) { return (r + n - 1) % n; };
  for (int r = 0; r < n; ++r) {
    int to = next(r);
    bool received = to != noRecv && previous(to) == r && to != smallRecv;
    ranks[r].call(kWorld, OpKind::kSend, 512,
                  received ? RecordState::kCompleted : RecordState::kStarted, 10 * kMs, kF32, kSum,
                  to);
    if (r == noRecv) continue;
    bool sent = next(previous(r)) == r && r != smallRecv;
    ranks[r].call(kWorld, OpKind::kRecv, r == smallRecv ? 256 : 512,
                  sent ? RecordState::kCompleted : RecordState::kStarted, 10 * kMs, kF32, kSum,
                  previous(r));
  }
  return files(ranks);
}

TEST(P2p, AWrongPeerNamesTheSenderAloneNotItsInnocentNeighbour) {
  auto traces = ring(4, 1, -1);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kUnmatchedP2p, {1});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->classes.size(), 2u) << text(report);  // rank 1's send, rank 2's receive
  EXPECT_TRUE(contains(v->explanation,
                       "rank 1 sends 2048 bytes to rank 3, which never receives "
                       "from it, while rank 2 waits for 2048 bytes from rank 1 "
                       "(did it mean rank 2?)"))
      << v->explanation;
}

// PyTorch's batch_isend_irecv ring (exp22's ring_wrong_peer): in step 1 rank 2 sends to rank 0
// instead of rank 3. Ranks 0 and 1 finish the step (rank 0 gets its data from rank 3) and wait
// in step 2: rank 0 for rank 3, rank 1 for rank 2, both held in step 1. Those two waits named
// rank 3 beside rank 2 ("no one rank is in all of them").
TEST(P2p, AWrongPeerTheOthersWentPastNamesItsSenderAlone) {
  auto ranks = world(4);
  auto exchange = [&](int r, int to, int from, RecordState state, int64_t at) {
    ranks[r].call(kWorld, OpKind::kSend, 32, state, at, kF32, kSum, to).flags |=
        ncclwatch::trace::kRecordInGroup;
    ranks[r].call(kWorld, OpKind::kRecv, 32, state, at, kF32, kSum, from).flags |=
        ncclwatch::trace::kRecordInGroup;
  };
  for (int r = 0; r < 4; ++r) exchange(r, (r + 1) % 4, (r + 3) % 4, RecordState::kCompleted, kMs);
  exchange(0, 1, 3, RecordState::kCompleted, 2 * kMs);
  exchange(1, 2, 0, RecordState::kCompleted, 2 * kMs);
  exchange(2, 0, 1, RecordState::kStarted, 2 * kMs);  // the wrong peer
  exchange(3, 0, 2, RecordState::kStarted, 2 * kMs);  // its send went; its receive waits
  exchange(0, 1, 3, RecordState::kStarted, 3 * kMs);
  exchange(1, 2, 0, RecordState::kStarted, 3 * kMs);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kUnmatchedP2p, {2});
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(contains(v->explanation,
                       "rank 2 sends 128 bytes to rank 0, which never receives "
                       "from it, while rank 3 waits for 128 bytes from rank 2"))
      << v->explanation;
  // The step-2 waits of ranks 0 and 1 stay listed, as held by the ranks they wait for.
  EXPECT_TRUE(contains(text(report), "waits for rank 3, which is held in a transfer of its own"))
      << text(report);
}

TEST(P2p, AMissingReceiveNamesTheRankThatNeverPostedIt) {
  auto traces = ring(4, -1, 3);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kUnmatchedP2p, {3});
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(contains(v->explanation, "rank 3 never posts its side")) << v->explanation;
  // And where rank 3 is instead (here: its own send completed, nothing pending), so that the
  // user need not look it up.
  ASSERT_FALSE(v->classes.empty());
  const RankClass& where = v->classes.back();
  EXPECT_EQ(where.ranks, std::vector<int>{3}) << text(report);
  EXPECT_TRUE(contains(where.call.note, "never posts its side")) << text(report);
  EXPECT_TRUE(contains(where.call.note, "nothing pending")) << text(report);
  // Rank 3 never receives from any rank, so a rank 2 that sends to the wrong peer (a pipeline's
  // last stage sending "to the next stage", exp24's pipewrap) leaves the same calls: both said.
  EXPECT_TRUE(contains(v->explanation,
                       "; or, as rank 3 never receives from any rank, rank 2 "
                       "sends to the wrong peer"))
      << v->explanation;
  EXPECT_EQ(
      v->doubts.front(),
      "which side is wrong the calls cannot tell: rank 3 never takes that side with any rank");
}

// Where rank 3 received from rank 2 in an earlier step, its missing receive is the one reading.
TEST(P2p, AReceiveSkippedAfterEarlierOnesHasOneReading) {
  auto ranks = world(4);
  history(ranks, 2);
  for (int step = 0; step < 2; ++step) {
    for (int r = 0; r < 4; ++r) {
      int to = (r + 1) % 4, from = (r + 3) % 4;
      bool skipped = step == 1 && to == 3;
      ranks[r].call(kWorld, OpKind::kSend, 512,
                    skipped ? RecordState::kStarted : RecordState::kCompleted, 10 * kMs, kF32, kSum,
                    to);
      if (step == 1 && r == 3) continue;
      ranks[r].call(kWorld, OpKind::kRecv, 512, RecordState::kCompleted, 10 * kMs, kF32, kSum,
                    from);
    }
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kUnmatchedP2p, {3});
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_TRUE(contains(v->explanation, "rank 3 never posts its side")) << v->explanation;
  EXPECT_FALSE(contains(v->explanation, "; or, as")) << v->explanation;
}

// exp24's a2a: an all_to_all_single whose rank 1 kept last step's output splits. Its receives
// from ranks 0-3 expect 48, 16, 32, 48 floats where they send 16, 32, 48, 16: uneven splits give
// no usual size to judge by, and the verdict named ranks 0-1,3. Rank 1 is in every pair.
TEST(P2p, ASizeMismatchInEveryPairOfOneRankNamesThatRank) {
  auto ranks = world(4);
  history(ranks, 2);
  const std::vector<uint64_t> sent = {16, 32, 48, 16}, expected = {48, 16, 32, 48};
  for (int r = 0; r < 4; ++r) {
    ranks[r].call(kWorld, OpKind::kSend, sent[r], RecordState::kStarted, 10 * kMs, kF32, kSum, 1);
  }
  for (int from = 0; from < 4; ++from) {
    ranks[1].call(kWorld, OpKind::kRecv, expected[from], RecordState::kStarted, 10 * kMs, kF32,
                  kSum, from);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kUnmatchedP2p, {1});
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_TRUE(contains(v->explanation,
                       "disagree on count in 4 transfers, each with rank 1 on one "
                       "side: its sizes are the likely wrong ones"))
      << v->explanation;
}

TEST(P2p, ASizeMismatchNamesTheSideWhoseSizeNoOtherTransferUses) {
  auto traces = ring(4, -1, -1, 2);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kUnmatchedP2p, {2});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->fields, std::vector<std::string>{"count"});
}

// dist.gather where rank 3 sends its part to rank 1 (its dst) and the others to rank 0: rank 0
// waits for rank 3's part, rank 3's send waits for a receive rank 1 never posts. Ranks 1 and 2
// went on to the next step: its all_reduce waits for ranks 0 and 3, and their next sends to
// rank 0 are queued behind it. Those sends named rank 0 beside rank 3 ("no one rank is in all of
// them: check the peers of ranks 0-1").
TEST(P2p, SendsQueuedBehindAPendingCallAreNotUnmatched) {
  auto ranks = world(4);
  history(ranks, 2);
  for (int from = 1; from < 4; ++from) {
    ranks[0]
        .call(kWorld, OpKind::kRecv, 4, RecordState::kStarted, 10 * kMs, kF32, kSum, from)
        .flags |= ncclwatch::trace::kRecordInGroup;
  }
  for (int r : {1, 2}) {
    ranks[r].call(kWorld, OpKind::kSend, 4, RecordState::kCompleted, 10 * kMs, kF32, kSum, 0);
    ranks[r].call(kWorld, OpKind::kAllReduce, 16, RecordState::kStarted, 11 * kMs);
    ranks[r].call(kWorld, OpKind::kSend, 4, RecordState::kIssued, 12 * kMs, kF32, kSum, 0);
  }
  ranks[3].call(kWorld, OpKind::kSend, 4, RecordState::kStarted, 10 * kMs, kF32, kSum, 1);
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  ASSERT_FALSE(primaries(report).empty()) << text(report);
  const Verdict* v = primaries(report)[0];
  EXPECT_EQ(v->kind, VerdictKind::kUnmatchedP2p) << text(report);
  EXPECT_EQ(v->culprits, std::vector<int>{3}) << text(report);
  EXPECT_EQ(v->classes.size(), 2u) << text(report);  // rank 3's send, rank 0's receive
  // Ranks 1-2's all_reduce waits for ranks 0 and 3, held in the unmatched transfer: its
  // MISSING is a consequence of it, not a second cause.
  EXPECT_EQ(primaries(report).size(), 1u) << text(report);
  for (const Verdict& missing : report.jobs.at(0).verdicts) {
    if (missing.kind != VerdictKind::kMissing) continue;
    EXPECT_NE(missing.explanation.find("a consequence"), std::string::npos) << text(report);
  }
}

// A ring of batch_isend_irecv where rank 2 receives from 3 instead of 1 (PyTorch 2.15: the
// collectives on the current stream, the sends and receives on an internal one). Ranks 0 and 3
// finished the step and went on: their next all_reduce waits for 1 and 2, and their next step's
// sends and receives, on the other stream, look started. Those named ranks 1-2 ("no one rank is
// in all of them"): their peers had not got there, a step behind.
TEST(P2p, SendsToAPeerThatHasNotReachedThemAreNotUnmatched) {
  constexpr uint64_t kCurrent = 1, kInternal = 2;
  auto ranks = world(4);
  history(ranks, 2);
  auto p2p = [&](int r, OpKind op, int peer, RecordState state) {
    ranks[r].call(kWorld, op, 8, state, 10 * kMs, kF32, kSum, peer, kInternal).flags |=
        ncclwatch::trace::kRecordInGroup;
  };
  const RecordState done = RecordState::kCompleted, waits = RecordState::kStarted;
  p2p(0, OpKind::kSend, 1, done);
  p2p(0, OpKind::kRecv, 3, done);
  p2p(1, OpKind::kSend, 2, waits);  // rank 2 never receives from 1
  p2p(1, OpKind::kRecv, 0, done);
  p2p(2, OpKind::kSend, 3, done);
  p2p(2, OpKind::kRecv, 3, waits);  // the bug: from 3, not 1
  p2p(3, OpKind::kSend, 0, done);
  p2p(3, OpKind::kRecv, 2, done);
  for (int r : {0, 3}) {
    ranks[r].call(kWorld, OpKind::kAllReduce, 16, waits, 11 * kMs, kF32, kSum, -1, kCurrent);
    p2p(r, OpKind::kSend, (r + 1) % 4, waits);
    p2p(r, OpKind::kRecv, (r + 3) % 4, waits);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  ASSERT_FALSE(primaries(report).empty()) << text(report);
  const Verdict* v = primaries(report)[0];
  EXPECT_EQ(v->kind, VerdictKind::kUnmatchedP2p) << text(report);
  EXPECT_EQ(v->culprits, std::vector<int>{2}) << text(report);
  EXPECT_EQ(v->classes.size(), 2u) << text(report);  // rank 1's send, rank 2's receive
}

// ----- silent data corruption; substitution against insertion -----

// Every rank makes `calls` AllReduces (sum, completed); rank 0 uses `redop`/`dtype` at call 6,
// or inserts an extra one there.
std::vector<TraceFile> reductions(bool inserted, int redop, int dtype) {
  auto ranks = world(4);
  for (int r = 0; r < 4; ++r) {
    int made = 0;
    for (int k = 1; k <= 10; ++k) {
      bool odd = r == 0 && k == 6;
      if (odd && inserted) {
        ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kCompleted, k * kMs, dtype,
                      redop);
        ++made;
      }
      bool last = inserted && r == 0 && k == 10;  // its extra call leaves its last one alone
      ranks[r].call(kWorld, OpKind::kAllReduce, 1024,
                    last ? RecordState::kStarted : RecordState::kCompleted, k * kMs,
                    odd && !inserted ? dtype : kF32, odd && !inserted ? redop : kSum);
      ++made;
    }
    ranks[r].clean();
  }
  return files(ranks);
}

TEST(Corruption, ARedopSubstitutedWhereEverythingElseAlignsIsASubstitutionNotAnInsertion) {
  auto traces = reductions(false, kMax, kF32);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {0});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->seq, 6u);
  EXPECT_EQ(v->fields, std::vector<std::string>{"redop"});
  EXPECT_EQ(v->effect, Effect::kSilentDataCorruption);
  EXPECT_FALSE(contains(v->explanation, "extra")) << v->explanation;
  EXPECT_TRUE(contains(v->explanation, "called AllReduce 1024 x f32 max where")) << v->explanation;
  EXPECT_TRUE(contains(v->explanation, "silent data corruption")) << v->explanation;
  EXPECT_TRUE(contains(job(report).summary, "Nothing hung, but results are wrong"))
      << job(report).summary;
  EXPECT_FALSE(contains(job(report).summary, "It hung")) << job(report).summary;
  EXPECT_FALSE(contains(v->explanation, "differs again")) << v->explanation;  // once only
}

// A clip statistic reduced with MAX on rank 1 and SUM on the others, every step: nothing hangs,
// the job goes on, and each step is hurt, not only the first one the verdict is about.
TEST(Corruption, ASubstitutionThatRepeatsEachStepSaysSo) {
  auto ranks = world(4);
  for (int r = 0; r < 4; ++r) {
    for (int step = 0; step < 5; ++step) {
      ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kCompleted,
                    (2 * step + 1) * kMs);
      ranks[r].call(kWorld, OpKind::kAllReduce, 1, RecordState::kCompleted, (2 * step + 2) * kMs,
                    kF32, r == 1 && step > 0 ? kMax : kSum);
    }
    ranks[r].clean();
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {1});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->seq, 4u);
  EXPECT_TRUE(contains(v->explanation, "it differs again at 3 later calls (#6, #8, #10)"))
      << v->explanation;
}

TEST(Corruption, ADtypeOfEqualBytesIsSilentCorruptionAndOfOtherBytesAHang) {
  auto equal = reductions(false, kSum, kI32);
  Report report = analyze(equal, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {0});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->effect, Effect::kSilentDataCorruption);
  auto wider = reductions(false, kSum, 8);  // f64: twice the bytes
  Report hang = analyze(wider, ended());
  const Verdict* w = onlyPrimary(hang, VerdictKind::kMismatch, {0});
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->effect, Effect::kHang);
}

TEST(Corruption, AnExtraCallThatShiftsEverythingAfterIsAnInsertion) {
  auto traces = reductions(true, kMax, kF32);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {0});
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(contains(v->explanation, "issued an extra AllReduce 1024 x f32 max"))
      << v->explanation;
}

// exp22's thread_race: a metrics thread all-reduces a loss scalar while the main thread
// all-reduces gradients, on the one communicator; rank 3's metrics thread runs late, so its two
// calls come in the other order. `threads`: whether the two calls came from two threads.
Report swappedOnRankThree(bool threads) {
  auto ranks = world(4);
  history(ranks, 2);
  for (int r = 0; r < 4; ++r) {
    bool swapped = r == 3;
    int32_t mainThread = 1000 + r, metricsThread = threads ? 2000 + r : mainThread;
    for (int c = 0; c < 2; ++c) {
      bool metrics = (c == 0) != swapped;
      ranks[r]
          .call(kWorld, OpKind::kAllReduce, metrics ? 1 : 256,
                c == 0 ? RecordState::kStarted : RecordState::kIssued, (10 + c) * kMs)
          .threadId = metrics ? metricsThread : mainThread;
    }
  }
  auto traces = files(ranks);
  return analyze(traces, ended());
}

TEST(Order, TwoCallsOfTwoThreadsInTheOtherOrderSayTheirOrderIsTheTimings) {
  Report report = swappedOnRankThree(true);
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {3});
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(contains(v->explanation, "in the opposite order of ranks 0-2")) << v->explanation;
  EXPECT_TRUE(contains(v->explanation,
                       "the two come from two threads of its process (threads "
                       "1003 and 2003)"))
      << v->explanation;
  report = swappedOnRankThree(false);
  v = onlyPrimary(report, VerdictKind::kMismatch, {3});
  ASSERT_NE(v, nullptr);
  EXPECT_FALSE(contains(v->explanation, "threads")) << v->explanation;
}

// ----- 2-rank communicators -----

TEST(TwoRanks, TheShiftNamesTheRankThatSkipped) {
  auto ranks = world(2);
  const OpKind cycle[3] = {OpKind::kAllReduce, OpKind::kBroadcast, OpKind::kAllGather};
  for (int r = 0; r < 2; ++r) {
    int k = 0;
    for (int round = 0; round < 3; ++round) {
      for (int c = 0; c < 3; ++c) {
        if (round == 1 && c == 1 && r == 1) continue;  // rank 1 skips a Broadcast
        bool done = round == 0 || (round == 1 && c == 0);
        auto& call = ranks[r].call(kWorld, cycle[c], 256,
                                   done ? RecordState::kCompleted : RecordState::kIssued, ++k * kMs,
                                   kF32, kSum, cycle[c] == OpKind::kBroadcast ? 0 : -1);
        call.callSite = 0x1000 * (r + 1) + 0x10 * c;  // one line per collective, per process base
      }
    }
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {1});
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(contains(v->explanation, "rank 1 skipped Broadcast")) << v->explanation;
}

TEST(TwoRanks, WithoutAShiftItSaysItCannotDecide) {
  auto ranks = world(2);
  history(ranks, 3);
  for (int r = 0; r < 2; ++r) {
    ranks[r].call(kWorld, OpKind::kAllReduce, r == 1 ? 2048 : 1024, RecordState::kStarted,
                  10 * kMs);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {0, 1});
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(contains(v->explanation, "cannot be decided")) << v->explanation;
  EXPECT_TRUE(contains(v->explanation, "neither skipped a call")) << v->explanation;
}

// Half the ranks ahead of the others: `ahead` make `extra` calls on the world (the first started,
// the rest issued), then the step's all-reduce of 1024 values; the others that all-reduce alone.
struct Extra {
  OpKind op;
  uint64_t count;
  int dtype = kF32;
  int root = -1;
};
Report analyzeHalfAhead(std::vector<Rank>& ranks, std::initializer_list<int> ahead,
                        std::initializer_list<Extra> extra) {
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    int64_t at = 10;
    if (std::find(ahead.begin(), ahead.end(), r) != ahead.end()) {
      for (const Extra& e : extra) {
        ranks[r].call(kWorld, e.op, e.count,
                      at == 10 ? RecordState::kStarted : RecordState::kIssued, at * kMs, e.dtype,
                      kSum, e.root);
        ++at;
      }
    }
    ranks[r].call(kWorld, OpKind::kAllReduce, 1024,
                  at == 10 ? RecordState::kStarted : RecordState::kIssued, at * kMs);
  }
  auto traces = files(ranks);
  return analyze(traces, ended());
}

// Ranks 1 and 3 all-reduce 4 values (then the step's 1024), ranks 0 and 2 only the 1024.
Report analyzeBranchOnHalf(std::vector<Rank>& ranks) {
  return analyzeHalfAhead(ranks, {1, 3}, {{OpKind::kAllReduce, 4}});
}

// Two ranks against two: ranks 1 and 3 took `if loss > x: all_reduce(stats)` (a call no rank
// made before), ranks 0 and 2 went on to the step's usual all_reduce. Read as "ranks 0,2 skipped
// it" (the same records, seen from the other side) it blamed the ranks that did nothing new.
TEST(Ties, HalfTheRanksOnABranchWithANewCallMadeTheExtraCall) {
  auto ranks = world(4);
  history(ranks, 3);
  Report report = analyzeBranchOnHalf(ranks);
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {1, 3});
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(contains(v->explanation, "issued an extra AllReduce 4")) << v->explanation;
  // No majority: said, and not "high".
  EXPECT_LT(v->confidence, 1.0);
  ASSERT_FALSE(v->doubts.empty());
  EXPECT_TRUE(contains(v->doubts[0], "no majority")) << v->doubts[0];
}

// The same shape where the call is one every rank made each step before: ranks 0 and 2
// skipped it.
TEST(Ties, HalfTheRanksThatLeaveOutARegularCallSkippedIt) {
  auto ranks = world(4);
  for (int step = 0; step < 2; ++step) {
    for (Rank& r : ranks) {
      r.call(kWorld, OpKind::kAllReduce, 4, RecordState::kCompleted, (2 * step + 1) * kMs);
      r.call(kWorld, OpKind::kAllReduce, 1024, RecordState::kCompleted, (2 * step + 2) * kMs);
    }
  }
  Report report = analyzeBranchOnHalf(ranks);
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {0, 2});
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(contains(v->explanation, "ranks 0,2 skipped AllReduce 4")) << v->explanation;
}

// The same, as the live collector behind relays sees it: the relays folded the settled calls
// (AllReduce 4 among them), so no window holds them; "no rank made it before" would be a guess,
// and the old reading stands (scenarios_corpus_relay's two_rank_skip flaked so: the rank that
// skipped named as the other one's extra call).
TEST(Ties, WithoutTheWholeHistoryATieIsReadAsASkip) {
  auto ranks = world(4);
  for (Rank& r : ranks) r.file().foldedLatestNs = kMs;  // calls before these were folded
  Report report = analyzeBranchOnHalf(ranks);
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {0, 2});
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(contains(v->explanation, "ranks 0,2 skipped AllReduce 4")) << v->explanation;
}

// exp25's bcast_obj_subset: ranks 0 and 1 call dist.broadcast_object_list() (two NCCL
// broadcasts: the size, then the data) where ranks 2 and 3 go on to the step's all_reduce. The
// tie rule looked one call ahead only: "cannot be decided", ranks 0-3 named.
Report analyzeTwoCallsOnHalf(std::vector<Rank>& ranks) {
  return analyzeHalfAhead(ranks, {0, 1},
                          {{OpKind::kBroadcast, 1, kI64, 0}, {OpKind::kBroadcast, 64, kI64, 0}});
}

TEST(Ties, HalfTheRanksTwoCallsAheadWithNewCallsMadeThem) {
  auto ranks = world(4);
  history(ranks, 3);
  Report report = analyzeTwoCallsOnHalf(ranks);
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {0, 1});
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_TRUE(contains(v->explanation, "ranks 0-1 made 2 calls from #4 on (the first Broadcast"))
      << v->explanation;
  ASSERT_FALSE(v->doubts.empty());
  EXPECT_TRUE(contains(v->doubts[0], "no majority")) << v->doubts[0];
}

// The same where every rank made those broadcasts each step before: ranks 2 and 3 skipped them.
TEST(Ties, HalfTheRanksTwoCallsBehindARegularPairSkippedIt) {
  auto ranks = world(4);
  for (int step = 0; step < 2; ++step) {
    for (Rank& r : ranks) {
      r.call(kWorld, OpKind::kBroadcast, 1, RecordState::kCompleted, (3 * step + 1) * kMs, kI64,
             kSum, 0);
      r.call(kWorld, OpKind::kBroadcast, 64, RecordState::kCompleted, (3 * step + 2) * kMs, kI64,
             kSum, 0);
      r.call(kWorld, OpKind::kAllReduce, 1024, RecordState::kCompleted, (3 * step + 3) * kMs);
    }
  }
  Report report = analyzeTwoCallsOnHalf(ranks);
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {2, 3});
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_TRUE(contains(v->explanation, "ranks 2-3 skipped them")) << v->explanation;
}

// exp26's reduce_dst: each rank passes itself as dist.reduce's dst. No two ranks agree, so there
// is no majority to quote: it said "ranks 1-3 called Reduce ... root=3 where rank 0 called ...
// root=0", as if three ranks had passed 3.
TEST(Mismatch, NoTwoRanksAgreeingNamesEachAndTheOwnRankRoot) {
  auto ranks = world(4);
  history(ranks, 2);
  for (int r = 0; r < 4; ++r) {
    ranks[r].call(kWorld, OpKind::kReduce, 4, RecordState::kStarted, 10 * kMs, kF32, kSum, r);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {0, 1, 2, 3});
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_TRUE(contains(v->explanation,
                       "no two ranks agree at #3 (root differ): rank 0 Reduce 4 x "
                       "f32 sum root=0, rank 1 Reduce"))
      << v->explanation;
  EXPECT_TRUE(contains(v->explanation, "each rank passes itself as the root")) << v->explanation;
}

// ----- confidence and evidence gaps -----

TEST(Confidence, AVerdictOnTimingAloneIsMediumAndSaysWhy) {
  auto ranks = world(4);
  history(ranks, 3);
  for (int r : {0, 1, 2}) {
    ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 10 * kMs);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, running({0, 1, 2, 3}, 4000, 10));  // rank 3 alive, silent
  const Verdict* v = primaries(report).empty() ? nullptr : primaries(report)[0];
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_LT(v->confidence, 0.9);
  EXPECT_STREQ(confidenceLevel(v->confidence), "medium");
  ASSERT_FALSE(v->doubts.empty());
  EXPECT_TRUE(contains(v->doubts[0], "timing alone")) << v->doubts[0];
  EXPECT_TRUE(contains(text(report), "confidence medium")) << text(report);
  EXPECT_TRUE(contains(verdictJson(*v, "j", 0), "\"confidence_level\":\"medium\""));
  // The headline says the rank is alive: DEAD_RANK alone reads as a crash.
  EXPECT_TRUE(contains(text(report), "DEAD_RANK (alive but silent) on comm")) << text(report);
}

// exp25's sigstop: a rank stopped by SIGSTOP (or a debugger) is alive, and nothing in it runs,
// its watchdog included: said as such, with the pid to resume, where the collector's host sees
// its state. Here a forked child maps a file named as rank 3's trace and stops itself.
TEST(DeadRank, AStoppedRankIsSaidStopped) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string path = "/tmp/nw-stopped-" + std::to_string(getpid()) + ".ncclwatch";
  { std::ofstream(path) << std::string(4096, 'x'); }
  pid_t child = fork();
  if (child == 0) {
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0 || mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED) _exit(1);
    raise(SIGSTOP);
    _exit(0);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  auto ranks = world(4);
  history(ranks, 3);
  for (int r : {0, 1, 2}) {
    ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 10 * kMs);
  }
  auto traces = files(ranks);
  traces[3].path = path;
  traces[3].header.pid = child;
  std::strncpy(traces[3].header.host, host, sizeof traces[3].header.host - 1);
  EXPECT_TRUE(stoppedHere(traces[3]));
  Report report = analyze(traces, running({0, 1, 2, 3}, 4000, 10));
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  std::remove(path.c_str());
  const Verdict* v = onlyPrimary(report, VerdictKind::kDeadRank, {3});
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_TRUE(contains(v->explanation, "rank 3 (pid " + std::to_string(child) +
                                           ") is stopped (state T: SIGSTOP, SIGTSTP or a "
                                           "debugger)"))
      << v->explanation;
  EXPECT_TRUE(contains(v->explanation, "`kill -CONT " + std::to_string(child) + "`"))
      << v->explanation;
  EXPECT_FALSE(stoppedHere(traces[3]));  // gone
}

// A rank whose last records never reached the collector (stopped, or killed before its
// watchdog's last poll went out) reads as behind a call the others completed with it: they wait
// in the next one, and the verdict says that one (exp25's sigstop said "#2", which they had
// completed).
TEST(DeadRank, TheCallTheOthersWaitInIsPastTheOnesTheyCompletedWithIt) {
  auto ranks = world(4);
  history(ranks, 3);
  for (int r : {0, 1, 2}) {
    ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kCompleted, 10 * kMs);
    ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 11 * kMs);
  }
  auto traces = files(ranks);
  Report report = analyze(traces, running({0, 1, 2, 3}, 4000, 11));  // rank 3 alive, silent
  const Verdict* v = onlyPrimary(report, VerdictKind::kDeadRank, {3});
  ASSERT_NE(v, nullptr) << text(report);
  EXPECT_EQ(v->seq, 5u) << text(report);
  EXPECT_TRUE(contains(v->explanation, "wait for it in #5")) << v->explanation;
  EXPECT_TRUE(contains(v->explanation,
                       "its calls through #4 went through (the others completed "
                       "them with it), but its records of them never reached "
                       "ncclwatch"))
      << v->explanation;
}

TEST(Confidence, LostRecordsUntracedRanksAndUntrackedCallsLowerItAndTheSummarySaysWhere) {
  auto ranks = world(4);
  history(ranks, 3);
  for (int r : {0, 1, 2}) {
    auto& call = ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kIssued, 10 * kMs,
                               kF32, r == 1 ? kMax : kSum);
    call.flags |= ncclwatch::trace::kRecordCaptured;
  }
  ranks[0].file().lostRecords = 7;
  auto traces = files(ranks);
  traces.pop_back();  // rank 3 left no trace
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {1});
  ASSERT_NE(v, nullptr);
  EXPECT_STREQ(confidenceLevel(v->confidence), "low") << v->confidence;
  std::string doubts;
  for (const std::string& d : v->doubts) doubts += d + "\n";
  EXPECT_TRUE(contains(doubts,
                       "1 of the communicator's 4 ranks has no trace (rank 3): what it did "
                       "is unknown"))
      << doubts;
  EXPECT_TRUE(contains(doubts, "7 records of rank 0 were lost")) << doubts;
  EXPECT_TRUE(contains(doubts, "completion was not tracked")) << doubts;
  const std::string& summary = job(report).summary;
  EXPECT_TRUE(contains(summary, "Evidence is incomplete: rank 3 left no trace; rank 0 lost 7"))
      << summary;
}

// ----- ncclCommShrink -----

TEST(Shrink, TheExcludedRankDestroyingTheParentIsNoDivergence) {
  auto ranks = world(4);
  history(ranks, 3);
  for (int r = 0; r < 3; ++r) {
    ncclwatch::trace::CommInfo info{};
    info.commHash = kShrunk;
    info.parentHash = kWorld;
    info.nranks = 3;
    info.rank = r;
    info.kind = static_cast<uint8_t>(OpKind::kShrink);
    ranks[r].file().comms.push_back(info);
    ranks[r].call(kWorld, OpKind::kShrink, 0, RecordState::kCompleted, 10 * kMs);
    for (int k = 0; k < 3; ++k) {
      ranks[r].call(kShrunk, OpKind::kAllReduce, 1024, RecordState::kCompleted, (11 + k) * kMs);
    }
    ranks[r].call(kWorld, OpKind::kDestroy, 0, RecordState::kCompleted, 20 * kMs);
  }
  ranks[3].call(kWorld, OpKind::kDestroy, 0, RecordState::kCompleted, 10 * kMs);
  for (Rank& r : ranks) r.clean();
  auto traces = files(ranks);
  Report report = analyze(traces, ended());
  EXPECT_TRUE(primaries(report).empty()) << text(report);
}

// ----- a hang an abort ended -----

// Each rank's abort of the world at `abortMs + rank`, ending its own pending calls there (what
// `ncclwatch run --abort`, NCCLWATCH_ON_HANG=abort and PyTorch's watchdog at its timeout do): the
// calls it ended read "aborted", completed at the abort.
void abortEach(std::vector<Rank>& ranks, int64_t abortMs) {
  for (Rank& r : ranks) {
    int64_t at = (abortMs + r.file().header.rank) * kMs;
    for (auto& record : r.file().records) {
      if (record.state != RecordState::kStarted && record.state != RecordState::kIssued) continue;
      record.state = RecordState::kAborted;
      record.completeNs = at + kMs;
    }
    r.call(kWorld, OpKind::kAbort, 0, RecordState::kCompleted, at);
  }
}

// broadcast_object_list on a rank whose list is longer (its sizes tensor has 2 elements): the
// root goes on to broadcast the object's bytes, the others wait in the sizes, and `run --abort`
// ends it. The aborts then come at another call on the root than on the others; read as they
// were left, the root's abort looked like a call the others never made ("rank 1 is gone while
// the others wait for it in #5", an init hang).
TEST(AfterAbort, TheHangAnAbortEndedIsReadAsItWasBeforeTheAbort) {
  auto ranks = world(4);
  history(ranks, 2);
  for (int r = 0; r < 4; ++r) {
    ranks[r].call(kWorld, OpKind::kBroadcast, r == 2 ? 2 : 1, RecordState::kStarted, 10 * kMs, kF32,
                  kSum, 0);
  }
  ranks[0].call(kWorld, OpKind::kBroadcast, 29, RecordState::kIssued, 11 * kMs, kF32, kSum, 0);
  abortEach(ranks, 600);
  auto traces = files(ranks);
  std::vector<RolledBack> rolled = rollBackToBeforeAborts(traces);
  ASSERT_EQ(rolled.size(), 1u);
  EXPECT_EQ(rolled[0].rank, 0);
  EXPECT_EQ(rolled[0].comm, kWorld);
  EXPECT_EQ(rolled[0].left, 4u);    // the four aborts
  EXPECT_EQ(rolled[0].undone, 5u);  // the five calls they ended
  EXPECT_TRUE(contains(rolledBackText(rolled[0]), "just before rank 0 aborted comm 0000\u2026"))
      << rolledBackText(rolled[0]);
  EXPECT_TRUE(contains(rolledBackText(rolled[0]),
                       "so 5 calls that finished after it are read as "
                       "pending and 4 calls issued after it are left"))
      << rolledBackText(rolled[0]);
  RolledBack one = rolled[0];
  one.undone = one.left = 1;
  EXPECT_TRUE(contains(rolledBackText(one),
                       "so 1 call that finished after it is read as pending "
                       "and 1 call issued after it is left out"))
      << rolledBackText(one);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kMismatch, {2});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->seq, 3u);
  EXPECT_EQ(v->classes[0].call.state, RecordState::kStarted) << text(report);
  EXPECT_EQ(job(report).verdicts.size(), 1u) << text(report);
}

// Rank 0's send to rank 3, which never posts its receive, and every rank's next all-reduce,
// all aborted by PyTorch's watchdog at its timeout (15 s).
std::vector<TraceFile> unmatchedSendAbortedByATimeout() {
  auto ranks = world(4);
  history(ranks, 2);
  ranks[0].call(kWorld, OpKind::kSend, 16, RecordState::kStarted, 10 * kMs, kF32, kSum, 3);
  for (int r = 0; r < 4; ++r) {
    ranks[r].call(kWorld, OpKind::kAllReduce, 16, RecordState::kIssued, 11 * kMs);
  }
  abortEach(ranks, 15'000);
  return files(ranks);
}

// PyTorch's watchdog at its timeout aborts every communicator with a call pending, on every
// rank: read as they were left, nothing was pending any more and no verdict explained the job.
TEST(AfterAbort, AnUnmatchedSendThatATimeoutAbortEndedIsStillUnmatched) {
  auto traces = unmatchedSendAbortedByATimeout();
  ASSERT_EQ(rollBackToBeforeAborts(traces).size(), 1u);
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kUnmatchedP2p, {3});
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(contains(v->explanation, "rank 3 never posts its side")) << v->explanation;
}

// The ranks went on to exit cleanly after the abort (a raised error caught, exit 0): read as of
// before the abort the job hung all the same (it read "No hang and no mismatch found").
TEST(AfterAbort, AHangIsAHangWhenEveryRankExitedCleanlyAfterTheAbort) {
  auto traces = unmatchedSendAbortedByATimeout();
  for (auto& trace : traces) trace.header.cleanShutdown = 1;
  ASSERT_EQ(rollBackToBeforeAborts(traces).size(), 1u);
  Report report = analyze(traces, ended());
  ASSERT_NE(onlyPrimary(report, VerdictKind::kUnmatchedP2p, {3}), nullptr);
}

// A call on another communicator that completed only because the abort freed the stream it
// waited behind is read as pending again; a split that failed because its parent was aborted
// under it, as still in flight.
TEST(AfterAbort, WhatTheAbortFreedOrBrokeIsUndoneToo) {
  auto ranks = world(2);
  history(ranks, 1);
  auto& other = ranks[0].call(kB, OpKind::kAllReduce, 8, RecordState::kCompleted, 10 * kMs);
  other.completeNs = 700 * kMs;  // after the abort below
  auto& split = ranks[1].call(kWorld, OpKind::kSplit, 0, RecordState::kFailed, 10 * kMs);
  split.result = 5;
  split.completeNs = 650 * kMs;
  ranks[0].call(kWorld, OpKind::kAllReduce, 8, RecordState::kAborted, 10 * kMs).completeNs =
      650 * kMs;
  ranks[0].call(kWorld, OpKind::kAbort, 0, RecordState::kCompleted, 600 * kMs);
  auto traces = files(ranks);
  ASSERT_EQ(rollBackToBeforeAborts(traces).size(), 1u);
  EXPECT_EQ(traces[0].records[1].state, RecordState::kStarted);  // started at 11 ms
  EXPECT_EQ(traces[0].records[1].completeNs, 0);
  EXPECT_EQ(traces[0].records[2].state, RecordState::kIssued);  // aborted before it started
  EXPECT_EQ(traces[1].records[1].state, RecordState::kIssued);
  EXPECT_EQ(traces[1].records[1].result, 0);
  EXPECT_EQ(traces[0].records.size(), 3u);  // the abort left out
}

// A rank that aborts a communicator it has nothing pending on, while the others wait, is the
// local-abort bug itself (EarlyExit above): nothing is rolled back. Neither is a failure NCCL
// gave at the call (no time after the abort: traces written before failures were stamped).
TEST(AfterAbort, AnAbortThatEndedNothingOfItsOwnIsLeftAsItIs) {
  auto ranks = world(4);
  history(ranks, 3);
  for (int r : {0, 1, 3}) {
    ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 10 * kMs);
  }
  auto& refused = ranks[2].call(kWorld, OpKind::kBroadcast, 8, RecordState::kFailed, 9 * kMs);
  refused.result = 4;
  refused.completeNs = 0;
  ranks[2].call(kWorld, OpKind::kAbort, 0, RecordState::kCompleted, 10 * kMs);
  auto traces = files(ranks);
  EXPECT_TRUE(rollBackToBeforeAborts(traces).empty());
  EXPECT_EQ(traces[2].records.size(), 5u);
}

// The same shape made by `run --abort`: rank 2 is stuck outside NCCL (a Python lock) with
// nothing pending, and ncclwatch aborts every rank's world, rank 2's first. Its abort is
// flagged as ncclwatch's: the job is read as before it, and nobody is told that rank 2 aborted
// the communicator (the program never did).
TEST(AfterAbort, NcclwatchsOwnAbortOfARankWithNothingPendingEndedTheHang) {
  auto ranks = world(4);
  history(ranks, 3);
  for (int r : {0, 1, 3}) {
    ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 10 * kMs);
  }
  for (Rank& r : ranks) {
    int64_t at = (600 + (r.file().header.rank + 2) % 4) * kMs;  // rank 2's first
    for (auto& record : r.file().records) {
      if (record.state != RecordState::kStarted) continue;
      record.state = RecordState::kAborted;
      record.completeNs = at + kMs;
    }
    r.call(kWorld, OpKind::kAbort, 0, RecordState::kCompleted, at).flags |=
        ncclwatch::trace::kRecordByNcclwatch;
  }
  auto traces = files(ranks);
  // As the live collector reads it (no roll-back): the abort is not the application's.
  std::vector<TraceFile> asLeft = traces;
  Report live = analyze(asLeft, ended());
  for (const Verdict& v : job(live).verdicts) {
    EXPECT_FALSE(v.primary && contains(v.explanation, "aborted the communicator")) << text(live);
    if (contains(v.explanation, "aborted the communicator")) {
      EXPECT_TRUE(contains(v.explanation, "ncclwatch aborted the communicator on rank 2"))
          << text(live);
    }
  }
  std::vector<RolledBack> rolled = rollBackToBeforeAborts(traces);
  ASSERT_EQ(rolled.size(), 1u);
  EXPECT_EQ(rolled[0].rank, 2);
  EXPECT_TRUE(contains(rolledBackText(rolled[0]), "just before ncclwatch aborted comm"))
      << rolledBackText(rolled[0]);
  Report report = analyze(traces, ended());
  ASSERT_FALSE(primaries(report).empty()) << text(report);
  EXPECT_EQ(primaries(report)[0]->culprits, std::vector<int>{2}) << text(report);
  EXPECT_FALSE(contains(text(report), "aborted the communicator")) << text(report);
  // Running then (its own abort came after): alive but silent, as the live collector said.
  EXPECT_TRUE(contains(primaries(report)[0]->explanation, "rank 2 is alive but stopped issuing"))
      << text(report);
}

// Rank 2 aborts the world right after issuing its last collectives, which the others complete
// (tests/scenarios' abort_comm): the calls its abort ended were no hang, and the abort is the
// bug; read as before it, rank 2 looked gone while the others waited.
TEST(AfterAbort, AnAbortOfCallsThePeersCompletedIsLeftAsItIs) {
  auto ranks = world(4);
  history(ranks, 3);
  for (auto& record : ranks[2].file().records) {
    record.state = RecordState::kAborted;
    record.startNs = 0;
    record.completeNs = 11 * kMs;
  }
  ranks[2].call(kWorld, OpKind::kAbort, 0, RecordState::kCompleted, 10 * kMs);
  for (int r : {0, 1, 3}) {
    ranks[r].call(kWorld, OpKind::kAllReduce, 1024, RecordState::kStarted, 12 * kMs);
  }
  auto traces = files(ranks);
  EXPECT_TRUE(rollBackToBeforeAborts(traces).empty());
  Report report = analyze(traces, ended());
  const Verdict* v = onlyPrimary(report, VerdictKind::kMissing, {2});
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(contains(v->explanation, "aborted the communicator")) << v->explanation;
}

}  // namespace
