#include "analysis/describe.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <string>
#include <string_view>
#include <unordered_set>

#include "trace/fingerprint.h"

namespace ncclwatch::analysis {
namespace {

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%" PRIx64, value);
  return text;
}

std::string secondsText(int64_t ns) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", ns / 1e9);
  return text;
}

void jsonString(std::string& out, const std::string& text) {
  out += '"';
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", c);
          out += esc;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void jsonRanks(std::string& out, const std::vector<int>& ranks) {
  out += '[';
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ranks[i]);
  }
  out += ']';
}

void jsonComm(std::string& out, const CommDesc& c) {
  out += "{\"hash\":\"" + hashText(c.hash) + "\",\"size\":" + std::to_string(c.size);
  out += ",\"parent\":";
  if (c.parent != 0) {
    out += "\"" + hashText(c.parent) + "\"";
  } else {
    out += "null";
  }
  out += ",\"color\":" + std::to_string(c.color) + ",\"name\":";
  jsonString(out, c.name);
  out += '}';
}

void jsonCall(std::string& out, const CallDesc& d) {
  out += "{\"op\":";
  jsonString(out, d.op == trace::OpKind::kUnknown ? "" : trace::opName(d.op));
  out += ",\"seq\":" + std::to_string(d.seq);
  out += ",\"count\":" + std::to_string(d.count);
  out += ",\"dtype\":";
  jsonString(out, d.dtype >= 0 && d.op != trace::OpKind::kUnknown ? dtypeText(d.dtype) : "");
  out += ",\"redop\":";
  jsonString(out, d.redop >= 0 ? redopText(d.redop) : "");
  out += ",\"root_or_peer\":" + std::to_string(d.rootOrPeer);
  out += ",\"p2p_seq\":" + std::to_string(d.p2pSeq);
  out +=
      ",\"state\":\"" + std::string(d.startInferred ? "reached" : trace::stateName(d.state)) + "\"";
  out += ",\"comm\":";
  if (d.commHash != 0) {
    out += "\"" + hashText(d.commHash) + "\"";
  } else {
    out += "null";
  }
  out += ",\"issued_at\":";
  jsonString(out, d.issuedAt);
  if (!d.pythonApi.empty()) {
    out += ",\"python_api\":";
    jsonString(out, d.pythonApi);
  }
  out += ",\"call_site\":";
  if (d.callSite != 0 && !trace::isPythonSite(d.callSite)) {
    out += "\"" + hex(d.callSite) + "\"";
  } else {
    out += "null";
  }
  out += ",\"note\":";
  jsonString(out, d.note);
  out += '}';
}

}  // namespace

const char* dtypeText(int dtype) {
  static const char* kNames[] = {"i8",  "u8",  "i32", "u32",  "i64",    "u64",
                                 "f16", "f32", "f64", "bf16", "f8e4m3", "f8e5m2"};
  if (dtype >= 0 && dtype < static_cast<int>(sizeof kNames / sizeof kNames[0])) {
    return kNames[dtype];
  }
  return "dtype?";
}

std::string redopText(int redop) {
  static const char* kNames[] = {"sum", "prod", "max", "min", "avg"};
  if (redop == trace::kRedopUnknown) return "?";  // a record built from profiler events
  if (redop >= 0 && redop < 5) return kNames[redop];
  return "premulsum";
}

std::string callText(const CallDesc& call) {
  if (call.op == trace::OpKind::kUnknown) return "-";
  std::string text = trace::opName(call.op);
  if (trace::isCollective(call.op) || trace::isPointToPoint(call.op)) {
    text += " " + std::to_string(call.count) + " x " + dtypeText(call.dtype);
    if (trace::hasReduction(call.op) && call.redop >= 0) text += " " + redopText(call.redop);
    if (trace::hasRoot(call.op)) text += " root=" + std::to_string(call.rootOrPeer);
    if (trace::isPointToPoint(call.op)) text += " peer=" + std::to_string(call.rootOrPeer);
  } else if (call.op == trace::OpKind::kSplit) {
    // NCCL_SPLIT_NOCOLOR is -1: the rank joins no child.
    auto colourText = [](int colour) {
      return colour == -1 ? std::string("NOCOLOR") : std::to_string(colour);
    };
    if (call.colours.empty()) {
      text += " color=" + colourText(call.rootOrPeer);
    } else {
      text += " colors ";
      for (size_t i = 0; i < call.colours.size(); ++i) {
        text += (i == 0                         ? ""
                 : i + 1 == call.colours.size() ? " and "
                                                : ", ") +
                colourText(call.colours[i]);
      }
    }
  }
  return text;
}

std::string wallText(int64_t ns) {
  if (ns <= 0) return "unknown";
  time_t seconds = static_cast<time_t>(ns / 1'000'000'000);
  struct tm tm {};
  localtime_r(&seconds, &tm);
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02d-%02d %02d:%02d:%02d.%03d", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ns / 1'000'000 % 1000));
  return text;
}

std::string hashText(uint64_t hash) {
  char text[20];
  std::snprintf(text, sizeof text, "%016" PRIx64, hash);
  return text;
}

std::string shortHash(uint64_t hash) {
  return hashText(hash).substr(0, 4) + "\u2026";
}

namespace {

// Just past the bracket that closes the one at `open` ('<' or '('), counting both kinds; npos
// when it is not closed.
size_t pastClosing(std::string_view text, size_t open) {
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '<' || text[i] == '(') ++depth;
    if ((text[i] == '>' || text[i] == ')') && --depth == 0) return i + 1;
  }
  return std::string_view::npos;
}

bool endsWith(const std::string& text, std::string_view tail) {
  return text.size() >= tail.size() &&
         text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

// Whether the qualified name just before the end of `out` is in namespace std.
bool afterStdName(const std::string& out) {
  size_t start = out.size();
  while (start > 0 && (std::isalnum(static_cast<unsigned char>(out[start - 1])) ||
                       out[start - 1] == '_' || out[start - 1] == ':')) {
    --start;
  }
  return out.compare(start, 5, "std::") == 0;
}

}  // namespace

std::string readableNames(std::string_view text) {
  constexpr size_t kLongTemplate = 24, kLongParameters = 60;
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text.substr(i, 5) == "[abi:" && text.find(']', i) != std::string_view::npos) {
      i = text.find(']', i) + 1;
      continue;
    }
    const char c = text[i];
    const bool opens =
        (c == '<' && !endsWith(out, "operator") && !endsWith(out, "operator<")) || c == '(';
    const size_t end = opens ? pastClosing(text, i) : std::string_view::npos;
    if (end == std::string_view::npos) {
      out += c;
      ++i;
      continue;
    }
    std::string inside = readableNames(text.substr(i + 1, end - i - 2));
    if (c == '<' && afterStdName(out) && inside.size() > kLongTemplate) inside = "\u2026";
    if (c == '(' && inside.size() > kLongParameters) inside = "\u2026";
    out += c + inside + text[end - 1];
    i = end;
  }
  return out;
}

std::string upperCase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string_view baseName(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

std::string commText(const CommDesc& c) {
  std::string text = shortHash(c.hash) + "(";
  if (!c.name.empty()) {
    text += c.name + ", ";
  } else if (c.parent != 0) {
    text += "split of " + shortHash(c.parent) + " color " + std::to_string(c.color) + ", ";
  }
  text += std::to_string(c.size) + " ranks)";
  return text;
}

std::string whatHappened(const JobReport& job, int64_t nowNs, int64_t lastActivityNs) {
  int clean = 0, alive = 0, failedExits = 0;
  // A set, not a list searched per process: a job of 4096 hosts made that 8 M string compares
  // (the collector runs this every pass).
  std::unordered_set<std::string_view> hosts;
  for (const ProcessSummary& p : job.processes) {
    clean += p.cleanShutdown;
    failedExits += p.cleanShutdown && p.exitStatus && *p.exitStatus != 0;
    alive += p.alive;
    hosts.insert(p.host);
  }
  int n = static_cast<int>(job.processes.size());
  std::string text = "Job " + job.jobId +
                     (job.attempt > 0 ? " (attempt " + std::to_string(job.attempt + 1) + ")" : "") +
                     ": " + std::to_string(n) + " of " + std::to_string(job.world) +
                     " ranks traced on " + std::to_string(hosts.size()) +
                     (hosts.size() == 1 ? " host" : " hosts") + ". ";
  if (alive > 0) {
    text += std::to_string(alive) + " still running, last NCCL activity " +
            secondsText(nowNs - lastActivityNs) + " ago. ";
  } else if (clean == n && failedExits == 0) {
    text += "Every process ended cleanly. ";
  } else if (clean == n) {
    // Through exit(), but some with a failure status (Python after an uncaught exception).
    text += "Every process ended through exit(), " + std::to_string(failedExits) +
            " with a non-zero status. ";
  } else {
    text += std::to_string(n - clean) + " ended without a clean shutdown (killed or crashed), " +
            "last NCCL activity at " + wallText(lastActivityNs) + ". ";
    if (failedExits > 0) {
      text += std::to_string(failedExits) + " exited with a non-zero status. ";
    }
  }
  int errors = 0;
  const Verdict* first = nullptr;
  bool hangs = job.stalled, corruption = false, failed = false, waitsOnFailure = false;
  for (const Verdict& v : job.verdicts) {
    if (v.kind == VerdictKind::kStraggler) continue;
    ++errors;
    if (first == nullptr && v.primary) first = &v;
    waitsOnFailure |= v.effect == Effect::kHang;  // a failed call's consequences too
    if (!v.primary) continue;
    hangs |= v.effect == Effect::kHang;
    corruption |= v.effect == Effect::kSilentDataCorruption;
    failed |= v.effect == Effect::kError;
  }
  if (errors == 0) {
    text += job.stalled ? "It stopped with calls pending, but no verdict explains why."
                        : "No hang and no mismatch found.";
  } else {
    std::string count = std::to_string(errors) + (errors == 1 ? " finding" : " findings");
    if (failed) {
      text += std::string(hangs || waitsOnFailure ? "An NCCL call failed and the others hang: "
                                                  : "An NCCL call failed: ") +
              count + ". ";
    } else if (hangs) {
      text += "It hung: " + count + ". ";
    } else if (corruption) {
      text += "Nothing hung, but results are wrong (silent data corruption): " + count + ". ";
    } else {
      text += "Nothing hung: " + count + ". ";
    }
    if (first != nullptr) text += "First cause: " + first->explanation + ".";
  }
  if (!job.evidenceGaps.empty()) {
    text += " Evidence is incomplete: ";
    for (size_t i = 0; i < job.evidenceGaps.size(); ++i) {
      text += (i ? "; " : "") + job.evidenceGaps[i];
    }
    text += ".";
  }
  return text;
}

void printVerdictText(const Verdict& v, std::ostream& out, const TextStyle& style) {
  std::string kind = upperCase(kindName(v.kind));
  const char* on = "";
  const char* off = "";
  if (style.colour) {
    on = v.kind == VerdictKind::kStraggler ? "\033[1;33m" : v.primary ? "\033[1;31m" : "\033[1m";
    off = "\033[0m";
  }
  out << "[ncclwatch] " << on << kind << off;
  if (v.effect == Effect::kSilentDataCorruption) out << " (silent data corruption)";
  if (v.kind == VerdictKind::kDeadRank && v.culpritAlive) out << " (alive but silent)";
  if (v.comm.hash != 0) out << " on comm " << commText(v.comm);
  if (v.seq != 0) out << " at call #" << v.seq;
  if (!v.fields.empty()) {
    out << " (";
    for (size_t i = 0; i < v.fields.size(); ++i) out << (i ? ", " : "") << v.fields[i];
    out << " differ)";
  }
  if (!v.primary) out << " [consequence]";
  out << "\n";
  size_t width = 0;
  std::vector<std::string> labels;
  for (const RankClass& rc : v.classes) {
    std::string label = namedRanks(rc.ranks);
    width = std::max(width, label.size());
    labels.push_back(label);
  }
  for (size_t i = 0; i < v.classes.size(); ++i) {
    const RankClass& rc = v.classes[i];
    std::string line = "  " + labels[i] + std::string(width - labels[i].size() + 2, ' ');
    if (rc.call.op != trace::OpKind::kUnknown) {
      line += callText(rc.call);
      if (rc.call.seq != 0 && rc.call.seq != v.seq) line += " #" + std::to_string(rc.call.seq);
      if (rc.call.commHash != 0 && rc.call.commHash != v.comm.hash) {
        line += " on " + shortHash(rc.call.commHash);
      }
      if (rc.call.state != trace::RecordState::kEmpty) {
        line += std::string(" (") +
                (rc.call.startInferred ? "reached" : trace::stateName(rc.call.state)) + ")";
      }
      if (!rc.call.issuedAt.empty()) {
        line += " issued " +
                (rc.call.pythonApi.empty() ? std::string() : "by " + rc.call.pythonApi + "() ") +
                "at " + readableNames(rc.call.issuedAt);
      } else if (rc.call.callSite != 0 && !trace::isPythonSite(rc.call.callSite)) {
        line += " at " + hex(rc.call.callSite);
      }
    }
    if (!rc.call.note.empty()) {
      line += (rc.call.op != trace::OpKind::kUnknown ? ": " : "") + rc.call.note;
    }
    out << line << "\n";
    if (!rc.stackTop.empty()) {
      out << "  " << std::string(width + 2, ' ') << "in " << readableNames(rc.stackTop) << "\n";
    }
  }
  if (!v.culprits.empty()) {
    out << "  culprit" << (v.culprits.size() == 1 ? " " : "s ") << formatRanks(v.culprits)
        << "; diverged " << wallText(v.divergenceNs) << "\n";
  }
  for (const std::string& line : v.inNccl) out << "  in NCCL: " << line << "\n";
  if (!v.doubts.empty()) {
    char level[48];
    std::snprintf(level, sizeof level, "%s (%.2f)", confidenceLevel(v.confidence), v.confidence);
    out << "  confidence " << level << ": ";
    for (size_t i = 0; i < v.doubts.size(); ++i) out << (i ? "; " : "") << v.doubts[i];
    out << "\n";
  }
  out << "  -> " << v.explanation << "\n";
}

void printText(const Report& report, std::ostream& out, const TextStyle& style) {
  if (report.jobs.empty()) out << "No usable trace files.\n";
  for (const JobReport& job : report.jobs) {
    out << job.summary << "\n\n";
    for (const Verdict& v : job.verdicts) {
      printVerdictText(v, out, style);
      out << "\n";
    }
    out << "Communicators:\n";
    for (const CommSummary& c : job.comms) {
      out << "  " << hashText(c.comm.hash) << "  " << c.comm.size << " ranks";
      if (c.comm.parent != 0) {
        out << ", split of " << shortHash(c.comm.parent) << " color " << c.comm.color;
      } else if (!c.comm.name.empty()) {
        out << ", " << c.comm.name;
      }
      out << ", members " << formatRanks(c.ranks) << ", " << c.calls << " calls\n";
      for (const CommSummary::Progress& p : c.progress) {
        std::string label = namedRanks(p.ranks);
        out << "    " << label << std::string(label.size() < 16 ? 16 - label.size() : 1, ' ')
            << "issued #" << p.issuedSeq << ", completed through #" << p.completedSeq;
        if (p.pending > 0) out << ", " << p.pending << " pending";
        out << "\n";
      }
    }
    out << "\n";
  }
}

std::string withdrawalJson(const Verdict& v, const std::string& jobId, int attempt,
                           const std::string& why) {
  std::string out =
      "{\"kind\":\"withdrawn\",\"withdraws\":\"" + std::string(kindName(v.kind)) + "\",\"job\":";
  jsonString(out, jobId);
  out += ",\"attempt\":" + std::to_string(attempt) + ",\"comm\":";
  if (v.comm.hash != 0) {
    jsonComm(out, v.comm);
  } else {
    out += "null";
  }
  out += ",\"seq\":" + std::to_string(v.seq) + ",\"culprits\":";
  jsonRanks(out, v.culprits);
  out += ",\"explanation\":";
  jsonString(out, why);
  out += '}';
  return out;
}

std::string verdictJson(const Verdict& v, const std::string& jobId, int attempt) {
  std::string out = "{\"kind\":\"" + std::string(kindName(v.kind)) + "\",\"job\":";
  jsonString(out, jobId);
  out += ",\"attempt\":" + std::to_string(attempt);
  out += ",\"primary\":" + std::string(v.primary ? "true" : "false");
  out += ",\"effect\":\"" + std::string(effectName(v.effect)) + "\"";
  char confidence[32];
  std::snprintf(confidence, sizeof confidence, "%.2f", v.confidence);
  out += ",\"confidence\":" + std::string(confidence) + ",\"confidence_level\":\"" +
         confidenceLevel(v.confidence) + "\",\"doubts\":[";
  for (size_t i = 0; i < v.doubts.size(); ++i) {
    if (i) out += ',';
    jsonString(out, v.doubts[i]);
  }
  out += ']';
  out += ",\"comm\":";
  if (v.comm.hash != 0) {
    jsonComm(out, v.comm);
  } else {
    out += "null";
  }
  out += ",\"seq\":" + std::to_string(v.seq) + ",\"fields\":[";
  for (size_t i = 0; i < v.fields.size(); ++i) {
    if (i) out += ',';
    jsonString(out, v.fields[i]);
  }
  out += "],\"classes\":[";
  for (size_t i = 0; i < v.classes.size(); ++i) {
    if (i) out += ',';
    out += "{\"ranks\":";
    jsonString(out, formatRanks(v.classes[i].ranks));
    out += ",\"rank_list\":";
    jsonRanks(out, v.classes[i].ranks);
    out += ",\"call\":";
    jsonCall(out, v.classes[i].call);
    out += ",\"stack_top\":";
    jsonString(out, v.classes[i].stackTop);
    out += '}';
  }
  out += "],\"culprits\":";
  jsonRanks(out, v.culprits);
  out += ",\"divergence_ns\":" + std::to_string(v.divergenceNs);
  out += ",\"detection_ns\":" + std::to_string(v.detectionNs);
  out += ",\"explanation\":";
  jsonString(out, v.explanation);
  out += ",\"in_nccl\":[";
  for (size_t i = 0; i < v.inNccl.size(); ++i) {
    if (i) out += ',';
    jsonString(out, v.inNccl[i]);
  }
  out += "]}";
  return out;
}

void printJson(const Report& report, std::ostream& out) {
  std::string text = "{\"jobs\":[";
  for (size_t j = 0; j < report.jobs.size(); ++j) {
    const JobReport& job = report.jobs[j];
    if (j) text += ',';
    text += "{\"job\":";
    jsonString(text, job.jobId);
    text +=
        ",\"attempt\":" + std::to_string(job.attempt) + ",\"world\":" + std::to_string(job.world);
    text += ",\"stalled\":" + std::string(job.stalled ? "true" : "false");
    text += ",\"ended\":" + std::string(job.ended ? "true" : "false");
    text += ",\"summary\":";
    jsonString(text, job.summary);
    text += ",\"evidence_gaps\":[";
    for (size_t i = 0; i < job.evidenceGaps.size(); ++i) {
      if (i) text += ',';
      jsonString(text, job.evidenceGaps[i]);
    }
    text += ']';
    text += ",\"processes\":[";
    for (size_t i = 0; i < job.processes.size(); ++i) {
      const ProcessSummary& p = job.processes[i];
      if (i) text += ',';
      text += "{\"rank\":" + std::to_string(p.rank) + ",\"host\":";
      jsonString(text, p.host);
      text += ",\"pid\":" + std::to_string(p.pid) + ",\"path\":";
      jsonString(text, p.path);
      text += ",\"clean_shutdown\":" + std::string(p.cleanShutdown ? "true" : "false");
      text += ",\"exit_status\":" + (p.exitStatus ? std::to_string(*p.exitStatus) : "null");
      text += ",\"alive\":" + std::string(p.alive ? "true" : "false");
      text += ",\"records\":" + std::to_string(p.records);
      text += ",\"last_activity_ns\":" + std::to_string(p.lastActivityNs) + "}";
    }
    text += "],\"verdicts\":[";
    for (size_t i = 0; i < job.verdicts.size(); ++i) {
      if (i) text += ',';
      text += verdictJson(job.verdicts[i], job.jobId, job.attempt);
    }
    text += "],\"comms\":[";
    for (size_t i = 0; i < job.comms.size(); ++i) {
      const CommSummary& c = job.comms[i];
      if (i) text += ',';
      text += "{\"comm\":";
      jsonComm(text, c.comm);
      text += ",\"ranks\":";
      jsonRanks(text, c.ranks);
      text += ",\"calls\":" + std::to_string(c.calls) + ",\"progress\":[";
      for (size_t k = 0; k < c.progress.size(); ++k) {
        const CommSummary::Progress& p = c.progress[k];
        if (k) text += ',';
        text += "{\"ranks\":";
        jsonString(text, formatRanks(p.ranks));
        text += ",\"issued_seq\":" + std::to_string(p.issuedSeq) +
                ",\"completed_seq\":" + std::to_string(p.completedSeq) +
                ",\"pending\":" + std::to_string(p.pending) + "}";
      }
      text += "]}";
    }
    text += "]}";
  }
  text += "]}\n";
  out << text;
}

}  // namespace ncclwatch::analysis
