#include "timeline.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include "analysis/describe.h"
#include "analysis/stack_tree.h"
#include "analysis/timing.h"
#include "load.h"
#include "source_lines.h"

namespace ncclwatch::timeline {
namespace {

using trace::CallRecord;
using trace::TraceFile;

constexpr size_t kMaxQueueLanes = 16;  // deeper queues show their extra calls as instants

std::string jsonQuoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\u%04x", u);
      out += escape;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

bool tracked(const CallRecord& r) {
  return (r.flags & (trace::kRecordCaptured | trace::kRecordNoEvents)) == 0;
}

// Builds the events; times are aligned nanoseconds until written.
class Writer {
 public:
  Writer(std::span<const TraceFile> files, std::ostream& out) : files_(files), out_(out) {}

  Stats run(const analysis::Report* report) {
    std::vector<size_t> order;
    for (size_t f = 0; f < files_.size(); ++f) {
      if (files_[f].usable) order.push_back(f);
    }
    std::sort(order.begin(), order.end(), [this](size_t a, size_t b) {
      const auto& ha = files_[a].header;
      const auto& hb = files_[b].header;
      int c = std::strncmp(ha.jobId, hb.jobId, sizeof ha.jobId);
      if (c != 0) return c < 0;
      if (ha.rank != hb.rank) return ha.rank < hb.rank;
      return ha.anchorRealtimeNs < hb.anchorRealtimeNs;
    });
    pidOf_.assign(files_.size(), 0);
    for (size_t i = 0; i < order.size(); ++i) pidOf_[order[i]] = static_cast<int>(i + 1);
    clocks_ = analysis::alignClocks(files_);
    findTimeRange();
    std::set<std::string> jobs;
    for (size_t f : order) jobs.emplace(trace::jobIdOf(files_[f].header));

    out_ << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"ncclwatch timeline\","
            "\"clock\":\"CLOCK_MONOTONIC per host, hosts aligned on collective completion\"},"
            "\"traceEvents\":[\n";
    for (size_t f : order) {
      writeProcess(f, jobs.size() > 1);
    }
    if (report != nullptr) writeVerdicts(*report);
    out_ << "\n]}\n";
    stats_.processes = order.size();
    return stats_;
  }

 private:
  struct Event {
    Event() = default;
    Event(char ph_, int pid_, int tid_, std::string name_, std::string cat_, int64_t ts_,
          int64_t dur_ = 0)
        : ph(ph_),
          pid(pid_),
          tid(tid_),
          name(std::move(name_)),
          cat(std::move(cat_)),
          ts(ts_),
          dur(dur_) {}
    char ph = 'X';
    int pid = 0, tid = 0;
    std::string name, cat;
    int64_t ts = 0, dur = 0;  // aligned ns
    std::string args;         // JSON object body without braces
  };

  void findTimeRange() {
    base_ = INT64_MAX;
    end_ = INT64_MIN;
    auto see = [this](size_t f, int64_t t) {
      if (t == 0) return;
      int64_t a = clocks_.aligned(f, t);
      base_ = std::min(base_, a);
      end_ = std::max(end_, a);
    };
    for (size_t f = 0; f < files_.size(); ++f) {
      if (!files_[f].usable) continue;
      for (const CallRecord& r : files_[f].records) {
        see(f, r.issueNs);
        see(f, r.startNs);
        see(f, r.completeNs);
      }
      for (const trace::Dump& d : files_[f].dumps) see(f, d.timeNs);
    }
    if (base_ == INT64_MAX) base_ = end_ = 0;
  }

  void emit(const Event& e) {
    char times[96];
    double ts = static_cast<double>(e.ts - base_) / 1e3;
    if (e.ph == 'X') {
      std::snprintf(times, sizeof times, "\"ts\":%.3f,\"dur\":%.3f", ts,
                    static_cast<double>(std::max<int64_t>(e.dur, 0)) / 1e3);
      ++stats_.slices;
    } else {
      std::snprintf(times, sizeof times, "\"ts\":%.3f,\"s\":\"t\"", ts);
      ++stats_.instants;
    }
    out_ << (first_ ? "" : ",\n") << "{\"ph\":\"" << e.ph << "\",\"pid\":" << e.pid
         << ",\"tid\":" << e.tid << ",\"name\":" << jsonQuoted(e.name)
         << ",\"cat\":" << jsonQuoted(e.cat) << "," << times << ",\"args\":{" << e.args << "}}";
    first_ = false;
  }

  void metadata(const char* what, int pid, int tid, const std::string& key,
                const std::string& value) {
    out_ << (first_ ? "" : ",\n") << "{\"ph\":\"M\",\"pid\":" << pid << ",\"tid\":" << tid
         << ",\"name\":\"" << what << "\",\"args\":{" << jsonQuoted(key) << ":" << value << "}}";
    first_ = false;
  }

  // Tracks sort by `order` (a track's number times 100, plus its queue lane), then creation.
  int newThread(int pid, const std::string& name, int order) {
    int tid = ++nextTid_[pid];
    metadata("thread_name", pid, tid, "name", jsonQuoted(name));
    metadata("thread_sort_index", pid, tid, "sort_index", std::to_string(order));
    ++stats_.tracks;
    return tid;
  }

  std::string callArgs(const CallRecord& r, const char* phase) {
    std::string args =
        "\"comm\":" + jsonQuoted(analysis::hashText(r.commHash)) +
        ",\"seq\":" + std::to_string(r.seq) + ",\"op\":" + jsonQuoted(trace::opName(r.op)) +
        ",\"count\":" + std::to_string(r.count) +
        ",\"dtype\":" + jsonQuoted(analysis::dtypeText(r.dtype)) +
        ",\"state\":" + jsonQuoted(trace::stateName(r.state)) + ",\"phase\":" + jsonQuoted(phase);
    if (trace::isPointToPoint(r.op)) {
      args += ",\"peer\":" + std::to_string(r.rootOrPeer);
    } else if (r.rootOrPeer >= 0) {
      args += ",\"root\":" + std::to_string(r.rootOrPeer);
    }
    if (r.result != 0) args += ",\"result\":" + std::to_string(r.result);
    return args;
  }

  std::string commLabel(size_t f, uint64_t hash) {
    for (const trace::CommInfo& info : files_[f].comms) {
      if (info.commHash != hash) continue;
      analysis::CommDesc desc;
      desc.hash = hash;
      desc.size = info.nranks;
      desc.parent = info.parentHash;
      desc.color = info.color;
      desc.name.assign(info.name, strnlen(info.name, sizeof info.name));
      if (desc.name.empty() && desc.parent == 0 && info.nranks == files_[f].header.world) {
        desc.name = "world";
      }
      return "comm " + analysis::commText(desc);
    }
    return "comm " + analysis::shortHash(hash);
  }

  void writeProcess(size_t f, bool showJob) {
    const TraceFile& file = files_[f];
    int pid = pidOf_[f];
    std::string host(file.header.host, strnlen(file.header.host, sizeof file.header.host));
    std::string name = (file.header.rank >= 0 ? "rank " + std::to_string(file.header.rank)
                                              : std::string("rank ?")) +
                       " (" + host + ":" + std::to_string(file.header.pid) + ")";
    if (showJob) name += " " + std::string(trace::jobIdOf(file.header));
    metadata("process_name", pid, 0, "name", jsonQuoted(name));
    metadata("process_sort_index", pid, 0, "sort_index", std::to_string(pid));
    markerTid_[pid] = newThread(pid, "ncclwatch: dumps and verdicts", 0);

    struct Track {
      int runTid = 0;
      int order = 0;
      int64_t runEnd = INT64_MIN;
      std::vector<std::pair<int, int64_t>> lanes;  // tid, end
      std::string label;
    };
    std::map<std::pair<uint64_t, uint64_t>, Track> tracks;
    std::map<int, int> hostTids;  // OS thread → track
    for (const CallRecord& r : file.records) {
      if (r.op == trace::OpKind::kGroupStart || r.op == trace::OpKind::kGroupEnd) continue;
      int64_t issue = clocks_.aligned(f, r.issueNs);
      int64_t start = clocks_.aligned(f, r.startNs);
      int64_t complete = clocks_.aligned(f, r.completeNs);
      const char* opText = trace::opName(r.op);
      if (!trace::isCollective(r.op) && !trace::isPointToPoint(r.op)) {
        auto [it, fresh] = hostTids.try_emplace(r.threadId, 0);
        if (fresh) {
          it->second = newThread(pid, "host calls (thread " + std::to_string(r.threadId) + ")",
                                 100 * static_cast<int>(1 + hostTids.size()));
        }
        Event e;
        e.pid = pid;
        e.tid = it->second;
        e.name = opText;
        e.cat = "host";
        e.ts = issue;
        e.args = callArgs(r, "host call");
        if (complete >= issue && complete != 0) {
          e.dur = complete - issue;
        } else {
          e.ph = 'i';
        }
        emit(e);
        continue;
      }
      Track& track = tracks[{r.commHash, r.stream}];
      if (track.runTid == 0) {
        char stream[40];
        std::snprintf(stream, sizeof stream, "stream 0x%llx",
                      static_cast<unsigned long long>(r.stream));
        track.label = commLabel(f, r.commHash) + " " + (r.stream == 0 ? "default stream" : stream);
        track.order = 100'000 + 100 * static_cast<int>(tracks.size());
        track.runTid = newThread(pid, track.label, track.order);
      }
      if (!tracked(r)) {
        Event e{'i', pid, track.runTid, std::string(opText) + " (untracked)", "untracked", issue};
        e.args = callArgs(r, "issued, completion not tracked");
        emit(e);
        continue;
      }
      bool finished = r.state == trace::RecordState::kCompleted ||
                      r.state == trace::RecordState::kFailed ||
                      r.state == trace::RecordState::kAborted;
      if (start == 0 && complete != 0) start = complete;
      int64_t queuedEnd = start != 0 ? start : (finished ? issue : end_);
      if (queuedEnd > issue) {
        Event e{'X', pid, 0, std::string(opText) + " (queued)", "queued", issue, queuedEnd - issue};
        e.args = callArgs(r, start != 0 ? "issued, waiting for the stream"
                                        : "issued, never started (pending at the trace's end)");
        size_t lane = 0;
        while (lane < track.lanes.size() && track.lanes[lane].second > issue) ++lane;
        if (lane == track.lanes.size() && lane < kMaxQueueLanes) {
          track.lanes.push_back(
              {newThread(pid,
                         track.label + " queued" +
                             (lane == 0 ? std::string() : " #" + std::to_string(lane + 1)),
                         track.order + 1 + static_cast<int>(lane)),
               INT64_MIN});
        }
        if (lane < track.lanes.size()) {
          e.tid = track.lanes[lane].first;
          track.lanes[lane].second = queuedEnd;
        } else {
          e.ph = 'i';
          e.tid = track.runTid;
        }
        emit(e);
      }
      if (start != 0) {
        // The stream runs one call at a time; polling can blur the edges, so keep the slices of
        // one track from overlapping (the exact times stay in args).
        int64_t runStart = std::max(start, track.runEnd);
        int64_t runEnd = complete != 0 ? complete : end_;
        runEnd = std::max(runEnd, runStart);
        Event e{'X', pid, track.runTid, opText, "running", runStart, runEnd - runStart};
        e.args = callArgs(r, complete != 0 ? "running on the stream"
                                           : "started, not completed (pending at the trace's end)");
        emit(e);
        track.runEnd = runEnd;
      }
    }
    for (const trace::Dump& dump : file.dumps) {
      Event e{'i',
              pid,
              markerTid_[pid],
              "dump (" + dump.trigger + ")",
              "dump",
              clocks_.aligned(f, dump.timeNs)};
      std::string findings;
      for (const trace::DumpFinding& finding : dump.findings) {
        if (!findings.empty()) findings += "; ";
        findings += "comm " + analysis::shortHash(finding.commHash) + " seq " +
                    std::to_string(finding.seq) + " " + finding.op + " " + finding.state + " " +
                    std::to_string(finding.ageMs) + " ms";
      }
      e.args = "\"trigger\":" + jsonQuoted(dump.trigger) +
               ",\"reason\":" + jsonQuoted(dump.reason) + ",\"findings\":" + jsonQuoted(findings) +
               ",\"threads\":" + std::to_string(dump.threads.size()) +
               ",\"took_ms\":" + std::to_string(dump.tookNs / 1'000'000);
      std::string top = analysis::stackTop(dump, 0, file.header.pid);
      if (!top.empty()) e.args += ",\"stack_top\":" + jsonQuoted(top);
      emit(e);
      ++stats_.dumpMarks;
    }
  }

  void writeVerdicts(const analysis::Report& report) {
    std::map<std::string, size_t> fileOfPath;
    for (size_t f = 0; f < files_.size(); ++f) {
      if (files_[f].usable) fileOfPath[files_[f].path] = f;
    }
    for (const analysis::JobReport& job : report.jobs) {
      std::map<int, size_t> fileOfRank;
      for (const analysis::ProcessSummary& p : job.processes) {
        auto it = fileOfPath.find(p.path);
        if (it != fileOfPath.end()) fileOfRank[p.rank] = it->second;
      }
      for (const analysis::Verdict& v : job.verdicts) {
        std::set<int> ranks(v.culprits.begin(), v.culprits.end());
        for (const analysis::RankClass& c : v.classes) ranks.insert(c.ranks.begin(), c.ranks.end());
        std::string kind = analysis::kindName(v.kind);
        std::string upper = analysis::upperCase(kind);
        for (int rank : ranks) {
          auto it = fileOfRank.find(rank);
          if (it == fileOfRank.end()) continue;
          size_t f = it->second;
          const auto& h = files_[f].header;
          int64_t t = end_;
          if (v.divergenceNs != 0) {
            int64_t monotonic = v.divergenceNs - (h.anchorRealtimeNs - h.anchorMonotonicNs);
            t = std::clamp(clocks_.aligned(f, monotonic), base_, end_);
          }
          bool culprit = std::find(v.culprits.begin(), v.culprits.end(), rank) != v.culprits.end();
          Event e{'i',
                  pidOf_[f],
                  markerTid_[pidOf_[f]],
                  upper + " on comm " + analysis::shortHash(v.comm.hash) +
                      (v.seq != 0 ? " at call #" + std::to_string(v.seq) : std::string()) +
                      (culprit ? " (culprit)" : ""),
                  "verdict",
                  t};
          e.args = "\"kind\":" + jsonQuoted(kind) +
                   ",\"comm\":" + jsonQuoted(analysis::commText(v.comm)) +
                   ",\"seq\":" + std::to_string(v.seq) +
                   ",\"culprit\":" + (culprit ? "true" : "false") +
                   ",\"primary\":" + (v.primary ? "true" : "false") +
                   ",\"culprits\":" + jsonQuoted(analysis::formatRanks(v.culprits)) +
                   ",\"explanation\":" + jsonQuoted(v.explanation);
          for (const analysis::RankClass& c : v.classes) {
            if (std::find(c.ranks.begin(), c.ranks.end(), rank) == c.ranks.end()) continue;
            if (!c.call.issuedAt.empty()) e.args += ",\"issued_at\":" + jsonQuoted(c.call.issuedAt);
            if (!c.stackTop.empty()) e.args += ",\"stack_top\":" + jsonQuoted(c.stackTop);
          }
          emit(e);
          ++stats_.verdictMarks;
        }
      }
    }
  }

  std::span<const TraceFile> files_;
  std::ostream& out_;
  analysis::ClockAlignment clocks_;
  std::vector<int> pidOf_;
  std::map<int, int> nextTid_;
  std::map<int, int> markerTid_;
  int64_t base_ = 0, end_ = 0;
  bool first_ = true;
  Stats stats_;
};

}  // namespace

Stats write(std::span<const TraceFile> files, const analysis::Report* report, std::ostream& out) {
  return Writer(files, out).run(report);
}

int run(const Options& options, std::ostream& out, std::ostream& err) {
  cli::Loaded loaded;
  if (!cli::loadTraces(options.directory, "timeline", err, &loaded)) return 2;
  analysis::Options analysisOptions;
  analysisOptions.threads = analysis::defaultAnalysisThreads();
  analysisOptions.quietNs = static_cast<int64_t>(options.quietSeconds * 1e9);
  cli::SourceLines lines(cli::SourceLines::workingDirectory());
  lines.annotateDumps(loaded.files);
  analysis::Report report = analysis::analyze(loaded.files, analysisOptions);
  lines.annotateCallSites(report, loaded.files);
  lines.printNotes("timeline", err);
  Stats stats;
  if (options.output == "-") {
    stats = write(loaded.files, &report, out);
  } else {
    std::ofstream file(options.output, std::ios::binary | std::ios::trunc);
    if (!file) {
      err << "ncclwatch timeline: cannot write " << options.output << "\n";
      return 2;
    }
    stats = write(loaded.files, &report, file);
    file.close();
    if (!file) {
      err << "ncclwatch timeline: writing " << options.output << " failed\n";
      return 2;
    }
    out << "ncclwatch timeline: wrote " << options.output << ": " << stats.processes << " ranks, "
        << stats.slices << " slices, " << stats.dumpMarks << " dumps, " << stats.verdictMarks
        << " verdict marks; open it in https://ui.perfetto.dev\n";
  }
  return 0;
}

}  // namespace ncclwatch::timeline
