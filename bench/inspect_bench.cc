// Times the cross-rank analysis on synthetic traces: 1024 ranks x 16384 records (a hybrid
// TP/DP/world training loop with p2p), with one rank's last bucket of the wrong size so that
// every check runs. Budget: 3 s on a 2-core machine. Then the timing side (computeStragglers) on
// the same traces. With --live: the same job healthy and running (every call completed, no bug,
// every rank alive), the pass the collector runs every few hundred ms while a job is active:
// three passes, each one's CPU time. Then the same job hung: the world's last allreduce waits on
// every rank but one that never issued it, nothing moved for longer than quietNs: the pass the
// collector runs every few hundred ms once a job goes quiet (the hang checks on), full
// (analysis::analyze) and as the collector's IncrementalAnalysis runs it with nothing arriving.
// With --collector: the shape bench/collector_load sends
// (tensor-parallel comms of 8 and the world, allreduces alternating between them, no p2p), live,
// with rank 17's last world allreduce of the wrong count: the passes a collector runs when that
// mismatch arrives, the divergence's own pass over the world communicator above all.
// --threads=N: the analysis' Options::threads (1 by default).
// Usage: inspect_bench [--live | --collector] [--threads=N] [RANKS] [RECORDS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/incremental.h"
#include "analysis/timing.h"
#include "bench/cpu_time.h"
#include "trace/fingerprint.h"

namespace {

using ncclwatch::bench::processCpuSeconds;

using ncclwatch::trace::CallRecord;
using ncclwatch::trace::OpKind;
using ncclwatch::trace::RecordState;
using ncclwatch::trace::TraceFile;

constexpr int kTp = 8;
constexpr uint64_t kWorldHash = 0xabc;
bool g_live = false;       // --live: a healthy job that is still running
bool g_collector = false;  // --collector: collector_load's shape, live, one mismatch
int g_threads = 1;         // --threads=N: Options::threads

TraceFile makeRank(int rank, int world, int records) {
  TraceFile file;
  file.usable = true;
  file.path = "/bench/r" + std::to_string(rank) + ".ncclwatch";
  auto& h = file.header;
  std::memcpy(h.magic, "NCCLWTCH", 8);
  h.rank = rank;
  h.world = world;
  h.pid = 10000 + rank;
  h.anchorRealtimeNs = 1'800'000'000'000'000'000;
  std::strcpy(h.host, "bench");
  std::strcpy(h.jobId, "bench");
  int dp = world / kTp;
  uint64_t worldHash = kWorldHash, tpHash = 0x1000 + rank / kTp, dpHash = 0x2000 + rank % kTp;
  auto comm = [&](uint64_t hash, int n, int r, uint64_t parent, int color) {
    ncclwatch::trace::CommInfo info{};
    info.commHash = hash;
    info.parentHash = parent;
    info.nranks = n;
    info.rank = r;
    info.color = color;
    file.comms.push_back(info);
  };
  comm(worldHash, world, rank, 0, -1);
  comm(tpHash, kTp, rank % kTp, worldHash, rank / kTp);
  if (!g_collector) comm(dpHash, dp, rank / kTp, worldHash, rank % kTp);
  uint64_t seqWorld = 0, seqTp = 0, seqDp = 0, sends = 0, recvs = 0;
  file.records.reserve(records);
  int64_t t = 1'000'000;
  if (g_collector) {
    for (int call = 0; call < records; ++call) {
      bool onWorld = call % 2 == 1;
      CallRecord r{};
      r.commHash = onWorld ? worldHash : tpHash;
      r.seq = onWorld ? ++seqWorld : ++seqTp;
      r.op = OpKind::kAllReduce;
      r.count = onWorld ? 25u << 20 : 4u << 20;
      if (onWorld && rank == 17 && call >= records - 2) r.count /= 2;  // the mismatch
      r.dtype = 9;
      r.redop = 0;
      r.rootOrPeer = -1;
      r.stream = onWorld ? 0xa0 : 0xb0;
      r.issueNs = t += 10'000 + (rank % 64) * 10;
      r.state = RecordState::kCompleted;
      r.startNs = t + 100;
      r.completeNs = t + 5'000;
      r.fingerprint = ncclwatch::trace::fingerprint({r.op, r.count, 9, 0, -1});
      r.ringIndex = file.records.size();
      file.records.push_back(r);
    }
    return file;
  }
  int steps = records / 8;
  for (int step = 0; step < steps; ++step) {
    bool last = !g_live && step == steps - 1;
    auto add = [&](uint64_t hash, uint64_t& seq, OpKind op, uint64_t count, int peer) {
      CallRecord r{};
      r.commHash = hash;
      r.seq = ++seq;
      r.op = op;
      r.count = count;
      r.dtype = 7;
      r.rootOrPeer = peer;
      r.stream = 1;
      r.issueNs = t += 1000 + (rank * 7 + step) % 50;
      r.state = last ? RecordState::kStarted : RecordState::kCompleted;
      r.startNs = t + 100;
      r.completeNs = last ? 0 : t + 200;
      if (op == OpKind::kSend) r.p2pSeq = ++sends;
      if (op == OpKind::kRecv) r.p2pSeq = ++recvs;
      r.fingerprint = ncclwatch::trace::fingerprint({op, count, 7, 0, peer});
      r.ringIndex = file.records.size();
      file.records.push_back(r);
    };
    uint64_t bucket = last && rank == 517 ? 4095 : 4096;  // the bug (not in a live job)
    add(tpHash, seqTp, OpKind::kAllReduce, 1024, -1);
    add(dpHash, seqDp, OpKind::kAllReduce, bucket, -1);
    add(dpHash, seqDp, OpKind::kAllReduce, 2048, -1);
    add(dpHash, seqDp, OpKind::kAllGather, 256, -1);
    add(worldHash, seqWorld, OpKind::kSend, 512, (rank + 1) % world);
    add(worldHash, seqWorld, OpKind::kRecv, 512, (rank + world - 1) % world);
    add(worldHash, seqWorld, OpKind::kBroadcast, 1, 0);
    add(worldHash, seqWorld, OpKind::kAllReduce, 1, -1);
  }
  return file;
}

// The collector's pass over a live, healthy job: every rank alive, the last call just made.
int livePasses(const std::vector<TraceFile>& files, int ranks, int records) {
  ncclwatch::analysis::Options options;
  options.probeProcesses = false;
  options.threads = g_threads;
  int64_t last = 0;
  for (const TraceFile& file : files) {
    options.aliveRanks.push_back(file.header.rank);
    last = std::max(last, file.records.back().completeNs + file.header.anchorRealtimeNs -
                              file.header.anchorMonotonicNs);
  }
  options.nowNs = last + 1'000'000;
  double total = static_cast<double>(ranks) * (records / 8 * 8);
  for (int pass = 0; pass < 3; ++pass) {
    double cpuStart = processCpuSeconds();
    auto start = std::chrono::steady_clock::now();
    ncclwatch::analysis::Report report = ncclwatch::analysis::analyze(files, options);
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double cpu = processCpuSeconds() - cpuStart;
    size_t verdicts = report.jobs.empty() ? 0 : report.jobs[0].verdicts.size();
    std::printf(
        "inspect_bench --live: %d ranks x %d records, pass %d: CPU %.3f s, %.1f M "
        "records/CPU s, wall %.3f s (%d threads), %zu verdicts\n",
        ranks, records, pass + 1, cpu, total / cpu / 1e6, wall, g_threads, verdicts);
  }
  // What a divergence on the world communicator costs the collector: the incremental pass that
  // redoes that communicator alone (IncrementalAnalysis::analyzeFirst), after a full one.
  ncclwatch::analysis::IncrementalAnalysis incremental;
  // As the collector, which reports every record it stores: the passes keep each window's
  // progress (analysis/comm_progress.h) instead of rescanning it.
  for (size_t f = 0; f < files.size(); ++f) incremental.reshaped(f, files[f]);
  incremental.analyze(files, options);
  for (int pass = 0; pass < 3; ++pass) {
    incremental.touch(kWorldHash);
    double cpuStart = processCpuSeconds();
    auto start = std::chrono::steady_clock::now();
    ncclwatch::analysis::Report report = incremental.analyzeFirst(files, options, {kWorldHash});
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double cpu = processCpuSeconds() - cpuStart;
    std::printf(
        "inspect_bench --live: the world communicator alone (a divergence's pass) %d: "
        "CPU %.3f s, wall %.3f s (%d threads), %s\n",
        pass + 1, cpu, wall, g_threads, incremental.stats().partialPasses > 0 ? "partial" : "full");
  }
  std::string why;
  for (const auto& [reason, count] : incremental.stats().fullBecause)
    why += " " + reason + ":" + std::to_string(count);
  std::printf("inspect_bench --live: %llu full passes (%s), %llu partial\n",
              static_cast<unsigned long long>(incremental.stats().fullPasses), why.c_str() + 1,
              static_cast<unsigned long long>(incremental.stats().partialPasses));
  return 0;
}

// The job of livePasses hung: the world's last allreduce started on every rank but `missing`,
// which never issued it; every rank alive and silent for longer than quietNs.
void hungPasses(std::vector<TraceFile>& files, int ranks) {
  ncclwatch::analysis::Options options;
  options.probeProcesses = false;
  options.threads = g_threads;
  const int missing = ranks / 2 + 5;
  int64_t last = 0;
  for (TraceFile& file : files) {
    options.aliveRanks.push_back(file.header.rank);
    if (file.header.rank == missing) {
      file.records.pop_back();
    } else {
      CallRecord& r = file.records.back();
      r.state = RecordState::kStarted;
      r.completeNs = 0;
    }
    const CallRecord& r = file.records.back();
    last = std::max(last, std::max(r.startNs, r.completeNs) + file.header.anchorRealtimeNs -
                              file.header.anchorMonotonicNs);
  }
  options.nowNs = last + 2 * options.quietNs;
  auto verdictText = [](const ncclwatch::analysis::Report& report) {
    if (report.jobs.empty() || report.jobs[0].verdicts.empty()) return std::string("none");
    const auto& v = report.jobs[0].verdicts[0];
    return std::string(ncclwatch::analysis::kindName(v.kind)) + " culprits " +
           ncclwatch::analysis::formatRanks(v.culprits);
  };
  for (int pass = 0; pass < 2; ++pass) {
    double cpuStart = processCpuSeconds();
    ncclwatch::analysis::Report report = ncclwatch::analysis::analyze(files, options);
    double cpu = processCpuSeconds() - cpuStart;
    std::printf("inspect_bench --live: hung, quiet, full pass %d: CPU %.3f s, first verdict %s\n",
                pass + 1, cpu, verdictText(report).c_str());
  }
  // The collector's passes while the hung job stays quiet: nothing arrives between them.
  ncclwatch::analysis::IncrementalAnalysis incremental;
  for (size_t f = 0; f < files.size(); ++f) incremental.reshaped(f, files[f]);
  for (int pass = 0; pass < 4; ++pass) {
    uint64_t redoneBefore = incremental.stats().commsReanalysed;
    uint64_t partialBefore = incremental.stats().partialPasses;
    double cpuStart = processCpuSeconds();
    ncclwatch::analysis::Report report = incremental.analyze(files, options);
    double cpu = processCpuSeconds() - cpuStart;
    bool partial = incremental.stats().partialPasses > partialBefore;
    std::printf(
        "inspect_bench --live: hung, quiet, the collector's pass %d: CPU %.3f s, %s (%llu comms "
        "re-aligned), first verdict %s\n",
        pass + 1, cpu, partial ? "partial" : "full",
        static_cast<unsigned long long>(incremental.stats().commsReanalysed - redoneBefore),
        verdictText(report).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (; argc > 1 && std::strncmp(argv[1], "--", 2) == 0; --argc, ++argv) {
    if (std::strcmp(argv[1], "--live") == 0 || std::strcmp(argv[1], "--collector") == 0) {
      g_live = true;
      g_collector = argv[1][2] == 'c';
    } else if (std::strncmp(argv[1], "--threads=", 10) == 0 && std::atoi(argv[1] + 10) > 0) {
      g_threads = std::atoi(argv[1] + 10);
    } else {
      std::fprintf(stderr, "inspect_bench: unknown option %s\n", argv[1]);
      return 2;
    }
  }
  int ranks = argc > 1 ? std::atoi(argv[1]) : 1024;
  int records = argc > 2 ? std::atoi(argv[2]) : 16384;
  if (ranks < kTp || ranks % kTp != 0 || records < 8) {
    std::fprintf(
        stderr,
        "usage: inspect_bench [--live | --collector] [--threads=N] [RANKS (multiple of 8)] "
        "[RECORDS (>= 8)]\n");
    return 2;
  }
  std::vector<TraceFile> files;
  files.reserve(ranks);
  for (int r = 0; r < ranks; ++r) files.push_back(makeRank(r, ranks, records));
  if (g_live) {
    livePasses(files, ranks, records);
    if (!g_collector) hungPasses(files, ranks);
    return 0;
  }
  ncclwatch::analysis::Options options;
  options.probeProcesses = false;
  options.threads = g_threads;
  auto start = std::chrono::steady_clock::now();
  double cpuStart = processCpuSeconds();
  ncclwatch::analysis::Report report = ncclwatch::analysis::analyze(files, options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double cpu = processCpuSeconds() - cpuStart;
  double total = static_cast<double>(ranks) * (records / 8 * 8);
  size_t verdicts = report.jobs.empty() ? 0 : report.jobs[0].verdicts.size();
  std::printf(
      "inspect_bench: %d ranks x %d records: %.3f s, %.1f M records/s (CPU %.3f s, %.1f M "
      "records/CPU s), %zu verdicts%s\n",
      ranks, records, seconds, total / seconds / 1e6, cpu, total / cpu / 1e6, verdicts,
      seconds <= 3.0 ? "" : " (over the 3 s budget)");
  if (verdicts > 0) {
    const auto& v = report.jobs[0].verdicts[0];
    std::printf("first verdict: %s, culprits %s\n", ncclwatch::analysis::kindName(v.kind),
                ncclwatch::analysis::formatRanks(v.culprits).c_str());
  }
  // The timing side (`ncclwatch stragglers`, timeline) on the same traces: collectives matched
  // across ranks, clocks aligned, lateness per rank.
  start = std::chrono::steady_clock::now();
  cpuStart = processCpuSeconds();
  ncclwatch::analysis::StragglerReport stragglers = ncclwatch::analysis::computeStragglers(files);
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  cpu = processCpuSeconds() - cpuStart;
  std::printf(
      "stragglers: %.3f s, %.1f M records/s (CPU %.3f s, %.1f M records/CPU s), %zu comms\n",
      seconds, total / seconds / 1e6, cpu, total / cpu / 1e6, stragglers.comms.size());
  return 0;
}
