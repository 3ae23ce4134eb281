// The incremental analysis (analysis/incremental.h) against the full one: the same records fed
// to both, to analyze() all at once and to IncrementalAnalysis in many small batches (ranks and
// communicators in shuffled order, records arriving issued and completing later, as the
// collector sees them), for each bug class of train_loop on synthetic traces. After every batch
// the two verdict lists and communicator summaries must be equal, and partial passes must have
// run where the job was healthy and alive.
#include "analysis/incremental.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "synthetic.h"

namespace {

using ncclwatch::analysis::IncrementalAnalysis;
using ncclwatch::analysis::Options;
using ncclwatch::analysis::Report;
using ncclwatch::trace::CallRecord;
using ncclwatch::trace::TraceFile;
using synthetic::OpKind;
using synthetic::Rank;
using synthetic::RecordState;

constexpr int64_t kMs = 1'000'000;
constexpr int kWorld = 8;
constexpr int kSteps = 12;
constexpr uint64_t kWorldComm = 0xA000;
constexpr uint64_t kTpComm = 0xB000;  // + colour

// A train_loop-like job: a split into two tensor-parallel halves, then per step an allreduce on
// the half, one on the world and (every other step) a send to the next rank and a receive from
// the previous one. The last two steps stay issued (the job runs, or hangs there). `bug` bends
// it as train_loop's --bug does. `plain`: no sends or receives, and every call completed (the
// shape whose members the passes take from their kept progress: comm_progress.h, alignedPlain).
std::vector<TraceFile> job(const std::string& bug, bool plain = false) {
  std::vector<int> colour(kWorld);
  for (int r = 0; r < kWorld; ++r) colour[r] = r / 4;
  if (bug == "color") colour[2] = 1;
  std::vector<Rank> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back(r, kWorld);
    ranks.back().comm(kWorldComm, kWorld, r);
  }
  for (int r = 0; r < kWorld; ++r) {
    int size = 0, mine = 0;
    for (int o = 0; o < kWorld; ++o) {
      if (colour[o] == colour[r]) {
        if (o < r) ++mine;
        ++size;
      }
    }
    ranks[r].comm(kTpComm + colour[r], size, mine, kWorldComm, colour[r]);
  }
  const int badRank = 3, badStep = 5;
  for (int r = 0; r < kWorld; ++r) {
    Rank& rank = ranks[r];
    int64_t t = 1000 * kMs;
    auto state = [plain](int step) {
      return step >= kSteps - 2 && !plain ? RecordState::kIssued : RecordState::kCompleted;
    };
    rank.call(kWorldComm, OpKind::kSplit, 0, RecordState::kCompleted, t, 0, 0, colour[r]);
    int lastStep = bug == "crash" && r == 6 ? 7 : bug == "exit" && r == 6 ? 6 : kSteps;
    for (int step = 0; step < lastStep; ++step) {
      t += 10 * kMs;
      int64_t late = bug == "slow" && r == 5 ? 4 * kMs : 0;
      bool bad = r == badRank && step == badStep;
      RecordState s = state(step);
      rank.call(kTpComm + colour[r], OpKind::kAllReduce, 1024, s, t + late);
      if (bad && bug == "skip") continue;
      if (bad && bug == "extra") rank.call(kWorldComm, OpKind::kAllReduce, 64, s, t + 1 * kMs);
      uint64_t count = bad && bug == "count" ? 2048 : 4096;
      int dtype = bad && bug == "dtype" ? synthetic::kF16 : synthetic::kF32;
      int redop = bad && bug == "redop" ? synthetic::kMax : synthetic::kSum;
      OpKind op = bad && bug == "op" ? OpKind::kBroadcast : OpKind::kAllReduce;
      rank.call(kWorldComm, op, count, s, t + 2 * kMs + late, dtype, redop,
                op == OpKind::kBroadcast ? 0 : -1);
      if (step % 2 == 0 && !plain) {
        int next = (r + 1) % kWorld, previous = (r + kWorld - 1) % kWorld;
        if (bug == "peer" && r == badRank && step == 2 * (badStep / 2)) next = (r + 2) % kWorld;
        bool p2pDone = step < kSteps - 4;
        RecordState ps = p2pDone ? RecordState::kCompleted : RecordState::kIssued;
        rank.call(kWorldComm, OpKind::kSend, 256, ps, t + 3 * kMs, synthetic::kF32, 0, next);
        rank.call(kWorldComm, OpKind::kRecv, 256, ps, t + 3 * kMs, synthetic::kF32, 0, previous);
      }
    }
    if (bug == "clean") rank.clean();
  }
  std::vector<TraceFile> files;
  for (Rank& rank : ranks) files.push_back(rank.take());
  return files;
}

// Everything a user or the collector reads of a verdict, but its detection time (a kept verdict
// keeps that of the pass that found it).
std::string describe(const Report& report) {
  std::ostringstream out;
  for (const auto& job : report.jobs) {
    out << "job " << job.jobId << "/" << job.attempt << " stalled=" << job.stalled
        << " ended=" << job.ended << "\n";
    for (const auto& v : job.verdicts) {
      out << ncclwatch::analysis::kindName(v.kind) << " comm=" << v.comm.hash
          << " size=" << v.comm.size << " name=" << v.comm.name << " seq=" << v.seq
          << " primary=" << v.primary << " effect=" << static_cast<int>(v.effect)
          << " confidence=" << v.confidence << " divergence=" << v.divergenceNs
          << " culprits=" << ncclwatch::analysis::formatRanks(v.culprits) << "\n  " << v.explanation
          << "\n";
      for (const auto& field : v.fields) out << "  field " << field << "\n";
      for (const auto& doubt : v.doubts) out << "  doubt " << doubt << "\n";
      for (const auto& c : v.classes) {
        out << "  class " << ncclwatch::analysis::formatRanks(c.ranks)
            << " op=" << static_cast<int>(c.call.op) << " seq=" << c.call.seq
            << " count=" << c.call.count << " state=" << static_cast<int>(c.call.state)
            << " comm=" << c.call.commHash << " note=" << c.call.note << "\n";
      }
    }
    for (const auto& comm : job.comms) {
      out << "comm " << comm.comm.hash << " ranks=" << ncclwatch::analysis::formatRanks(comm.ranks)
          << " calls=" << comm.calls;
      for (const auto& p : comm.progress) {
        out << " [" << ncclwatch::analysis::formatRanks(p.ranks) << " " << p.issuedSeq << "/"
            << p.completedSeq << "/" << p.pending << "]";
      }
      out << "\n";
    }
  }
  return out.str();
}

// The verdicts on one communicator: kind, seq, culprits and classes.
// `stragglers`: with the straggler verdicts (a divergence's own pass keeps the communicator's
// last tally: JobAnalysis::deferStragglerTallies).
std::string verdictsOn(const Report& report, uint64_t hash, bool stragglers = true) {
  std::ostringstream out;
  for (const auto& job : report.jobs) {
    for (const auto& v : job.verdicts) {
      if (v.comm.hash != hash) continue;
      if (!stragglers && v.kind == ncclwatch::analysis::VerdictKind::kStraggler) continue;
      out << ncclwatch::analysis::kindName(v.kind) << " seq=" << v.seq
          << " culprits=" << ncclwatch::analysis::formatRanks(v.culprits) << " "
          << v.explanation.substr(0, v.explanation.find(" (a consequence")) << "\n";
      for (const auto& c : v.classes) {
        out << "  class " << ncclwatch::analysis::formatRanks(c.ranks) << " " << c.call.note
            << "\n";
      }
    }
  }
  return out.str();
}

struct Feed {
  int verdictsSeen = 0;
  uint64_t partial = 0;
  uint64_t full = 0;
  uint64_t hang = 0;  // partial passes that ran the hang checks
};

// Feeds `complete` record by record in small batches, in an order shuffled by `seed`: each batch
// takes a few next records of one rank (ranks picked at random, so communicators interleave in
// no fixed order), a record first as issued and its completion in a later batch. After every
// batch, the incremental pass and a full one must agree. `report`: tell the incremental analysis
// what changed in each window, record by record, as the collector does (its progress then follows
// the windows without a rescan); otherwise it rescans them.
Feed feed(const std::vector<TraceFile>& complete, const Options& options, unsigned seed,
          bool report = true) {
  std::vector<TraceFile> live = complete;
  for (TraceFile& file : live) file.records.clear();
  std::vector<size_t> next(complete.size(), 0);
  struct Later {
    size_t file;
    size_t index;
  };
  std::vector<Later> completions;  // records sent as issued whose completion is still to come
  std::mt19937 random(seed);
  IncrementalAnalysis incremental;
  Feed result;
  for (int batch = 0;; ++batch) {
    uint64_t first = 0;  // the communicator of this batch's last record
    std::vector<size_t> open;
    for (size_t f = 0; f < complete.size(); ++f) {
      if (next[f] < complete[f].records.size()) open.push_back(f);
    }
    if (open.empty() && completions.empty()) break;
    if (!completions.empty() && (open.empty() || random() % 3 == 0)) {
      size_t pick = random() % completions.size();
      Later later = completions[pick];
      completions.erase(completions.begin() + static_cast<std::ptrdiff_t>(pick));
      const CallRecord& final = complete[later.file].records[later.index];
      CallRecord before = live[later.file].records[later.index];
      live[later.file].records[later.index] = final;
      if (report) incremental.replaced(later.file, live[later.file], before, final);
      incremental.touch(final.commHash);
      first = final.commHash;
    } else {
      size_t f = open[random() % open.size()];
      int take = 1 + static_cast<int>(random() % 3);
      for (int i = 0; i < take && next[f] < complete[f].records.size(); ++i) {
        CallRecord record = complete[f].records[next[f]];
        if (record.state == RecordState::kCompleted && random() % 2 == 0) {
          record.state = RecordState::kIssued;
          record.startNs = record.completeNs = 0;
          completions.push_back({f, next[f]});
        }
        live[f].records.push_back(record);
        if (report) incremental.appended(f, live[f]);
        incremental.touch(record.commHash);
        first = record.commHash;
        ++next[f];
      }
    }
    Report full = ncclwatch::analysis::analyze(live, options);
    if (random() % 4 == 0) {
      // As the collector does on a triage divergence: this batch's communicator first. Its
      // verdicts must be the full pass's already, but for the straggler tally, which it keeps
      // from the last pass; that and the other touched ones follow next pass (checked below).
      Report early = incremental.analyzeFirst(live, options, {first});
      EXPECT_EQ(verdictsOn(full, first, false), verdictsOn(early, first, false))
          << "batch " << batch;
    }
    Report partial = incremental.analyze(live, options);
    std::string want = describe(full), got = describe(partial);
    EXPECT_EQ(want, got) << "after batch " << batch << " (seed " << seed << ")";
    if (want != got) break;
    for (const auto& job : full.jobs) result.verdictsSeen += static_cast<int>(job.verdicts.size());
  }
  result.partial = incremental.stats().partialPasses;
  result.full = incremental.stats().fullPasses;
  result.hang = incremental.stats().hangPasses;
  // The progress kept on arrival says what the alignment says, member by member.
  EXPECT_EQ(incremental.stats().progressDisagreements, 0u) << "seed " << seed;
  // Told every change, the passes never had to rescan a window (the first pass builds each).
  if (report) {
    EXPECT_EQ(incremental.stats().progressRebuilds, 0u) << "seed " << seed;
  }
  return result;
}

// The job alive and busy (not quiet): most passes can be partial.
Options running() {
  Options options;
  options.probeProcesses = false;
  options.nowNs = synthetic::kAnchorWall + 1000 * kMs + (kSteps + 1) * 10 * kMs;
  options.quietNs = 60'000 * kMs;
  for (int r = 0; r < kWorld; ++r) options.aliveRanks.push_back(r);
  return options;
}

// Quiet for longer than quietNs: the hang checks speak, every pass is full.
Options hung() {
  Options options = running();
  options.quietNs = 1 * kMs;
  return options;
}

// Every process ended (the crashed one without a clean shutdown).
Options ended() {
  Options options = running();
  options.aliveRanks.clear();
  return options;
}

class EveryBugClass : public ::testing::TestWithParam<std::string> {};

// Shuffles per bug class. Sanitized builds run 20-30 times slower: one shuffle keeps the test
// within its bound there (the plain build runs all three).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr unsigned kSeeds[] = {1u};
#else
constexpr unsigned kSeeds[] = {1u, 2u, 3u};
#endif

TEST_P(EveryBugClass, ManySmallShuffledBatchesGiveTheVerdictsOfOneFullPass) {
  std::vector<TraceFile> files = job(GetParam());
  for (unsigned seed : kSeeds) {
    Feed live = feed(files, running(), seed);
    // A healthy, live job is where partial passes pay: most passes must be partial.
    EXPECT_GT(live.partial, live.full) << "seed " << seed;
    // Quiet: the hang checks run in every pass, most of them partial ones.
    Feed quiet = feed(files, hung(), seed);
    EXPECT_GT(quiet.hang, quiet.full) << "seed " << seed;
    feed(files, ended(), seed);
    // A caller that does not say what changed: the windows are rescanned, the verdicts the same.
    feed(files, hung(), seed, false);
  }
}

INSTANTIATE_TEST_SUITE_P(Incremental, EveryBugClass,
                         ::testing::Values("none", "count", "dtype", "redop", "op", "skip", "extra",
                                           "peer", "color", "slow", "exit", "crash", "clean"),
                         [](const auto& info) { return info.param; });

// The classes the bugs must produce, so that the comparison above compares verdicts, not empty
// lists: every bug but none/slow/clean gives a finding in one full pass of the hung job.
TEST(Incremental, TheBugClassesGiveVerdicts) {
  for (std::string bug :
       {"count", "dtype", "redop", "op", "skip", "extra", "peer", "color", "exit", "crash"}) {
    Report report = ncclwatch::analysis::analyze(job(bug), hung());
    EXPECT_TRUE(report.hasFindings()) << bug << "\n" << describe(report);
  }
  Report slow = ncclwatch::analysis::analyze(job("slow"), running());
  ASSERT_EQ(slow.jobs.size(), 1u);
  bool straggler = false;
  for (const auto& v : slow.jobs[0].verdicts) {
    straggler |= v.kind == ncclwatch::analysis::VerdictKind::kStraggler;
  }
  EXPECT_TRUE(straggler) << describe(slow);
}

// Untouched communicators carry their verdicts over: a pass with nothing touched is partial,
// and a mismatch found before stays, with its first detection time.
TEST(Incremental, UntouchedCommunicatorsKeepTheirVerdicts) {
  std::vector<TraceFile> files = job("count");
  IncrementalAnalysis incremental;
  Options options = running();
  Report first = incremental.analyze(files, options);
  ASSERT_EQ(first.jobs.size(), 1u);
  ASSERT_FALSE(first.jobs[0].verdicts.empty());
  EXPECT_EQ(incremental.stats().fullPasses, 1u);
  options.nowNs += 5 * kMs;
  Report second = incremental.analyze(files, options);
  EXPECT_EQ(incremental.stats().partialPasses, 1u);
  EXPECT_EQ(incremental.stats().commsReanalysed, 0u);
  EXPECT_EQ(describe(first), describe(second));
  EXPECT_EQ(first.jobs[0].verdicts[0].detectionNs, second.jobs[0].verdicts[0].detectionNs);
  // A process that ends changes what the cross-communicator checks may say: a full pass.
  options.aliveRanks.pop_back();
  incremental.analyze(files, options);
  EXPECT_EQ(incremental.stats().fullPasses, 2u);
}

// A job of 1024 ranks, large enough for a pass to split its loops over threads
// (analysis/parallel.h): tensor-parallel comms of 8 and the world, a ring of sends and receives,
// rank 300 late at every collective (a straggler), `bug` "count": rank 517's fifth world
// allreduce of the wrong size, "half": that of ranks 512-1023 (each thread's share of the members
// then agrees within itself: only the comparison across them finds it); the last two steps stay
// issued.
std::vector<TraceFile> bigJob(const std::string& bug) {
  constexpr int kRanks = 1024, kTp = 8, kBigSteps = 8;
  std::vector<TraceFile> files;
  for (int r = 0; r < kRanks; ++r) {
    Rank rank(r, kRanks);
    rank.comm(kWorldComm, kRanks, r);
    rank.comm(kTpComm + r / kTp, kTp, r % kTp, kWorldComm, r / kTp);
    int64_t t = 1000 * kMs + (r % 64) * 1000;
    rank.call(kWorldComm, OpKind::kSplit, 0, RecordState::kCompleted, t, 0, 0, r / kTp);
    for (int step = 0; step < kBigSteps; ++step) {
      t += 10 * kMs;
      int64_t late = r == 300 ? 4 * kMs : 0;
      RecordState s = step >= kBigSteps - 2 ? RecordState::kIssued : RecordState::kCompleted;
      rank.call(kTpComm + r / kTp, OpKind::kAllReduce, 1024, s, t + late);
      bool wrongSize = (bug == "count" && r == 517) || (bug == "half" && r >= kRanks / 2);
      uint64_t count = wrongSize && step == 4 ? 2048 : 4096;
      rank.call(kWorldComm, OpKind::kAllReduce, count, s, t + 2 * kMs + late);
      if (step % 2 == 0) {
        RecordState ps = step < kBigSteps - 4 ? RecordState::kCompleted : RecordState::kIssued;
        rank.call(kWorldComm, OpKind::kSend, 256, ps, t + 3 * kMs, synthetic::kF32, 0,
                  (r + 1) % kRanks);
        rank.call(kWorldComm, OpKind::kRecv, 256, ps, t + 3 * kMs, synthetic::kF32, 0,
                  (r + kRanks - 1) % kRanks);
      }
    }
    files.push_back(rank.take());
  }
  return files;
}

// The first line where two reports differ, with its number ("" when equal): a 1024-rank report
// is too long to print whole.
std::string firstDifference(const std::string& a, const std::string& b) {
  std::istringstream left(a), right(b);
  std::string x, y;
  for (int line = 1;; ++line) {
    bool more = static_cast<bool>(std::getline(left, x));
    bool moreRight = static_cast<bool>(std::getline(right, y));
    if (!more && !moreRight) return "";
    if (!more || !moreRight || x != y) {
      return "line " + std::to_string(line) + ":\n  one thread:   " + (more ? x : "(end)") +
             "\n  four threads: " + (moreRight ? y : "(end)");
    }
  }
}

// Sanitized builds (20-30 times slower) check the threads' races on the divergence only the
// comparison across chunks finds, running and hung; the plain build runs every case.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
const char* const kParallelBugs[] = {"half"};
constexpr int kParallelShapes = 2;
#else
const char* const kParallelBugs[] = {"none", "count", "half"};
constexpr int kParallelShapes = 3;
#endif

// Members whose progress kept their aligned calls take them from there (Options::keptAlignment):
// the verdicts are those of aligning every member from its window's records, for every bug class,
// in the usual shape and the plain one (no sends or receives, nothing pending: where the kept
// calls are taken), running, hung and ended, in one pass and in a collector's batches.
TEST(KeptAlignment, SaysWhatAligningTheRecordsSays) {
  for (std::string bug : {"none", "count", "dtype", "redop", "op", "skip", "extra", "peer", "color",
                          "slow", "exit", "crash", "clean"}) {
    for (bool plain : {false, true}) {
      std::vector<TraceFile> files = job(bug, plain);
      for (Options options : {running(), hung(), ended()}) {
        options.keptAlignmentMinRanks = 1;  // this job's 8 ranks keep them too
        Options fromRecords = options;
        fromRecords.keptAlignment = false;
        std::string kept = describe(ncclwatch::analysis::analyze(files, options));
        EXPECT_EQ(firstDifference(kept, describe(ncclwatch::analysis::analyze(files, fromRecords))),
                  "")
            << bug << (plain ? ", plain" : "");
      }
      // The collector's way: the progress kept as records arrive, complete and are replaced.
      Options keeping = running();
      keeping.keptAlignmentMinRanks = 1;
      feed(files, keeping, 1);
      IncrementalAnalysis incremental, byDefault;
      incremental.analyze(files, keeping);
      if (plain) {
        EXPECT_GT(incremental.stats().membersFromKept, 0u) << bug;
        if (bug == "none") {
          EXPECT_EQ(incremental.stats().membersFromRecords, 0u);
        }
      }
      // By default communicators of fewer than 64 ranks keep none.
      byDefault.analyze(files, running());
      EXPECT_EQ(byDefault.stats().membersFromKept, 0u) << bug;
    }
  }
}

// Threads change how fast a pass is, never what it says: one thread and four give the same
// report for a healthy job (stragglers), a mismatch, a hung job and an ended one, in full passes
// and in the partial pass a divergence runs.
TEST(Parallel, FourThreadsSayWhatOneThreadSays) {
  for (std::string bug : kParallelBugs) {
    std::vector<TraceFile> files = bigJob(bug);
    for (int shape = 0; shape < kParallelShapes; ++shape) {
      Options options = shape == 0 ? running() : shape == 1 ? hung() : ended();
      options.aliveRanks.clear();
      for (int r = 0; r < 1024 && shape < 2; ++r) options.aliveRanks.push_back(r);
      Options threaded = options;
      threaded.threads = 4;
      std::string one = describe(ncclwatch::analysis::analyze(files, options));
      std::string four = describe(ncclwatch::analysis::analyze(files, threaded));
      EXPECT_EQ(firstDifference(one, four), "") << bug << ", shape " << shape;
      IncrementalAnalysis single, parallel;
      single.analyze(files, options);
      parallel.analyze(files, threaded);
      single.touch(kWorldComm);
      parallel.touch(kWorldComm);
      EXPECT_EQ(firstDifference(describe(single.analyzeFirst(files, options, {kWorldComm})),
                                describe(parallel.analyzeFirst(files, threaded, {kWorldComm}))),
                "")
          << bug << ", shape " << shape << ", a divergence's pass";
    }
  }
  // What the comparison compares: a straggler in the healthy job, the mismatch in the other.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return;  // what the plain build checks below
#endif
  Options alive = running();
  for (int r = kWorld; r < 1024; ++r) alive.aliveRanks.push_back(r);
  Report slow = ncclwatch::analysis::analyze(bigJob("none"), alive);
  Report count = ncclwatch::analysis::analyze(bigJob("count"), alive);
  Report half = ncclwatch::analysis::analyze(bigJob("half"), alive);
  EXPECT_NE(describe(slow).find("straggler"), std::string::npos) << describe(slow);
  EXPECT_NE(describe(count).find("mismatch"), std::string::npos) << describe(count);
  EXPECT_NE(describe(half).find("mismatch"), std::string::npos) << describe(half);
}

}  // namespace
