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
#include "analysis/issued_at.h"
#include "analysis/job_state.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "analysis/describe.h"

namespace ncclwatch::analysis {
namespace internal {

JobReport JobAnalysis::run(const std::string& jobId, int attempt) {
  JobReport report;
  report.jobId = jobId;
  report.attempt = attempt;
  std::sort(procs_.begin(), procs_.end(),
            [](const Proc& a, const Proc& b) { return a.rank < b.rank; });
  for (const Proc& proc : procs_) report.world = std::max(report.world, proc.file->header.world);
  buildComms();
  excludeShrunkMembers();
  decideStalled();
  checkErrors();
  checkInit();
  checkMismatches();
  checkDeadAndMissing();
  checkP2p();
  checkGraph();
  checkStragglers();
  finishVerdicts();
  assessConfidence();
  addStackTops();
  report.stalled = stalled_;
  report.ended = ended_;
  for (const Proc& proc : procs_) {
    ProcessSummary ps;
    ps.path = proc.file->path;
    ps.rank = proc.rank;
    ps.world = proc.file->header.world;
    ps.host.assign(proc.file->header.host,
                   strnlen(proc.file->header.host, sizeof proc.file->header.host));
    ps.pid = proc.file->header.pid;
    ps.cleanShutdown = proc.clean;
    ps.alive = proc.alive;
    ps.records = proc.file->records.size();
    ps.lastActivityNs = proc.lastActivity;
    report.processes.push_back(std::move(ps));
  }
  report.verdicts = std::move(verdicts_);
  summarize(report);
  noteEvidenceGaps(report);
  report.summary = whatHappened(report, now_, jobLastActivity_);
  return report;
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

std::string formatRanks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
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

Report analyze(std::span<const trace::TraceFile> files, const Options& options) {
  int64_t now = options.nowNs;
  if (now == 0) {
    now = std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::system_clock::now().time_since_epoch())
              .count();
  }
  std::string host = options.probeProcesses ? hostName() : "";
  // job id -> its processes in start order
  std::map<std::string, std::vector<const trace::TraceFile*>> byJob;
  for (const trace::TraceFile& file : files) {
    if (!file.usable) continue;
    std::string job(file.header.jobId, strnlen(file.header.jobId, sizeof file.header.jobId));
    byJob[job].push_back(&file);
  }
  Report report;
  for (auto& [job, list] : byJob) {
    std::stable_sort(list.begin(), list.end(), [](auto* a, auto* b) {
      return a->header.anchorRealtimeNs < b->header.anchorRealtimeNs;
    });
    std::map<int, int> seen;  // rank -> processes so far
    std::map<int, std::vector<Proc>> attempts;
    for (const trace::TraceFile* file : list) {
      Proc proc;
      proc.file = file;
      proc.rank = file->header.rank;
      int attempt = proc.rank >= 0 ? seen[proc.rank]++ : 0;
      proc.toWall = file->header.anchorRealtimeNs - file->header.anchorMonotonicNs;
      proc.clean = file->header.cleanShutdown != 0;
      std::string fileHost(file->header.host, strnlen(file->header.host, sizeof file->header.host));
      if (options.probeProcesses) {
        proc.alive = !proc.clean && fileHost == host && stillRunning(*file);
      } else {
        proc.alive = std::find(options.aliveRanks.begin(), options.aliveRanks.end(), proc.rank) !=
                     options.aliveRanks.end();
      }
      int64_t last = file->header.anchorMonotonicNs;
      for (const CallRecord& r : file->records) {
        last = std::max({last, r.issueNs, r.startNs, r.completeNs});
      }
      for (const trace::CommInfo& c : file->comms) last = std::max(last, c.createdNs);
      proc.lastActivity = proc.wall(last);
      attempts[attempt].push_back(proc);
    }
    for (auto& [attempt, procs] : attempts) {
      JobAnalysis analysis(std::move(procs), options, now);
      report.jobs.push_back(analysis.run(job, attempt));
    }
  }
  annotateInNccl(report, files);
  annotateIssuedAt(report, files);
  return report;
}

}  // namespace ncclwatch::analysis
