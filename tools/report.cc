#include "report.h"

#include "load.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "analysis/before_aborts.h"
#include "analysis/describe.h"
#include "analysis/stack_tree.h"
#include "source_lines.h"
#include "stacks.h"

namespace ncclwatch::report {
namespace {

constexpr const char* kStyle = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;
max-width:1100px;padding:0 16px;color:#1d1d1f;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;
padding-bottom:4px}.sub{color:#555;margin:0 0 12px}
pre{background:#f6f8fa;border:1px solid #e1e4e8;border-radius:6px;padding:10px 12px;overflow-x:auto;
font:12.5px/1.4 ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;margin:6px 0}
.verdict{border-left:4px solid #d62728;padding-left:10px;margin:12px 0}
.verdict pre{white-space:pre-wrap}
.verdict.info{border-left-color:#e0a800}.verdict.conseq{border-left-color:#999}
.culprit{background:#ffd7d5;font-weight:600}.badge{display:inline-block;background:#d62728;
color:#fff;border-radius:10px;padding:1px 9px;font-weight:600;font-size:13px;margin-right:6px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f2f4}tr.culprit td{background:#ffe9e7}
.note{color:#666;font-size:13px}svg{font:11px system-ui,sans-serif}
)";

std::string fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
  return buffer;
}

int64_t wallNs(const trace::TraceFile& file, int64_t monotonicNs) {
  return file.header.anchorRealtimeNs + (monotonicNs - file.header.anchorMonotonicNs);
}

bool pending(const trace::CallRecord& r) {
  return r.state == trace::RecordState::kIssued || r.state == trace::RecordState::kStarted;
}

const char* stateWord(trace::RecordState state) {
  switch (state) {
    case trace::RecordState::kIssued:
      return "issued";
    case trace::RecordState::kStarted:
      return "started";
    case trace::RecordState::kCompleted:
      return "completed";
    case trace::RecordState::kFailed:
      return "failed";
    case trace::RecordState::kAborted:
      return "aborted";
    default:
      return "?";
  }
}

// What the page centres on: the job, its first primary verdict, the communicator.
struct Focus {
  const analysis::JobReport* job = nullptr;
  const analysis::Verdict* verdict = nullptr;
  const analysis::CommSummary* comm = nullptr;
};

Focus focusOf(const analysis::Report& report) {
  Focus f;
  for (const analysis::JobReport& job : report.jobs) {
    if (f.job == nullptr || (!job.verdicts.empty() && f.job->verdicts.empty())) f.job = &job;
  }
  if (f.job == nullptr) return f;
  for (const analysis::Verdict& v : f.job->verdicts) {
    if (v.primary && v.kind != analysis::VerdictKind::kStraggler) {
      f.verdict = &v;
      break;
    }
  }
  if (f.verdict == nullptr && !f.job->verdicts.empty()) f.verdict = &f.job->verdicts.front();
  for (const analysis::CommSummary& c : f.job->comms) {
    if (f.verdict != nullptr && f.verdict->comm.hash != 0) {
      if (c.comm.hash == f.verdict->comm.hash) f.comm = &c;
    } else if (f.comm == nullptr || c.ranks.size() > f.comm->ranks.size()) {
      f.comm = &c;
    }
  }
  return f;
}

bool isCulprit(const Focus& f, int rank) {
  return f.verdict != nullptr && std::find(f.verdict->culprits.begin(), f.verdict->culprits.end(),
                                           rank) != f.verdict->culprits.end();
}

void writeVerdicts(const analysis::JobReport& job, std::ostream& out) {
  out << "<h2>Verdicts</h2>\n";
  if (job.verdicts.empty()) {
    out << "<p>No verdict: nothing went wrong that the traces show.</p>\n";
    return;
  }
  for (const analysis::Verdict& v : job.verdicts) {
    const char* cls = v.kind == analysis::VerdictKind::kStraggler ? "verdict info"
                      : v.primary                                 ? "verdict"
                                                                  : "verdict conseq";
    out << "<div class=\"" << cls << "\">";
    if (!v.culprits.empty()) {
      out << "<span class=\"badge\">culprit " << (v.culprits.size() == 1 ? "rank " : "ranks ")
          << escapeHtml(analysis::formatRanks(v.culprits)) << "</span>";
    }
    std::ostringstream text;
    analysis::printVerdictText(v, text);
    // Lines of classes holding a culprit, and the culprit line itself, are highlighted.
    std::vector<std::string> marked;
    for (const analysis::RankClass& rc : v.classes) {
      bool has = std::any_of(rc.ranks.begin(), rc.ranks.end(), [&](int r) {
        return std::find(v.culprits.begin(), v.culprits.end(), r) != v.culprits.end();
      });
      if (has) {
        marked.push_back("  " + std::string(rc.ranks.size() == 1 ? "rank " : "ranks ") +
                         analysis::formatRanks(rc.ranks) + " ");
      }
    }
    marked.push_back("  culprit");
    out << "<pre>";
    std::istringstream lines(text.str());
    std::string line;
    while (std::getline(lines, line)) {
      bool hot = std::any_of(marked.begin(), marked.end(),
                             [&](const std::string& m) { return line.rfind(m, 0) == 0; });
      if (hot) out << "<span class=\"culprit\">";
      out << escapeHtml(line);
      if (hot) out << "</span>";
      out << "\n";
    }
    out << "</pre></div>\n";
  }
}

void writeTimeline(const Focus& f, const std::map<int, const trace::TraceFile*>& newest,
                   std::ostream& out) {
  out << "<h2>Timeline of the divergent communicator</h2>\n";
  if (f.comm == nullptr) {
    out << "<p class=\"note\">No communicator in the traces.</p>\n";
    return;
  }
  const uint64_t hash = f.comm->comm.hash;
  struct Bar {
    int64_t from = 0, to = 0;
    bool open = false;
    const trace::CallRecord* record = nullptr;
  };
  std::map<int, std::vector<Bar>> rows;
  uint64_t center = f.verdict != nullptr ? f.verdict->seq : 0;
  if (center == 0) {
    for (const auto& p : f.comm->progress) center = std::max(center, p.issuedSeq);
  }
  const uint64_t lo = center > 3 ? center - 3 : 1;
  const uint64_t hi = center + 1;
  int64_t t0 = INT64_MAX, t1 = INT64_MIN;
  for (int rank : f.comm->ranks) {
    auto it = newest.find(rank);
    if (it == newest.end()) continue;
    const trace::TraceFile& file = *it->second;
    int64_t end = 0;
    if (!file.dumps.empty()) end = wallNs(file, file.dumps.back().timeNs);
    std::vector<Bar>& row = rows[rank];
    for (const trace::CallRecord& r : file.records) {
      if (r.commHash != hash || r.seq < lo || r.seq > hi) continue;
      Bar bar;
      bar.record = &r;
      bar.from = wallNs(file, r.issueNs);
      bar.to = r.completeNs != 0 ? wallNs(file, r.completeNs) : end;
      bar.open = r.completeNs == 0;
      t0 = std::min(t0, bar.from);
      t1 = std::max({t1, bar.from, bar.to});
      row.push_back(bar);
    }
  }
  if (t0 == INT64_MAX) {
    out << "<p class=\"note\">No calls recorded on " << escapeHtml(analysis::commText(f.comm->comm))
        << " around call #" << center << ".</p>\n";
    return;
  }
  for (auto& [rank, row] : rows) {
    for (Bar& bar : row) {
      if (bar.open && bar.to < bar.from) bar.to = t1;  // no dump time: pending to the end
    }
  }
  const double span = std::max<int64_t>(t1 - t0, 1000);
  // Each call of the window has its own lane in a rank's row: calls are issued back to back and
  // would hide each other.
  const int lanes = static_cast<int>(hi - lo + 1), laneH = 15;
  const int left = 110, plot = 820, rowH = lanes * laneH + 8, top = 28;
  const int height = top + static_cast<int>(rows.size()) * rowH + 34;
  auto x = [&](int64_t t) { return left + (t - t0) / span * plot; };
  out << "<p class=\"sub\">Calls #" << lo << "\u2013#" << hi << " on "
      << escapeHtml(analysis::commText(f.comm->comm))
      << ", each bar from issue to completion; an open bar is still pending when the rank "
         "dumped; the red outline marks call #"
      << center << (f.verdict != nullptr ? ", the one the verdict is about" : "") << ".</p>\n";
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << left + plot + 40 << "\" height=\""
      << height << "\" role=\"img\" aria-label=\"timeline\">\n";
  // Axis: five ticks in ms from the first call shown.
  for (int i = 0; i <= 5; ++i) {
    double px = left + plot * i / 5.0;
    out << "<line x1=\"" << fixed(px, 1) << "\" y1=\"" << top - 6 << "\" x2=\"" << fixed(px, 1)
        << "\" y2=\"" << height - 30 << "\" stroke=\"#e3e3e3\"/>"
        << "<text x=\"" << fixed(px, 1) << "\" y=\"" << top - 10
        << "\" text-anchor=\"middle\" fill=\"#555\">+" << fixed(span * i / 5.0 / 1e6, 1)
        << " ms</text>\n";
  }
  int index = 0;
  for (const auto& [rank, row] : rows) {
    int y = top + index++ * rowH;
    bool culprit = isCulprit(f, rank);
    out << "<line x1=\"0\" y1=\"" << y + rowH << "\" x2=\"" << left + plot + 40 << "\" y2=\""
        << y + rowH << "\" stroke=\"#eee\"/>";
    if (culprit) {
      out << "<rect x=\"0\" y=\"" << y << "\" width=\"" << left + plot + 40 << "\" height=\""
          << rowH << "\" fill=\"#ffe3e0\"/>";
    }
    out << "<text x=\"6\" y=\"" << y + rowH / 2 + 4 << "\""
        << (culprit ? " font-weight=\"bold\"" : "") << " fill=\"" << (culprit ? "#b00020" : "#222")
        << "\">rank " << rank << (culprit ? " \u25c0 culprit" : "") << "</text>\n";
    for (const Bar& bar : row) {
      const trace::CallRecord& r = *bar.record;
      double bx = x(bar.from);
      double bw = std::max(3.0, x(bar.to) - bx);
      bool marked = r.seq == center;
      int by = y + 4 + static_cast<int>(r.seq - lo) * laneH;
      std::string call =
          analysis::callText(analysis::describeCall(r)) + " #" + std::to_string(r.seq);
      out << "<g><title>"
          << escapeHtml("rank " + std::to_string(rank) + ": " + call + ", " + stateWord(r.state) +
                        ", issued +" + fixed((bar.from - t0) / 1e6, 2) + " ms" +
                        (bar.open ? "" : ", took " + fixed((bar.to - bar.from) / 1e6, 2) + " ms"))
          << "</title><rect x=\"" << fixed(bx, 1) << "\" y=\"" << by << "\" width=\""
          << fixed(bw, 1) << "\" height=\"" << laneH - 3 << "\" rx=\"2\" fill=\""
          << (bar.open ? "#f6b26b" : "#7aa6d6") << "\" stroke=\""
          << (marked     ? "#d62728"
              : bar.open ? "#c96f10"
                         : "#4e79a7")
          << "\" stroke-width=\"" << (marked ? 2.5 : 1) << "\""
          << (bar.open ? " stroke-dasharray=\"4 2\"" : "") << "/>";
      if (bw > 64) {
        out << "<text x=\"" << fixed(bx + 4, 1) << "\" y=\"" << by + laneH - 6
            << "\" font-size=\"10\" fill=\"#111\">"
            << escapeHtml(bw > 220
                              ? call
                              : std::string(trace::opName(r.op)) + " #" + std::to_string(r.seq))
            << "</text>";
      }
      out << "</g>\n";
    }
  }
  int ly = height - 14;
  out << "<rect x=\"" << left << "\" y=\"" << ly - 10
      << "\" width=\"14\" height=\"10\" fill=\"#7aa6d6\" stroke=\"#4e79a7\"/><text x=\""
      << left + 20 << "\" y=\"" << ly << "\">completed</text>"
      << "<rect x=\"" << left + 110 << "\" y=\"" << ly - 10
      << "\" width=\"14\" height=\"10\" fill=\"#f6b26b\" stroke=\"#c96f10\" "
         "stroke-dasharray=\"4 2\"/><text x=\""
      << left + 130 << "\" y=\"" << ly << "\">pending</text>"
      << "<rect x=\"" << left + 210 << "\" y=\"" << ly - 10
      << "\" width=\"14\" height=\"10\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2.5\"/>"
      << "<text x=\"" << left + 230 << "\" y=\"" << ly << "\">call #" << center << "</text>\n";
  out << "</svg>\n";
}

void writeStacks(const analysis::StackReport& stacks, std::ostream& out) {
  out << "<h2>Merged stacks</h2>\n<p class=\"sub\">" << stacks.classes.size()
      << (stacks.classes.size() == 1 ? " class" : " classes")
      << " of ranks with the same stack in the thread that issued the hung call (else the main "
         "thread); representative ranks first.</p>\n";
  if (!stacks.classes.empty()) {
    out << "<table><tr><th>class</th><th>ranks</th><th>representative</th><th>innermost "
           "frames</th></tr>\n";
    for (size_t i = 0; i < stacks.classes.size(); ++i) {
      const analysis::StackClass& c = stacks.classes[i];
      std::string frames;
      size_t from = c.path.size() > 3 ? c.path.size() - 3 : 0;
      for (size_t k = from; k < c.path.size(); ++k) frames += (k > from ? " > " : "") + c.path[k];
      out << "<tr><td>" << i + 1 << "</td><td>[" << escapeHtml(analysis::formatRanks(c.ranks))
          << "]</td><td>" << c.representative << "</td><td>" << escapeHtml(frames)
          << "</td></tr>\n";
    }
    out << "</table>\n";
  }
  if (!stacks.noDump.empty()) {
    out << "<p class=\"note\">No dump from " << (stacks.noDump.size() == 1 ? "rank " : "ranks ")
        << escapeHtml(analysis::formatRanks(stacks.noDump)) << ".</p>\n";
  }
  std::ostringstream tree;
  analysis::printStackTree(stacks.native, tree);
  out << (stacks.mixedRanks.empty()
              ? std::string("<p>Native stacks")
              : "<p>Mixed stacks (ranks " + escapeHtml(analysis::formatRanks(stacks.mixedRanks)) +
                    "): Python frames where the interpreter runs them, runtime and PyTorch "
                    "frames folded")
      << ", outermost frame first; each line shows the ranks that went through that frame.</p>\n"
         "<pre>"
      << (stacks.native.empty() ? std::string("none") : escapeHtml(tree.str())) << "</pre>\n";
  if (!stacks.python.empty()) {
    std::ostringstream py;
    analysis::printStackTree(stacks.python, py);
    out << "<p>Python stacks, outermost frame first (all Python threads).</p>\n<pre>"
        << escapeHtml(py.str()) << "</pre>\n";
  } else {
    out << "<p class=\"note\">Python stacks: " << escapeHtml(stacks.pythonNote) << "</p>\n";
  }
}

void writeRanks(const Focus& f, const std::map<int, const trace::TraceFile*>& newest,
                const analysis::StackReport& stacks, std::ostream& out) {
  out << "<h2>Ranks</h2>\n<table><tr><th>rank</th><th>host</th><th>pid</th><th>last completed "
         "#";
  if (f.comm != nullptr) out << " on " << escapeHtml(analysis::shortHash(f.comm->comm.hash));
  out << "</th><th>pending calls</th><th>dump</th><th>stack class</th></tr>\n";
  std::map<int, uint64_t> completed;
  if (f.comm != nullptr) {
    for (const auto& p : f.comm->progress) {
      for (int r : p.ranks) completed[r] = p.completedSeq;
    }
  }
  std::map<int, size_t> classOf;
  for (size_t i = 0; i < stacks.classes.size(); ++i) {
    for (int r : stacks.classes[i].ranks) classOf[r] = i + 1;
  }
  for (const auto& [rank, file] : newest) {
    out << "<tr" << (isCulprit(f, rank) ? " class=\"culprit\"" : "") << "><td>" << rank
        << (isCulprit(f, rank) ? " (culprit)" : "") << "</td><td>"
        << escapeHtml(
               std::string(file->header.host, strnlen(file->header.host, sizeof file->header.host)))
        << "</td><td>" << file->header.pid << "</td><td>";
    auto c = completed.find(rank);
    if (c != completed.end()) {
      out << "#" << c->second;
    } else {
      out << "\u2014";
    }
    out << "</td><td>";
    int shown = 0, more = 0;
    for (const trace::CallRecord& r : file->records) {
      if (!pending(r)) continue;
      if (shown == 4) {
        ++more;
        continue;
      }
      out << (shown++ ? "<br>" : "")
          << escapeHtml(analysis::callText(analysis::describeCall(r)) + " #" +
                        std::to_string(r.seq) + " on " + analysis::shortHash(r.commHash) + " (" +
                        stateWord(r.state) + ")");
    }
    if (more > 0) out << "<br>+" << more << " more";
    if (shown == 0) out << "none";
    out << "</td><td>";
    if (file->dumps.empty()) {
      out << "none";
    } else {
      const trace::Dump& d = file->dumps.back();
      out << escapeHtml(d.trigger) << (d.reason.empty() ? "" : ": ") << escapeHtml(d.reason);
      if (file->dumps.size() > 1) out << " (newest of " << file->dumps.size() << ")";
    }
    out << "</td><td>";
    auto k = classOf.find(rank);
    if (k != classOf.end()) {
      out << k->second;
    } else {
      out << "\u2014";
    }
    out << "</td></tr>\n";
  }
  out << "</table>\n";
}

}  // namespace

std::string escapeHtml(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        // Control characters other than tab and line break would make the page invalid.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

void writeHtml(std::span<const trace::TraceFile> files, const analysis::Report& report,
               const analysis::StackReport& stacks, std::ostream& out) {
  Focus f = focusOf(report);
  auto newest = analysis::newestByRank(files);
  std::string title = "ncclwatch report";
  if (f.job != nullptr && !f.job->jobId.empty()) title += ": " + f.job->jobId;
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
         "<title>"
      << escapeHtml(title) << "</title><style>" << kStyle << "</style></head><body>\n";
  out << "<h1>" << escapeHtml(title) << "</h1>\n";
  if (f.job == nullptr) {
    out << "<p>No usable trace files.</p></body></html>\n";
    return;
  }
  out << "<p class=\"sub\">" << escapeHtml(f.job->summary) << "</p>\n";
  writeVerdicts(*f.job, out);
  writeTimeline(f, newest, out);
  writeStacks(stacks, out);
  writeRanks(f, newest, stacks, out);
  out << "<p class=\"note\">Written by ncclwatch report from " << files.size()
      << " trace files.</p>\n</body></html>\n";
}

int run(const Options& options, std::ostream& err) {
  std::vector<trace::TraceFile> files;
  cli::Loaded loaded;
  if (!cli::loadTraces(options.directory, "report", err, &loaded)) return 2;
  files = std::move(loaded.files);
  analysis::Options analysisOptions;
  analysisOptions.threads = analysis::defaultAnalysisThreads();
  analysisOptions.quietNs = static_cast<int64_t>(options.quietSeconds * 1e9);
  cli::SourceLines lines(cli::SourceLines::workingDirectory());
  lines.annotateDumps(files);
  analysis::rollBackToBeforeAborts(files);  // the hang an abort ended, as it was (inspect's)
  analysis::Report report = analysis::analyze(files, analysisOptions);
  lines.annotateCallSites(report, files);
  lines.printNotes("report", err);
  analysis::StackReport stacks = analysis::stackReport(files, report, {});
  std::ostringstream page;
  writeHtml(files, report, stacks, page);
  std::ofstream out(options.output, std::ios::binary | std::ios::trunc);
  if (!out || !(out << page.str()) || !out.flush()) {
    err << "ncclwatch report: cannot write " << options.output << "\n";
    return 2;
  }
  return 0;
}

}  // namespace ncclwatch::report
