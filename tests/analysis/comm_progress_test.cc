// The per-communicator progress kept on arrival (analysis/comm_progress.h): its values as records
// arrive, complete and leave the window, against a rebuild from the same window; and the
// collector's passes that use it: a quiet job whose hang checks re-align only the communicators
// that are not done, with the verdicts of a full analysis.
#include "analysis/comm_progress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/incremental.h"
#include "synthetic.h"

namespace {

using ncclwatch::analysis::CommProgress;
using ncclwatch::analysis::IncrementalAnalysis;
using ncclwatch::analysis::MemberProgress;
using ncclwatch::analysis::Options;
using ncclwatch::analysis::ProcessProgress;
using ncclwatch::analysis::Report;
using ncclwatch::analysis::VerdictKind;
using ncclwatch::trace::CallRecord;
using ncclwatch::trace::TraceFile;
using synthetic::OpKind;
using synthetic::Rank;
using synthetic::RecordState;

constexpr int64_t kMs = 1'000'000;
constexpr uint64_t kWorld = 0xA000;
constexpr uint64_t kPair = 0xB000;

// The progress as these tests see it: every communicator's members keep their aligned calls
// (the analysis keeps them for communicators of 64 ranks or more: kKeptAlignmentMinRanks), so
// that the small communicators here check them too.
struct KeptProgress : ProcessProgress {
  KeptProgress() { keepAlignedFrom(1); }
};

std::string text(const MemberProgress& m) {
  std::ostringstream out;
  out << "comm=" << m.commHash << " rank=" << m.commRank << " maxSeq=" << m.maxSeq
      << " completedSeq=" << m.completedSeq << " pending=" << m.pendingCount;
  if (m.pendingCount > 0) out << " head=" << m.headRingIndex;
  out << " lastOrdinal=" << m.lastOrdinal << " maxCompletedOrdinal=" << m.maxCompletedOrdinal
      << " lastActivity=" << m.lastActivityNs << " irregular=" << m.irregular;
  // The aligned calls kept while plain (what a pass copies instead of reading the records).
  out << " plain=" << m.alignedPlain;
  if (m.alignedPlain) {
    out << " base=" << m.base << " splits=" << m.splits << " aligned=";
    for (size_t i = 0; i < m.alignedPositions.size(); ++i) {
      out << m.alignedPositions[i] << ":" << (i < m.alignedKeys.size() ? m.alignedKeys[i] : 0)
          << ",";
    }
    if (m.alignedKeys.size() != m.alignedPositions.size()) out << " keys-differ";
  }
  return out.str();
}

std::string text(const ProcessProgress& p) {
  std::ostringstream out;
  out << "pending=" << p.pendingCalls() << " failed=" << p.failedCalls() << " calls=" << p.calls()
      << " shed=" << p.shed() << " tracked=" << p.trackedCalls()
      << " latest=" << p.latestRecordNs();
  if (p.pendingCalls() > 0) out << " firstPending=" << p.firstPendingPosition();
  out << "\n";
  for (const MemberProgress& m : p.members()) out << "  " << text(m) << "\n";
  return out.str();
}

// What a rebuild from the window says: the reference the kept state must equal.
std::string rebuilt(const TraceFile& file) {
  KeptProgress fresh;
  fresh.rebuild(file);
  return text(fresh);
}

// A rank of a 4-rank world and of a 2-rank pair communicator.
TraceFile rankFile() {
  Rank rank(1, 4);
  rank.comm(kWorld, 4, 1).comm(kPair, 2, 1, kWorld, 0);
  TraceFile file = rank.take();
  return file;
}

CallRecord record(uint64_t hash, uint64_t seq, OpKind op, RecordState state, uint64_t ringIndex,
                  int peer = -1, uint64_t p2pSeq = 0) {
  CallRecord r{};
  r.commHash = hash;
  r.seq = seq;
  r.op = op;
  r.count = 1024;
  r.dtype = synthetic::kF32;
  r.rootOrPeer = peer;
  r.p2pSeq = p2pSeq;
  r.stream = 1;
  r.state = state;
  r.ringIndex = ringIndex;
  r.issueNs = 1000 * kMs + static_cast<int64_t>(ringIndex) * kMs;
  if (state != RecordState::kIssued) r.startNs = r.issueNs + 1000;
  if (state == RecordState::kCompleted) r.completeNs = r.issueNs + 2000;
  return r;
}

CallRecord completed(CallRecord r) {
  r.state = RecordState::kCompleted;
  r.startNs = r.issueNs + 1000;
  r.completeNs = r.issueNs + 2000;
  return r;
}

TEST(CommProgress, FollowsRecordsAsTheyArrive) {
  TraceFile file = rankFile();
  KeptProgress progress;
  progress.rebuild(file);
  ASSERT_EQ(progress.members().size(), 2u);
  EXPECT_EQ(progress.members()[0].commHash, kWorld);
  EXPECT_EQ(progress.members()[0].commRank, 1);
  EXPECT_EQ(progress.members()[1].commHash, kPair);
  auto append = [&](const CallRecord& r) {
    file.records.push_back(r);
    progress.appended(file);
  };
  append(record(kWorld, 1, OpKind::kAllReduce, RecordState::kCompleted, 0));
  append(record(kWorld, 2, OpKind::kSend, RecordState::kCompleted, 1, 2, 1));
  append(record(kPair, 1, OpKind::kAllReduce, RecordState::kCompleted, 2));
  append(record(kWorld, 3, OpKind::kAllReduce, RecordState::kStarted, 3));
  append(record(kWorld, 4, OpKind::kAllReduce, RecordState::kIssued, 4));
  const MemberProgress& world = *progress.member(kWorld);
  EXPECT_EQ(world.maxSeq, 4u);
  EXPECT_EQ(world.completedSeq, 2u);  // the send, the call before the first pending one
  EXPECT_EQ(world.pendingCount, 2u);
  EXPECT_EQ(world.headRingIndex, 3u);
  EXPECT_EQ(world.lastOrdinal, 3u);  // seq 4 less the one send
  EXPECT_EQ(world.maxCompletedOrdinal, 1u);
  const MemberProgress& pair = *progress.member(kPair);
  EXPECT_EQ(pair.maxSeq, 1u);
  EXPECT_EQ(pair.completedSeq, 1u);
  EXPECT_EQ(pair.pendingCount, 0u);
  EXPECT_EQ(progress.pendingCalls(), 2u);
  EXPECT_EQ(progress.calls(), 5u);
  EXPECT_EQ(progress.latestRecordNs(), file.records.back().issueNs);
  EXPECT_TRUE(progress.follows(file));
  EXPECT_EQ(text(progress), rebuilt(file));
  EXPECT_EQ(progress.rebuilds(), 1u);  // the first, empty one only
}

// A rank with `calls` world allreduces issued, its progress following them as they arrive; a
// completion arrives as the collector receives it, the record again with its new state.
struct InFlight {
  TraceFile file = rankFile();
  KeptProgress progress;
  explicit InFlight(uint64_t calls) {
    progress.rebuild(file);
    for (uint64_t i = 0; i < calls; ++i) {
      file.records.push_back(record(kWorld, i + 1, OpKind::kAllReduce, RecordState::kIssued, i));
      progress.appended(file);
    }
  }
  void complete(size_t i) {
    CallRecord before = file.records[i];
    file.records[i] = completed(before);
    progress.replaced(file, before, file.records[i]);
  }
};

// The collector receives a record again when its state changes: the copy replaces the one kept.
TEST(CommProgress, ACompletionMovesTheHeadAndTheCompletedSeq) {
  InFlight calls(4);
  TraceFile& file = calls.file;
  ProcessProgress& progress = calls.progress;
  auto complete = [&](size_t i) { calls.complete(i); };
  const MemberProgress& world = *progress.member(kWorld);
  EXPECT_EQ(world.pendingCount, 4u);
  EXPECT_EQ(world.completedSeq, 0u);
  complete(1);  // not the head: the calls up to the first pending one are as they were
  EXPECT_EQ(world.pendingCount, 3u);
  EXPECT_EQ(world.completedSeq, 0u);
  EXPECT_EQ(world.headRingIndex, 0u);
  EXPECT_EQ(world.maxCompletedOrdinal, 2u);
  complete(0);  // the head: #1 and #2 are complete, #3 is the head
  EXPECT_EQ(world.completedSeq, 2u);
  EXPECT_EQ(world.headRingIndex, 2u);
  EXPECT_EQ(text(progress), rebuilt(file));
  complete(3);
  complete(2);
  EXPECT_EQ(world.pendingCount, 0u);
  EXPECT_EQ(world.completedSeq, 4u);
  EXPECT_EQ(world.maxCompletedOrdinal, 4u);
  EXPECT_EQ(progress.pendingCalls(), 0u);
  EXPECT_EQ(text(progress), rebuilt(file));
  EXPECT_EQ(progress.rebuilds(), 1u);  // every change followed without a rescan
}

// A newer copy of a record whose latest time is earlier (a resend after a reconnect carries the
// times the ring holds then): the member's last activity is recomputed, even when another
// communicator's record holds the process's latest time.
TEST(CommProgress, ANewerCopyWithAnEarlierTimeLowersTheMembersActivity) {
  TraceFile file = rankFile();
  CallRecord world = record(kWorld, 1, OpKind::kAllReduce, RecordState::kCompleted, 0);
  world.completeNs = world.issueNs + 50 * kMs;
  CallRecord pair = record(kPair, 1, OpKind::kAllReduce, RecordState::kCompleted, 1);
  pair.completeNs = pair.issueNs + 100 * kMs;  // the process's latest time
  file.records = {world, pair};
  KeptProgress progress;
  progress.rebuild(file);
  CallRecord earlier = world;
  earlier.completeNs = world.issueNs + 3000;
  file.records[0] = earlier;
  progress.replaced(file, world, earlier);
  EXPECT_EQ(progress.member(kWorld)->lastActivityNs, earlier.completeNs);
  EXPECT_EQ(text(progress), rebuilt(file));
}

// Many calls in flight completing out of order: the finished ones left in the list are
// compacted away, the head follows the oldest still pending.
TEST(CommProgress, ManyCallsInFlightCompletingOutOfOrder) {
  InFlight calls(200);
  ProcessProgress& progress = calls.progress;
  auto complete = [&](size_t i) {
    calls.complete(i);
    ASSERT_EQ(text(progress), rebuilt(calls.file)) << "after completing #" << i + 1;
  };
  for (size_t i = 1; i < 200; i += 2) complete(i);
  EXPECT_EQ(progress.member(kWorld)->pendingCount, 100u);
  EXPECT_EQ(progress.member(kWorld)->headRingIndex, 0u);
  for (size_t i = 198; i > 0; i -= 2) complete(i);
  EXPECT_EQ(progress.member(kWorld)->completedSeq, 0u);
  complete(0);
  EXPECT_EQ(progress.member(kWorld)->completedSeq, 200u);
  EXPECT_EQ(progress.member(kWorld)->pendingCount, 0u);
  EXPECT_EQ(progress.rebuilds(), 1u);
}

TEST(CommProgress, RecordsLeavingTheWindow) {
  TraceFile file = rankFile();
  KeptProgress progress;
  progress.rebuild(file);
  for (uint64_t i = 0; i < 6; ++i) {
    uint64_t hash = i < 2 ? kPair : kWorld;
    uint64_t seq = i < 2 ? i + 1 : i - 1;
    file.records.push_back(record(hash, seq, OpKind::kAllReduce, RecordState::kCompleted, i));
    progress.appended(file);
  }
  EXPECT_EQ(progress.member(kPair)->maxSeq, 2u);
  // The collector trims the window's front and says so: the pair's calls have left it.
  file.records.erase(file.records.begin(), file.records.begin() + 3);
  EXPECT_FALSE(progress.follows(file));
  progress.rebuild(file);
  EXPECT_TRUE(progress.follows(file));
  EXPECT_EQ(progress.member(kPair)->maxSeq, 0u);
  EXPECT_EQ(progress.member(kPair)->lastOrdinal, 0u);
  EXPECT_EQ(progress.member(kWorld)->maxSeq, 4u);
  EXPECT_EQ(progress.calls(), 3u);
  // A window changed without a word (a record replaced by another call) is not followed.
  file.records.back().ringIndex = 99;
  EXPECT_FALSE(progress.follows(file));
  // Nor is a communicator table that changed.
  progress.rebuild(file);
  file.comms.pop_back();
  EXPECT_FALSE(progress.follows(file));
}

// Random arrivals, completions and trims on two communicators with sends and receives: after
// every step the state kept equals a rebuild from the window.
TEST(CommProgress, AnyOrderOfChangesEqualsARebuild) {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    std::mt19937 random(seed);
    TraceFile file = rankFile();
    KeptProgress progress;
    progress.rebuild(file);
    uint64_t ring = 0, worldSeq = 0, pairSeq = 0, sends = 0, recvs = 0;
    for (int step = 0; step < 400; ++step) {
      unsigned what = random() % 10;
      if (what < 6) {
        bool world = random() % 3 != 0;
        uint64_t& seq = world ? worldSeq : pairSeq;
        OpKind op = OpKind::kAllReduce;
        int peer = -1;
        uint64_t p2pSeq = 0;
        if (world && random() % 3 == 0) {
          op = random() % 2 ? OpKind::kSend : OpKind::kRecv;
          peer = 2;
          p2pSeq = op == OpKind::kSend ? ++sends : ++recvs;
        }
        RecordState state = random() % 2 ? RecordState::kIssued : RecordState::kCompleted;
        file.records.push_back(
            record(world ? kWorld : kPair, ++seq, op, state, ring++, peer, p2pSeq));
        progress.appended(file);
      } else if (what < 9) {
        std::vector<size_t> open;
        for (size_t i = 0; i < file.records.size(); ++i) {
          if (file.records[i].state != RecordState::kCompleted) open.push_back(i);
        }
        if (open.empty()) continue;
        size_t i = open[random() % open.size()];
        CallRecord before = file.records[i];
        file.records[i] = random() % 4 == 0 ? before : completed(before);
        if (random() % 5 == 0 && file.records[i].state != RecordState::kCompleted) {
          file.records[i].state = RecordState::kStarted;
          file.records[i].startNs = before.issueNs + 1000;
        }
        progress.replaced(file, before, file.records[i]);
      } else if (file.records.size() > 8) {
        size_t drop = 1 + random() % (file.records.size() / 2);
        file.records.erase(file.records.begin(),
                           file.records.begin() + static_cast<std::ptrdiff_t>(drop));
        progress.rebuild(file);  // what IncrementalAnalysis::reshaped does
      }
      ASSERT_EQ(text(progress), rebuilt(file)) << "seed " << seed << " step " << step;
      ASSERT_TRUE(progress.follows(file));
    }
  }
}

// Everything a member keeps, internal fields included (the pending calls from the head on, the
// finished ones left in place being nobody's business): a trim must leave the state a rebuild
// from the same window makes, so that what follows it (appends, completions) goes on the same.
std::string everything(const ProcessProgress& p) {
  std::ostringstream out;
  out << text(p);
  for (const MemberProgress& m : p.members()) {
    out << "  " << m.commHash << ": lastSeq=" << m.lastSeq << " base=" << m.base
        << " anyCollective=" << m.anyCollective << " p2pSum=" << m.p2pSum
        << " lastCandidate=" << m.lastCandidate << " ascend=" << m.candidatesAscend
        << " farJump=" << m.farJump << " p2pIndexed=" << m.p2pIndex.size() << " p2p=[";
    for (const MemberProgress::P2pMax& x : m.p2pMax) {
      out << " " << x.peerAndDirection << ":" << x.p2pSeq;
    }
    out << " ] pending=[";
    for (size_t i = m.pendingFront; i < m.pending.size(); ++i) {
      const MemberProgress::Pending& e = m.pending[i];
      if (e.finished) continue;
      out << " " << e.ringIndex << "/" << e.seqBefore << "/" << e.ordinal;
    }
    out << " ]\n";
  }
  return out.str();
}

std::string everythingRebuilt(const TraceFile& file) {
  KeptProgress fresh;
  fresh.rebuild(file);
  return everything(fresh);
}

constexpr uint64_t kThird = 0xC000;

// Drops the window's front as the collector does: the progress is told first, then the records
// are erased.
void trimFront(TraceFile& file, ProcessProgress& progress, size_t drop) {
  progress.droppingFront(file, drop);
  file.records.erase(file.records.begin(),
                     file.records.begin() + static_cast<std::ptrdiff_t>(drop));
}

// Random windows (collectives on three communicators, sends and receives with their p2pSeq,
// pending, started and completed calls, a damaged seq far ahead or behind now and then, ring
// indices out of order, a record's time far ahead, calls on a communicator not in the table) with
// fronts of random sizes dropped, or dropped as the collector trims (an append past the window
// and its slack, then the trim): after every step, every field of every member and every fact
// of the process equal a rebuild from the same window. Both ways of a trim must have been taken.
TEST(CommProgress, DroppingTheFrontEqualsARebuild) {
  uint64_t fast = 0, rebuilt = 0;
  auto anyFarJump = [](const ProcessProgress& p) {
    return std::any_of(p.members().begin(), p.members().end(),
                       [](const MemberProgress& m) { return m.farJump; });
  };
  for (unsigned seed = 1; seed <= 60; ++seed) {
    std::mt19937 random(seed);
    TraceFile file = rankFile();
    file.comms.push_back(file.comms.back());
    file.comms.back().commHash = kThird;
    KeptProgress progress;
    progress.rebuild(file);
    // Odd seeds trim as the collector does (window 24, slack 12); even ones at random.
    const bool collectorLike = seed % 2 == 1;
    // Some seeds keep the steady shape (collectives only, completed soon): mostly trims.
    const bool steady = seed % 4 < 2;
    uint64_t ringCount = 0, sends = 0, recvs = 0;
    uint64_t seqs[3] = {0, 0, 0};
    const uint64_t hashes[3] = {kWorld, kPair, kThird};
    for (int step = 0; step < 600; ++step) {
      unsigned what = random() % 20;
      uint64_t trimsBefore = progress.trims(), rebuildsBefore = progress.rebuilds();
      bool jumpedBefore = anyFarJump(progress);
      bool trimmed = false;
      if (what < 12) {
        size_t c = random() % 3;
        if (random() % 40 == 0) {
          // A jump ahead that the alignment drops as too far ahead in a window a little smaller
          // than this one (4 * size + 4096), not in this one: whether the record is irregular
          // depends on the window's size, which a trim changes.
          seqs[c] += 4096 + 4 * (file.records.size() + 1) - random() % 40;
        }
        uint64_t seq = ++seqs[c];
        OpKind op = OpKind::kAllReduce;
        int peer = -1;
        uint64_t p2pSeq = 0;
        if (!steady && c == 0 && random() % 4 == 0) {
          op = random() % 2 ? OpKind::kSend : OpKind::kRecv;
          peer = 2 + static_cast<int>(random() % 2);
          p2pSeq = op == OpKind::kSend ? ++sends : ++recvs;
        } else if (random() % 10 == 0) {
          op = OpKind::kRegister;
        }
        if (!steady && random() % 60 == 0) seq += 10'000;        // damaged: far ahead
        if (!steady && random() % 60 == 0 && seq > 3) seq -= 3;  // behind: not ascending
        RecordState state = RecordState::kCompleted;
        unsigned s = random() % 10;
        if (s < (steady ? 3u : 4u)) state = RecordState::kIssued;
        if (s == 4 && !steady) state = RecordState::kStarted;
        uint64_t ring = 2 * ++ringCount;
        if (!steady && random() % 80 == 0) ring -= 7;  // behind the one before: out of order
        CallRecord r = record(hashes[c], seq, op, state, ring, peer, p2pSeq);
        if (random() % 50 == 0) r.issueNs += 1000 * kMs;  // the latest time for a while
        if (random() % 40 == 0) r.flags |= ncclwatch::trace::kRecordShed;
        if (!steady && random() % 50 == 0) r.commHash = 0xDEAD;  // not in the table
        if (!steady && random() % 50 == 0) {
          r.op = OpKind::kGroupStart;  // not sequenced
          r.seq = 0;
        }
        file.records.push_back(r);
        progress.appended(file);
        if (collectorLike && file.records.size() > 24 + 12) {
          trimFront(file, progress, file.records.size() - 24);
          trimmed = true;
        }
      } else if (what < 18) {
        std::vector<size_t> open;
        for (size_t i = 0; i < file.records.size(); ++i) {
          if (file.records[i].state != RecordState::kCompleted) open.push_back(i);
        }
        if (open.empty()) continue;
        // The oldest often: calls complete roughly in order.
        size_t i = random() % 2 ? open.front() : open[random() % open.size()];
        CallRecord before = file.records[i];
        file.records[i] = completed(before);
        if (random() % 5 == 0 && before.state == RecordState::kIssued) {
          file.records[i].state = RecordState::kStarted;
          file.records[i].completeNs = 0;
        }
        progress.replaced(file, before, file.records[i]);
      } else if (!collectorLike && !file.records.empty()) {
        size_t drop = random() % 8 == 0
                          ? file.records.size()
                          : 1 + random() % std::max<size_t>(1, file.records.size() / 2);
        trimFront(file, progress, std::min(drop, file.records.size()));
        trimmed = true;
      }
      // A member that jumped far ahead (farJump) may hold an irregular record: whether it is
      // depends on the window's size when it was added, which an append changes after it (the
      // pass aligns such a member: irregular, never done). Without one, the kept state is exact;
      // and right after a trim, always (a fast trim requires none, else it rebuilds).
      if (trimmed || !anyFarJump(progress)) {
        ASSERT_EQ(everything(progress), everythingRebuilt(file))
            << "seed " << seed << " step " << step;
      }
      ASSERT_TRUE(progress.follows(file)) << "seed " << seed << " step " << step;
      if (trimmed) {
        fast += progress.trims() - trimsBefore;
        rebuilt += progress.rebuilds() - rebuildsBefore;
        ASSERT_EQ(progress.trims() - trimsBefore + progress.rebuilds() - rebuildsBefore, 1u);
        // An append before the trim may have jumped: then it rebuilds.
        if (jumpedBefore) {
          ASSERT_EQ(progress.trims(), trimsBefore);
        }
      }
    }
  }
  // Both ways, many times each (the counts are fixed by the seeds).
  EXPECT_GT(fast, 200u);
  EXPECT_GT(rebuilt, 200u);
  std::cout << "trims without a rebuild: " << fast << ", with one: " << rebuilt << "\n";
}

// The collector's steady shape (the bench's: collectives on two communicators, each sent issued
// and completed soon after, a 128-record window with 64 of slack): every trim drops the records
// without a rebuild, and the state still equals one.
TEST(CommProgress, TheSteadyShapeTrimsWithoutARebuild) {
  TraceFile file = rankFile();
  KeptProgress progress;
  progress.rebuild(file);
  IncrementalAnalysis incremental;
  TraceFile window = file;  // the same, fed through IncrementalAnalysis
  uint64_t worldSeq = 0, pairSeq = 0, trims = 0;
  for (uint64_t i = 0; i < 5000; ++i) {
    bool world = i % 3 != 2;
    uint64_t seq = world ? ++worldSeq : ++pairSeq;
    CallRecord r = record(world ? kWorld : kPair, seq, OpKind::kAllReduce, RecordState::kIssued, i);
    for (TraceFile* f : {&file, &window}) f->records.push_back(r);
    progress.appended(file);
    incremental.appended(0, window);
    if (file.records.size() > 128 + 64) {
      size_t drop = file.records.size() - 128;
      trimFront(file, progress, drop);
      incremental.trimming(0, window, drop);
      window.records.erase(window.records.begin(),
                           window.records.begin() + static_cast<std::ptrdiff_t>(drop));
      ++trims;
    }
    // The call before completes (the collector receives it again).
    if (file.records.size() >= 2) {
      size_t at = file.records.size() - 2;
      CallRecord before = file.records[at];
      file.records[at] = window.records[at] = completed(before);
      progress.replaced(file, before, file.records[at]);
      incremental.replaced(0, window, before, window.records[at]);
    }
  }
  EXPECT_GT(trims, 70u);
  EXPECT_EQ(progress.trims(), trims);
  EXPECT_EQ(progress.rebuilds(), 1u);  // the first, empty one only
  EXPECT_EQ(everything(progress), everythingRebuilt(file));
  EXPECT_EQ(incremental.stats().progressTrims, trims);
  EXPECT_EQ(incremental.stats().progressTrimRebuilds, 0u);
  // A pass finds the progress following the window, and agreeing with the alignment.
  Options options;
  options.nowNs = file.records.back().issueNs + 10 * kMs;
  incremental.analyze(std::span<const TraceFile>(&window, 1), options);
  EXPECT_EQ(incremental.stats().progressRebuilds, 0u);
  EXPECT_EQ(incremental.stats().progressDisagreements, 0u);
}

TEST(CommProgress, ACommunicatorIsDoneWhenNothingWaitsAndNoMemberIsBehind) {
  MemberProgress a, b;
  a.maxSeq = b.maxSeq = 10;
  a.lastOrdinal = b.lastOrdinal = 8;
  a.maxCompletedOrdinal = 8;
  b.maxCompletedOrdinal = 7;
  CommProgress comm;
  comm.add(a, true);
  comm.add(b, false);
  EXPECT_TRUE(comm.done);
  EXPECT_FALSE(comm.countsDiffer);
  EXPECT_EQ(comm.maxCompletedOrdinal, 8u);
  EXPECT_EQ(comm.completedByAll, 7u);
  b.pendingCount = 1;
  comm.add(a, true);
  comm.add(b, false);
  EXPECT_FALSE(comm.done);
  b.pendingCount = 0;
  b.maxSeq = 9;
  comm.add(a, true);
  comm.add(b, false);
  EXPECT_FALSE(comm.done);
  EXPECT_TRUE(comm.countsDiffer);
  b.maxSeq = 10;
  b.lastOrdinal = 7;  // as many calls, but more of them sends or receives
  comm.add(a, true);
  comm.add(b, false);
  EXPECT_FALSE(comm.done);
  EXPECT_FALSE(comm.countsDiffer);
}

// ----- The collector's passes -----

constexpr int kRanks = 16;
constexpr uint64_t kStuckPair = kPair + 3;

// 16 ranks: a world and 8 pair communicators, 6 steps of an allreduce on each, every call
// completed but on pair 3 (ranks 6, 7), whose last allreduce started on both and never completed.
// `crash`: rank 6 ended without a clean shutdown before its last allreduce on pair 3 (rank 7
// waits in it).
std::vector<TraceFile> quietJob(bool crash = false) {
  std::vector<TraceFile> files;
  for (int r = 0; r < kRanks; ++r) {
    Rank rank(r, kRanks);
    uint64_t pair = kPair + static_cast<uint64_t>(r / 2);
    rank.comm(kWorld, kRanks, r).comm(pair, 2, r % 2, kWorld, r / 2);
    int64_t t = 1000 * kMs;
    for (int step = 0; step < 6; ++step) {
      t += 10 * kMs;
      rank.call(kWorld, OpKind::kAllReduce, 4096, RecordState::kCompleted, t);
      bool last = step == 5 && pair == kStuckPair;
      if (last && crash && r == 6) break;
      rank.call(pair, OpKind::kAllReduce, 1024,
                last ? RecordState::kStarted : RecordState::kCompleted, t + kMs);
    }
    files.push_back(rank.take());
  }
  return files;
}

Options quietOptions(bool crash = false) {
  Options options;
  options.probeProcesses = false;
  options.quietNs = 1000 * kMs;
  options.nowNs = synthetic::kAnchorWall + 1000 * kMs + 100 * kMs + 5000 * kMs;
  for (int r = 0; r < kRanks; ++r) {
    if (!(crash && r == 6)) options.aliveRanks.push_back(r);
  }
  return options;
}

std::string verdicts(const Report& report) {
  std::ostringstream out;
  for (const auto& job : report.jobs) {
    out << "stalled=" << job.stalled << "\n";
    for (const auto& v : job.verdicts) {
      out << ncclwatch::analysis::kindName(v.kind) << " comm=" << v.comm.hash << " seq=" << v.seq
          << " culprits=" << ncclwatch::analysis::formatRanks(v.culprits)
          << " primary=" << v.primary << " " << v.explanation << "\n";
      for (const auto& c : v.classes) {
        out << "  " << ncclwatch::analysis::formatRanks(c.ranks) << " " << c.call.note << "\n";
      }
    }
    for (const auto& comm : job.comms) {
      out << "comm " << comm.comm.hash << " calls=" << comm.calls;
      for (const auto& p : comm.progress) {
        out << " [" << ncclwatch::analysis::formatRanks(p.ranks) << " " << p.issuedSeq << "/"
            << p.completedSeq << "/" << p.pending << "]";
      }
      out << "\n";
    }
  }
  return out.str();
}

// The collector's view: records reported one by one, as the collector stores them.
struct Collector {
  std::vector<TraceFile> windows;
  IncrementalAnalysis incremental;
  explicit Collector(const std::vector<TraceFile>& files) {
    for (const TraceFile& file : files) {
      windows.push_back(file);
      windows.back().records.clear();
    }
    for (size_t f = 0; f < files.size(); ++f) {
      for (const CallRecord& r : files[f].records) {
        windows[f].records.push_back(r);
        incremental.appended(f, windows[f]);
        incremental.touch(r.commHash);
      }
    }
  }
};

TEST(QuietJob, OneStuckCommunicatorAmongManyHealthyOnesIsTheOnlyOneRealigned) {
  std::vector<TraceFile> files = quietJob();
  Options options = quietOptions();
  Report full = ncclwatch::analysis::analyze(files, options);
  ASSERT_EQ(full.jobs.size(), 1u);
  ASSERT_FALSE(full.jobs[0].verdicts.empty());
  EXPECT_EQ(full.jobs[0].verdicts[0].kind, VerdictKind::kStuck) << verdicts(full);
  EXPECT_EQ(full.jobs[0].verdicts[0].comm.hash, kStuckPair);
  Collector collector(files);
  Report first = collector.incremental.analyze(collector.windows, options);
  EXPECT_EQ(collector.incremental.stats().fullPasses, 1u);
  EXPECT_EQ(verdicts(full), verdicts(first));
  // Nothing arrives: the job stays quiet, and the pass runs the hang checks over the one
  // communicator not done.
  for (int pass = 0; pass < 3; ++pass) {
    options.nowNs += 200 * kMs;
    uint64_t realigned = collector.incremental.stats().commsReanalysed;
    Report quiet = collector.incremental.analyze(collector.windows, options);
    const IncrementalAnalysis::Stats& stats = collector.incremental.stats();
    EXPECT_EQ(stats.fullPasses, 1u);
    EXPECT_EQ(stats.hangPasses, static_cast<uint64_t>(pass + 1));
    EXPECT_EQ(stats.hangBecause.at("quiet"), static_cast<uint64_t>(pass + 1));
    EXPECT_EQ(stats.commsReanalysed - realigned, 1u);  // pair 3 alone, of 9
    EXPECT_EQ(verdicts(ncclwatch::analysis::analyze(files, options)), verdicts(quiet));
  }
  EXPECT_EQ(collector.incremental.stats().progressDisagreements, 0u);
  EXPECT_EQ(collector.incremental.stats().progressRebuilds, 0u);
  // The stuck allreduce completes on both ranks (the collector receives the records again): the
  // pair is done, nothing is re-aligned but what was touched, and the verdict is gone.
  for (int r : {6, 7}) {
    TraceFile& window = collector.windows[static_cast<size_t>(r)];
    CallRecord before = window.records.back();
    window.records.back() = completed(before);
    files[static_cast<size_t>(r)].records.back() = window.records.back();
    collector.incremental.replaced(static_cast<size_t>(r), window, before, window.records.back());
    collector.incremental.touch(kStuckPair);
  }
  uint64_t realigned = collector.incremental.stats().commsReanalysed;
  Report healed = collector.incremental.analyze(collector.windows, options);
  EXPECT_EQ(collector.incremental.stats().commsReanalysed - realigned, 1u);
  EXPECT_EQ(verdicts(ncclwatch::analysis::analyze(files, options)), verdicts(healed));
  EXPECT_FALSE(healed.hasFindings()) << verdicts(healed);
}

// A process that ended (crashed) while its partner waits: the passes after the first one that
// saw it gone run the hang checks over the communicator not done and keep the dead-rank verdict.
TEST(QuietJob, AProcessThatEndedKeepsItsCommunicatorNotDone) {
  std::vector<TraceFile> files = quietJob(/*crash=*/true);
  Options options = quietOptions(/*crash=*/true);
  Report full = ncclwatch::analysis::analyze(files, options);
  ASSERT_TRUE(full.hasFindings()) << verdicts(full);
  EXPECT_EQ(full.jobs[0].verdicts[0].kind, VerdictKind::kDeadRank) << verdicts(full);
  EXPECT_EQ(full.jobs[0].verdicts[0].culprits, std::vector<int>{6});
  Collector collector(files);
  collector.incremental.analyze(collector.windows, options);
  for (int pass = 0; pass < 2; ++pass) {
    options.nowNs += 200 * kMs;
    uint64_t realigned = collector.incremental.stats().commsReanalysed;
    Report later = collector.incremental.analyze(collector.windows, options);
    EXPECT_EQ(collector.incremental.stats().commsReanalysed - realigned, 1u);
    EXPECT_EQ(verdicts(ncclwatch::analysis::analyze(files, options)), verdicts(later));
  }
  EXPECT_EQ(collector.incremental.stats().hangPasses, 2u);
  EXPECT_EQ(collector.incremental.stats().progressDisagreements, 0u);
}

}  // namespace
