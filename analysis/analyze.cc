// The cross-rank analysis. Outline (docs/verdicts.md has the rules as users see them):
//  1. Files are grouped into jobs: job id, then attempt (the k-th process of a rank is attempt k).
//  2. Each communicator's members are aligned on their non-p2p calls: a call's ordinal is its seq
//     minus the p2p calls before it (p2p patterns need not be symmetric); p2p calls pair on
//     (sender, receiver, p2pSeq).
//  3. Structural checks need no timing: fingerprint mismatches, split colours, p2p mismatches.
//  4. Hang checks run only when the job stopped making progress: every process ended with a call
//     pending, or none recorded anything for `quietNs`. They use a wait-for graph whose nodes are
//     ranks and whose arcs come from the head of each stream (a call cannot start before the
//     earlier calls on its stream complete): cycles are deadlocks, fully present heads are stuck,
//     ranks the others wait for are missing or dead.
#include "analysis/analyze.h"
#include "analysis/in_nccl.h"
#include "analysis/incremental.h"
#include "analysis/issued_at.h"
#include "analysis/job_state.h"
#include "analysis/parallel.h"
#include "analysis/sort_by_index.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "analysis/describe.h"

namespace ncclwatch::analysis {
namespace internal {

JobReport JobAnalysis::run(const std::string& jobId, int attempt) {
  JobReport report;
  report.jobId = jobId;
  report.attempt = attempt;
  sortByIndex(procs_, [](const Proc& a, const Proc& b) { return a.rank < b.rank; });
  for (const Proc& proc : procs_) report.world = std::max(report.world, proc.file->header.world);
  // A partial pass (incremental.h) when the kept per-comm results are still good: the same
  // processes and memberships, no shrink (its parent's alignment is cut where the survivors
  // shrank), no kept verdict about ranks on other communicators. When the cross-communicator
  // checks may have something to say (the job quiet, a process gone, a failed call...), the
  // partial pass runs them too, over the communicators not done (chooseRedo).
  uint64_t id = cache_ != nullptr ? identity() : 0;
  if (cache_ == nullptr || dirty_ == nullptr) {
    whyFull_ = "first";
  } else if (hasShrink()) {
    whyFull_ = "shrink";
  } else if (cache_->identity != id) {
    whyFull_ = "changed";
  } else if (!cache_->valid) {
    whyFull_ = cache_->comms.empty() ? "first" : "absent";
  } else {
    partial_ = true;
    const char* notQuiet = crossCommChecksQuiet();
    hangChecks_ = *notQuiet != '\0';
    whyHang_ = notQuiet;
    redo_ = *dirty_;
  }
  if (cache_ != nullptr) {
    cache_->valid = false;  // until this pass completes
    if (!partial_) cache_->comms.clear();
  }
  auto openingChecks = [this] {
    excludeShrunkMembers();
    decideStalled();
    // The hang families below look across communicators; when crossCommChecksQuiet() holds
    // they find nothing (each needs a process gone, a failed call or a quiet job), so a partial
    // pass skips them; otherwise it runs them over the communicators not done (chooseRedo).
    if (hangFamilies()) {
      checkErrors();
      checkInit();
    }
    checkMismatches();
  };
  buildComms();
  openingChecks();
  if (abandoned_) {
    // A mismatch with absent members says where they are, which needs their other
    // communicators: align those too (the pass is a full one from here), and start the checks
    // over.
    abandoned_ = false;
    whyFull_ = "absent";
    alignSkipped();
    verdicts_.clear();
    cache_->comms.clear();
    openingChecks();
  }
  if (hangFamilies()) checkDeadAndMissing();
  checkP2p();
  if (hangFamilies()) checkGraph();
  checkStragglers();
  if (cache_ != nullptr) {
    bool readsOthers = false;
    for (const auto& [hash, kept] : cache_->comms) readsOthers |= kept.readsOtherComms;
    cache_->valid = !readsOthers;
    cache_->identity = id;
  }
  finishVerdicts();
  assessConfidence();
  addStackTops();
  report.stalled = stalled_;
  report.ended = ended_;
  report.processes.reserve(procs_.size());
  for (const Proc& proc : procs_) {
    ProcessSummary ps;
    ps.path = proc.file->path;
    ps.rank = proc.rank;
    ps.world = proc.file->header.world;
    ps.host.assign(proc.file->header.host,
                   strnlen(proc.file->header.host, sizeof proc.file->header.host));
    ps.pid = proc.file->header.pid;
    ps.cleanShutdown = proc.clean;
    ps.exitStatus = proc.exitStatus;
    ps.alive = proc.alive;
    ps.records = proc.file->records.size();
    ps.lastActivityNs = proc.lastActivity;
    report.processes.push_back(std::move(ps));
  }
  report.verdicts = std::move(verdicts_);
  summarize(report);
  noteEvidenceGaps(report);
  report.readAtNs = now_;
  report.lastActivityNs = jobLastActivity_;
  return report;
}

const char* JobAnalysis::crossCommChecksQuiet() const {
  int64_t last = 0;
  for (const Proc& proc : procs_) {
    if (!proc.alive) return "gone";
    last = std::max(last, proc.lastActivity);
    // Never created a communicator: an init hang once the job goes quiet (checkInit).
    if (proc.file->comms.empty()) return "no_comm";
    if (proc.failed) return "failed";
  }
  if (now_ - last >= options_.quietNs) return "quiet";
  return "";
}

bool JobAnalysis::hasShrink() const {
  for (const Proc& proc : procs_) {
    for (const trace::CommInfo& info : proc.file->comms) {
      if (info.kind == static_cast<int>(OpKind::kShrink)) return true;
    }
  }
  return false;
}

uint64_t JobAnalysis::identity() const {
  uint64_t h = trace::mix64(procs_.size());
  auto add = [&h](uint64_t v) { h = trace::mix64(h ^ v) + 0x9e3779b97f4a7c15ULL; };
  for (const Proc& proc : procs_) {
    const trace::RingHeader& header = proc.file->header;
    add(static_cast<uint64_t>(proc.rank));
    add(static_cast<uint64_t>(header.pid));
    add(static_cast<uint64_t>(header.world));
    add(static_cast<uint64_t>(proc.toWall));
    add((proc.alive ? 1 : 0) | (proc.clean ? 2 : 0));
    for (const trace::CommInfo& info : proc.file->comms) {
      add(info.commHash);
      add(static_cast<uint64_t>(info.rank) << 32 | static_cast<uint32_t>(info.nranks));
      add(info.parentHash);
      add(static_cast<uint64_t>(info.color) << 32 | static_cast<uint32_t>(info.kind));
    }
  }
  return h;
}

}  // namespace internal

namespace {

using internal::CallRecord;
using internal::JobAnalysis;
using internal::Proc;

std::string hostName() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// Whether `pid` on this host still maps the trace file (pids are reused; the mapping is not).
bool stillRunning(const trace::TraceFile& file) {
  std::ifstream maps("/proc/" + std::to_string(file.header.pid) + "/maps");
  if (!maps) return false;
  std::string base = file.path.substr(file.path.find_last_of('/') + 1);
  std::string line;
  while (std::getline(maps, line)) {
    if (line.size() >= base.size() &&
        line.compare(line.size() - base.size(), base.size(), base) == 0) {
      return true;
    }
  }
  return false;
}

}  // namespace

CallDesc describeCall(const CallRecord& r) {
  CallDesc d;
  d.op = r.op;
  d.seq = r.seq;
  d.count = r.count;
  d.dtype = r.dtype;
  d.redop = trace::hasReduction(r.op) ? r.redop : -1;
  d.rootOrPeer = r.rootOrPeer;
  d.p2pSeq = r.p2pSeq;
  d.state = r.state;
  d.startInferred =
      r.state == trace::RecordState::kStarted && (r.flags & trace::kRecordStartInferred) != 0;
  d.callSite = r.callSite;
  d.threadId = r.threadId;
  d.commHash = r.commHash;
  return d;
}

bool runningHere(const trace::TraceFile& file) {
  return onThisHost(file) && stillRunning(file);
}

bool stoppedHere(const trace::TraceFile& file) {
  if (!runningHere(file)) return false;
  std::ifstream stat("/proc/" + std::to_string(file.header.pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  // "pid (comm) S ...": the command may hold spaces and parentheses; the state follows the last.
  size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  char state = line[close + 2];
  return state == 'T' || state == 't';
}

bool onThisHost(const trace::TraceFile& file) {
  return std::string(file.header.host, strnlen(file.header.host, sizeof file.header.host)) ==
         hostName();
}

const char* kindName(VerdictKind kind) {
  switch (kind) {
    case VerdictKind::kMismatch:
      return "mismatch";
    case VerdictKind::kMissing:
      return "missing";
    case VerdictKind::kUnmatchedP2p:
      return "unmatched_p2p";
    case VerdictKind::kStuck:
      return "stuck";
    case VerdictKind::kDeadlock:
      return "deadlock";
    case VerdictKind::kDeadRank:
      return "dead_rank";
    case VerdictKind::kInitHang:
      return "init_hang";
    case VerdictKind::kStraggler:
      return "straggler";
    case VerdictKind::kError:
      return "error";
  }
  return "unknown";
}

const char* effectName(Effect effect) {
  switch (effect) {
    case Effect::kHang:
      return "hang";
    case Effect::kSilentDataCorruption:
      return "silent_data_corruption";
    case Effect::kError:
      return "error";
    case Effect::kInformation:
      return "information";
  }
  return "unknown";
}

const char* confidenceLevel(double confidence) {
  return confidence >= 0.9 ? "high" : confidence >= 0.6 ? "medium" : "low";
}

// The names and texts of nccl.h's ncclResult_t values (NCCL's ncclGetErrorString wording).
const char* ncclResultName(int result) {
  static const char* const kNames[] = {
      "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
      "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
  return result >= 0 && result < 8 ? kNames[result] : "ncclResult?";
}

const char* ncclResultText(int result) {
  static const char* const kTexts[] = {"no error",
                                       "unhandled cuda error",
                                       "unhandled system error",
                                       "internal error",
                                       "invalid argument",
                                       "invalid usage",
                                       "remote process exited or there was a network error",
                                       "NCCL operation in progress"};
  return result >= 0 && result < 8 ? kTexts[result] : "unknown result";
}

bool Report::hasFindings() const {
  for (const JobReport& job : jobs) {
    for (const Verdict& v : job.verdicts) {
      if (v.kind != VerdictKind::kStraggler) return true;
    }
  }
  return false;
}

std::string namedRanks(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + formatRanks(ranks);
}

std::string formatRanks(std::vector<int> ranks) {
  if (!std::is_sorted(ranks.begin(), ranks.end())) std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

namespace internal {

Report analyzeJobs(std::span<const trace::TraceFile> files, const Options& options,
                   IncrementalState* incremental) {
  int64_t now = options.nowNs;
  if (now == 0) {
    now = std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::system_clock::now().time_since_epoch())
              .count();
  }
  std::string host = options.probeProcesses ? hostName() : "";
  // Sorted once: a linear search per process was quadratic (~5e8 compares a pass at 32,768).
  std::vector<int> aliveRanks = options.aliveRanks;
  std::sort(aliveRanks.begin(), aliveRanks.end());
  // Each file's progress (comm_progress.h): kept between passes when the caller reports what
  // changed (IncrementalAnalysis::appended...), else built from its records here (files split
  // over Options::threads). It holds what the passes read of each process's records (pending,
  // failed, tracked and shed calls, the latest time): no scan of them per pass.
  std::vector<ProcessProgress> built;
  std::vector<ProcessProgress>* progress = &built;
  if (incremental == nullptr) {
    built.resize(files.size());
  } else {
    if (incremental->progress.size() < files.size()) {
      incremental->progress.resize(files.size());
      incremental->fed.resize(files.size(), 0);
    }
    progress = &incremental->progress;
  }
  std::vector<uint64_t> rebuilt(chunkCount(files.size(), options.threads), 0);
  parallelChunks(files.size(), options.threads, [&](size_t chunk, size_t begin, size_t end) {
    for (size_t f = begin; f < end; ++f) {
      const trace::TraceFile& file = files[f];
      if (!file.usable) continue;
      ProcessProgress& kept = (*progress)[f];
      if (kept.keepsAlignedFrom() != options.keptAlignmentMinRanks) {
        kept.keepAlignedFrom(options.keptAlignmentMinRanks);
        kept.rebuild(file);
      } else if (incremental == nullptr || !incremental->fed[f]) {
        kept.rebuild(file);  // offline, or a caller that does not say what changes
      } else if (!kept.follows(file)) {
        kept.rebuild(file);
        ++rebuilt[chunk];
      }
    }
  });
  if (incremental != nullptr) {
    for (uint64_t count : rebuilt) incremental->stats.progressRebuilds += count;
  }
  // job id -> its processes in start order
  std::map<std::string, std::vector<const trace::TraceFile*>> byJob;
  for (const trace::TraceFile& file : files) {
    if (!file.usable) continue;
    std::string job(trace::jobIdOf(file.header));
    byJob[job].push_back(&file);
  }
  Report report;
  for (auto& [job, list] : byJob) {
    std::stable_sort(list.begin(), list.end(), [](auto* a, auto* b) {
      return a->header.anchorRealtimeNs < b->header.anchorRealtimeNs;
    });
    // Each process's attempt: how many processes of its rank started before it. By a stable
    // sort of their places on rank (a map of the ranks took 32,768 tree nodes a pass).
    std::vector<uint32_t> byRank(list.size());
    std::iota(byRank.begin(), byRank.end(), 0u);
    const std::vector<const trace::TraceFile*>& started = list;  // clang: no captured bindings
    std::stable_sort(byRank.begin(), byRank.end(), [&started](uint32_t a, uint32_t b) {
      return started[a]->header.rank < started[b]->header.rank;
    });
    std::vector<int> attemptOf(list.size(), 0);
    for (size_t i = 1; i < byRank.size(); ++i) {
      int rank = list[byRank[i]]->header.rank;
      if (rank >= 0 && rank == list[byRank[i - 1]]->header.rank) {
        attemptOf[byRank[i]] = attemptOf[byRank[i - 1]] + 1;
      }
    }
    std::map<int, std::vector<Proc>> attempts;
    attempts[0].reserve(list.size());
    for (size_t at = 0; at < list.size(); ++at) {
      const trace::TraceFile* file = list[at];
      Proc proc;
      proc.file = file;
      proc.records = file->records.range();
      proc.rank = file->header.rank;
      int attempt = attemptOf[at];
      proc.toWall = file->header.anchorRealtimeNs - file->header.anchorMonotonicNs;
      proc.clean = file->header.cleanShutdown != 0;
      if (file->header.exitStatusKnown != 0) proc.exitStatus = file->header.exitStatus;
      std::string fileHost(file->header.host, strnlen(file->header.host, sizeof file->header.host));
      if (options.probeProcesses) {
        proc.alive = !proc.clean && fileHost == host && stillRunning(*file);
      } else {
        proc.alive = std::binary_search(aliveRanks.begin(), aliveRanks.end(), proc.rank);
      }
      const ProcessProgress& kept = (*progress)[static_cast<size_t>(file - files.data())];
      proc.progress = &kept;
      int64_t last =
          std::max({file->header.anchorMonotonicNs, kept.latestRecordNs(), file->foldedLatestNs});
      proc.pending = kept.pendingCalls() > 0;
      proc.failed = kept.failedCalls() > 0;
      proc.calls = kept.calls();
      proc.anyTracked = kept.trackedCalls() > 0;
      proc.shed = kept.shed();
      for (const trace::CommInfo& c : file->comms) last = std::max(last, c.createdNs);
      proc.lastActivity = proc.wall(last);
      attempts[attempt].push_back(proc);
    }
    for (auto& [attempt, procs] : attempts) {
      if (incremental == nullptr) {
        JobAnalysis analysis(std::move(procs), options, now);
        report.jobs.push_back(analysis.run(job, attempt));
        continue;
      }
      JobCache& cache = incremental->jobs[job + "/" + std::to_string(attempt)];
      JobAnalysis analysis(std::move(procs), options, now, &cache,
                           incremental->all ? nullptr : &incremental->dirty);
      if (incremental->divergencePass)
        analysis.deferStragglerTallies(&incremental->talliesDeferred);
      JobReport result = analysis.run(job, attempt);
      incremental->stats.progressDisagreements += analysis.progressDisagreements();
      incremental->stats.membersFromKept += analysis.membersFromKept();
      incremental->stats.membersFromRecords += analysis.membersFromRecords();
      if (analysis.partial()) {
        ++incremental->stats.partialPasses;
        if (analysis.hangChecks()) {
          ++incremental->stats.hangPasses;
          ++incremental->stats.hangBecause[analysis.whyHangChecks()];
        }
        incremental->stats.commsReanalysed += analysis.commsRedone();
        incremental->stats.commsCarried += result.comms.size() - analysis.commsRedone();
      } else {
        ++incremental->stats.fullPasses;
        ++incremental->stats.fullBecause[analysis.whyFull()];
      }
      report.jobs.push_back(std::move(result));
    }
  }
  annotateInNccl(report, files);
  annotateIssuedAt(report, files);
  // Written last: it quotes the first cause's explanation, which the Python lines add to.
  for (JobReport& job : report.jobs) {
    job.summary = whatHappened(job, job.readAtNs, job.lastActivityNs);
  }
  return report;
}

}  // namespace internal

Report analyze(std::span<const trace::TraceFile> files, const Options& options) {
  return internal::analyzeJobs(files, options, nullptr);
}

}  // namespace ncclwatch::analysis
