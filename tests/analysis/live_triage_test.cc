// The collector's triage: it must flag two fingerprints at one (comm, collective ordinal) —
// whatever p2p calls shifted the ranks' seqs — and stay silent while ranks agree, however far
// apart they report; its memory must not grow with the job's length.
#include "analysis/live_triage.h"

#include <gtest/gtest.h>

#include <vector>

#include "trace/fingerprint.h"

namespace {

using ncclwatch::analysis::LiveTriage;
using ncclwatch::trace::CallRecord;
using ncclwatch::trace::OpKind;

constexpr uint64_t kWorld = 0xabcull;

ncclwatch::trace::CommInfo comm(uint64_t hash, int nranks) {
  ncclwatch::trace::CommInfo info{};
  info.commHash = hash;
  info.nranks = nranks;
  return info;
}

CallRecord collective(uint64_t ordinal, uint64_t count, OpKind op = OpKind::kAllReduce) {
  CallRecord record{};
  record.commHash = kWorld;
  record.op = op;
  record.ncclSeqNumber = ordinal;
  record.seq = ordinal + 1;
  record.count = count;
  record.fingerprint = ncclwatch::trace::fingerprint({op, count, 7, 0, -1});
  return record;
}

TEST(LiveTriage, RanksThatAgreeRaiseNothingAndLeaveNothingOpen) {
  LiveTriage triage;
  triage.addComm(comm(kWorld, 3));
  // Rank 0 runs 50 calls ahead before the others report: only agreement, in any order.
  for (uint64_t ordinal = 0; ordinal < 50; ++ordinal) {
    EXPECT_FALSE(triage.observe(collective(ordinal, 1024 + ordinal), 100 + ordinal));
  }
  EXPECT_EQ(triage.openOrdinals(), 50u);
  for (int rank = 1; rank < 3; ++rank) {
    for (uint64_t ordinal = 0; ordinal < 50; ++ordinal) {
      EXPECT_FALSE(triage.observe(collective(ordinal, 1024 + ordinal), 10));
    }
  }
  EXPECT_EQ(triage.openOrdinals(), 0u);
  EXPECT_EQ(triage.lastActivityNs(), 149);
}

// Ranks report in any order: ahead, behind, backwards, interleaved with another communicator,
// as their frames come. Each ordinal is judged on its own all the same: one divergence, at the
// ordinal where it is, and nothing left open once all have spoken.
TEST(LiveTriage, OrdinalsInAnyOrderAreEachJudgedOnTheirOwn) {
  constexpr uint64_t kTensorParallel = 0x7e;
  constexpr uint64_t kCalls = 40, kOdd = 23;  // rank 2 gets ordinal 23's count wrong
  LiveTriage triage;
  triage.addComm(comm(kWorld, 3));
  triage.addComm(comm(kTensorParallel, 3));
  auto count = [](int rank, uint64_t ordinal) {
    return rank == 2 && ordinal == kOdd ? uint64_t{7} : 1024 + ordinal;
  };
  auto onTensorParallel = [](uint64_t ordinal) {
    CallRecord record = collective(ordinal, 64);
    record.commHash = kTensorParallel;
    return record;
  };
  std::vector<uint64_t> flagged;
  bool completedWhenFlagged = false;
  auto observe = [&](int rank, uint64_t ordinal) {
    if (triage.observe(collective(ordinal, count(rank, ordinal)), 1)) {
      flagged.push_back(ordinal);
      completedWhenFlagged = triage.lastCompletedOrdinal();
    }
    EXPECT_FALSE(triage.observe(onTensorParallel(ordinal), 1));  // its own ordinals, agreeing
  };
  for (uint64_t ordinal = 0; ordinal < kCalls; ++ordinal) observe(0, ordinal);     // ahead
  for (uint64_t ordinal = kCalls; ordinal-- > 0;) observe(1, ordinal);             // backwards
  for (uint64_t ordinal = 0; ordinal < kCalls; ordinal += 2) observe(2, ordinal);  // evens,
  for (uint64_t ordinal = 1; ordinal < kCalls; ordinal += 2) observe(2, ordinal);  // then odds
  // Rank 2's record, the last of its ordinal, diverges: flagged once, the ordinal complete.
  EXPECT_EQ(flagged, (std::vector<uint64_t>{kOdd}));
  EXPECT_TRUE(completedWhenFlagged);
  EXPECT_EQ(triage.openOrdinals(), 0u);
}

TEST(LiveTriage, ADifferentCountAtTheSameOrdinalIsFlagged) {
  LiveTriage triage;
  triage.addComm(comm(kWorld, 4));
  EXPECT_FALSE(triage.observe(collective(0, 1024), 1));
  EXPECT_FALSE(triage.observe(collective(0, 1024), 1));
  EXPECT_TRUE(triage.observe(collective(0, 512), 1));
  EXPECT_FALSE(triage.lastCompletedOrdinal());  // a member is still to report: wait for it
  // The last member agrees with the first, and completes a divergent ordinal: flagged again
  // (every member has spoken: the mismatch can be said at once), and the ordinal is closed.
  EXPECT_TRUE(triage.observe(collective(0, 1024), 1));
  EXPECT_TRUE(triage.lastCompletedOrdinal());
  EXPECT_EQ(triage.openOrdinals(), 0u);
  // An ordinal where every member agreed is never flagged, its last record included.
  for (int member = 0; member < 4; ++member) EXPECT_FALSE(triage.observe(collective(1, 64), 2));
}

// After a divergence, each member that reaches the same ordinal (agreeing or not) says the
// mismatch's classes are still filling, until the last one completes it; a member at another
// ordinal does not.
TEST(LiveTriage, MembersJoiningADivergedOrdinalAreSaid) {
  LiveTriage triage;
  triage.addComm(comm(kWorld, 5));
  EXPECT_FALSE(triage.observe(collective(0, 1024), 1));
  EXPECT_FALSE(triage.lastJoinedDivergence());  // nothing diverged yet
  EXPECT_TRUE(triage.observe(collective(0, 512), 1));
  EXPECT_TRUE(triage.lastJoinedDivergence());
  EXPECT_FALSE(triage.observe(collective(1, 64), 1));
  EXPECT_FALSE(triage.lastJoinedDivergence());  // another ordinal
  EXPECT_FALSE(triage.observe(collective(0, 1024), 1));
  EXPECT_TRUE(triage.lastJoinedDivergence());  // agrees with the first, but joins the divergence
  EXPECT_FALSE(triage.observe(collective(0, 1024), 1));
  EXPECT_TRUE(triage.lastJoinedDivergence());
  EXPECT_TRUE(triage.observe(collective(0, 1024), 1));  // the last member
  EXPECT_TRUE(triage.lastCompletedOrdinal());
  EXPECT_FALSE(triage.lastJoinedDivergence());
}

TEST(LiveTriage, SendsAndReceivesDoNotShiftTheCollectiveOrdinal) {
  LiveTriage triage;
  triage.addComm(comm(kWorld, 2));
  // Rank 0 sends twice before its allreduce, rank 1 receives once: their seqs differ, the
  // collective ordinal does not.
  CallRecord send{};
  send.commHash = kWorld;
  send.op = OpKind::kSend;
  send.fingerprint = 1;
  EXPECT_FALSE(triage.observe(send, 1));
  send.fingerprint = 2;
  EXPECT_FALSE(triage.observe(send, 1));
  CallRecord first = collective(0, 64);
  first.seq = 3;
  EXPECT_FALSE(triage.observe(first, 1));
  CallRecord receive = send;
  receive.op = OpKind::kRecv;
  EXPECT_FALSE(triage.observe(receive, 1));
  CallRecord second = collective(0, 64);
  second.seq = 2;
  EXPECT_FALSE(triage.observe(second, 1));
}

TEST(LiveTriage, AnUnknownCommunicatorIsNotAligned) {
  LiveTriage triage;
  EXPECT_FALSE(triage.observe(collective(0, 1), 5));
  EXPECT_FALSE(triage.observe(collective(0, 2), 6));
  EXPECT_EQ(triage.openOrdinals(), 0u);
  EXPECT_EQ(triage.lastActivityNs(), 6);  // still activity
}

TEST(LiveTriage, OpenOrdinalsAreBounded) {
  LiveTriage triage(16);
  triage.addComm(comm(kWorld, 2));
  // One rank alone (its peer skipped everything): only the newest 16 stay open.
  for (uint64_t ordinal = 0; ordinal < 1000; ++ordinal) triage.observe(collective(ordinal, 8), 1);
  EXPECT_LE(triage.openOrdinals(), 17u);
  EXPECT_GE(triage.forgotten(), 983u);
}

// The two-entry cache of the per-record communicator lookups: the last two keys answer, a hit
// on the older makes it the latest, a third key pushes the older out, and clear forgets both.
// What the collector's windows must keep: the oldest ordinal not every member has reported, once
// every member was seen (before that, a member that never reports would hold it for ever).
TEST(LiveTriage, TheOldestOpenOrdinalIsKeptOnceEveryMemberWasSeen) {
  LiveTriage triage;
  triage.addComm(comm(kWorld, 2));
  EXPECT_EQ(triage.oldestOpenOrdinal(kWorld), UINT64_MAX);
  for (uint64_t ordinal = 0; ordinal < 5; ++ordinal) triage.observe(collective(ordinal, 64), 1);
  EXPECT_EQ(triage.oldestOpenOrdinal(kWorld), UINT64_MAX);  // the other member not seen yet
  triage.observe(collective(0, 64), 1);                     // ordinal 0 complete
  EXPECT_EQ(triage.oldestOpenOrdinal(kWorld), 1u);
  for (uint64_t ordinal = 1; ordinal < 5; ++ordinal) triage.observe(collective(ordinal, 64), 1);
  EXPECT_EQ(triage.oldestOpenOrdinal(kWorld), UINT64_MAX);  // all complete
  triage.observe(collective(5, 64), 1);
  EXPECT_EQ(triage.oldestOpenOrdinal(kWorld), 5u);
  EXPECT_EQ(triage.oldestOpenOrdinal(0x999), UINT64_MAX);  // an unknown communicator
}

TEST(RecentTwo, KeepsTheLastTwoKeys) {
  ncclwatch::analysis::RecentTwo<int> recent;
  EXPECT_EQ(recent.find(7), nullptr);
  recent.remember(7, 70);
  recent.remember(8, 80);
  ASSERT_NE(recent.find(7), nullptr);
  EXPECT_EQ(*recent.find(7), 70);  // 7 is now the latest, 8 the older
  recent.remember(9, 90);          // pushes 8 out
  EXPECT_EQ(recent.find(8), nullptr);
  ASSERT_NE(recent.find(7), nullptr);
  EXPECT_EQ(*recent.find(7), 70);
  ASSERT_NE(recent.find(9), nullptr);
  EXPECT_EQ(*recent.find(9), 90);
  recent.clear();
  EXPECT_EQ(recent.find(7), nullptr);
  EXPECT_EQ(recent.find(9), nullptr);
}

}  // namespace
