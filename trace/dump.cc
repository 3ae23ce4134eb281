#include "trace/dump.h"

#include <charconv>
#include <cinttypes>
#include <cstdio>

namespace ncclwatch::trace {
namespace {

constexpr std::string_view kFirstLine = "ncclwatch-dump 1";

void field(std::string& out, std::string_view value) {
  out.push_back('\t');
  for (char c : value) out.push_back(c == '\t' || c == '\n' || c == '\r' ? ' ' : c);
}
void field(std::string& out, uint64_t value, bool hex = false) {
  char text[32];
  std::snprintf(text, sizeof text, hex ? "%" PRIx64 : "%" PRIu64, value);
  field(out, text);
}
void fieldSigned(std::string& out, int64_t value) {
  field(out, std::to_string(value));
}

std::vector<std::string_view> split(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  for (size_t tab = line.find('\t'); tab != std::string_view::npos; tab = line.find('\t', start)) {
    fields.push_back(line.substr(start, tab - start));
    start = tab + 1;
  }
  fields.push_back(line.substr(start));
  return fields;
}

template <typename Number>
bool number(std::string_view text, Number* value, int base = 10) {
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value, base);
  return error == std::errc() && end == text.data() + text.size();
}

}  // namespace

std::string formatDump(const Dump& dump) {
  std::string out(kFirstLine);
  out += "\ntrigger";
  field(out, dump.trigger);
  out += "\nreason";
  field(out, dump.reason);
  out += "\ntime_ns";
  fieldSigned(out, dump.timeNs);
  out += "\ntook_ns";
  fieldSigned(out, dump.tookNs);
  if (!dump.stackRoute.empty()) {
    out += "\nstack_route";
    field(out, dump.stackRoute);
  }
  for (const DumpFinding& finding : dump.findings) {
    out += "\nfinding";
    field(out, finding.commHash, true);
    field(out, finding.seq);
    field(out, finding.op);
    field(out, finding.state);
    fieldSigned(out, finding.ageMs);
    fieldSigned(out, finding.threadId);
    field(out, finding.explanation);
  }
  for (const DumpThread& thread : dump.threads) {
    out += "\nthread";
    fieldSigned(out, thread.tid);
    field(out, thread.answered ? "1" : "0");
    field(out, thread.name);
    field(out, thread.wchan);
    field(out, thread.syscall);
    if (thread.pthreadId != 0) field(out, thread.pthreadId, true);
    for (const DumpFrame& frame : thread.frames) {
      out += "\nframe";
      field(out, frame.pc, true);
      field(out, frame.function);
      field(out, frame.functionOffset, true);
      field(out, frame.module);
      field(out, frame.moduleOffset, true);
      field(out, frame.buildId);
    }
  }
  out += "\npython";
  field(out, dump.pythonNote);
  for (const DumpPythonThread& thread : dump.pythonThreads) {
    out += "\npythread";
    field(out, thread.threadId, true);
    field(out, thread.current ? "1" : "0");
    for (const DumpPythonFrame& frame : thread.frames) {
      out += "\npyframe";
      field(out, frame.file);
      fieldSigned(out, frame.line);
      field(out, frame.function);
    }
  }
  out += "\nend\n";
  return out;
}

bool parseDump(std::string_view text, Dump* dump, std::string* problem) {
  *dump = Dump{};
  size_t lineNumber = 0;
  bool ended = false;
  auto fail = [&](const std::string& what) {
    *problem = "dump line " + std::to_string(lineNumber) + ": " + what;
    return false;
  };
  while (!text.empty()) {
    size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    ++lineNumber;
    if (lineNumber == 1) {
      if (line != kFirstLine) return fail("not an ncclwatch dump (first line)");
      continue;
    }
    if (ended) {
      if (line.empty()) continue;
      return fail("text after 'end'");
    }
    std::vector<std::string_view> f = split(line);
    std::string_view kind = f[0];
    auto need = [&](size_t count) { return f.size() == count; };
    if (kind == "end" && need(1)) {
      ended = true;
    } else if (kind == "trigger" && need(2)) {
      dump->trigger = f[1];
    } else if (kind == "reason" && need(2)) {
      dump->reason = f[1];
    } else if (kind == "time_ns" && need(2)) {
      if (!number(f[1], &dump->timeNs)) return fail("bad time_ns");
    } else if (kind == "took_ns" && need(2)) {
      if (!number(f[1], &dump->tookNs)) return fail("bad took_ns");
    } else if (kind == "stack_route" && need(2)) {
      dump->stackRoute = f[1];
    } else if (kind == "finding" && need(8)) {
      DumpFinding finding;
      if (!number(f[1], &finding.commHash, 16) || !number(f[2], &finding.seq) ||
          !number(f[5], &finding.ageMs) || !number(f[6], &finding.threadId)) {
        return fail("bad number in a finding");
      }
      finding.op = f[3];
      finding.state = f[4];
      finding.explanation = f[7];
      dump->findings.push_back(std::move(finding));
    } else if (kind == "thread" && (need(6) || need(7))) {
      // The 7th field (pthread id) is optional: dumps written before it existed have 6.
      DumpThread thread;
      if (!number(f[1], &thread.tid) || (f[2] != "0" && f[2] != "1") ||
          (f.size() == 7 && !number(f[6], &thread.pthreadId, 16))) {
        return fail("bad thread line");
      }
      thread.answered = f[2] == "1";
      thread.name = f[3];
      thread.wchan = f[4];
      thread.syscall = f[5];
      dump->threads.push_back(std::move(thread));
    } else if (kind == "frame" && need(7)) {
      if (dump->threads.empty()) return fail("frame before any thread");
      DumpFrame frame;
      if (!number(f[1], &frame.pc, 16) || !number(f[3], &frame.functionOffset, 16) ||
          !number(f[5], &frame.moduleOffset, 16)) {
        return fail("bad number in a frame");
      }
      frame.function = f[2];
      frame.module = f[4];
      frame.buildId = f[6];
      dump->threads.back().frames.push_back(std::move(frame));
    } else if (kind == "python" && need(2)) {
      dump->pythonNote = f[1];
    } else if (kind == "pythread" && need(3)) {
      DumpPythonThread thread;
      if (!number(f[1], &thread.threadId, 16) || (f[2] != "0" && f[2] != "1")) {
        return fail("bad pythread line");
      }
      thread.current = f[2] == "1";
      dump->pythonThreads.push_back(std::move(thread));
    } else if (kind == "pyframe" && need(4)) {
      if (dump->pythonThreads.empty()) return fail("pyframe before any pythread");
      DumpPythonFrame frame;
      if (!number(f[2], &frame.line)) return fail("bad line number in a pyframe");
      frame.file = f[1];
      frame.function = f[3];
      dump->pythonThreads.back().frames.push_back(std::move(frame));
    } else {
      return fail("unknown or malformed line '" + std::string(line.substr(0, 40)) + "'");
    }
  }
  if (!ended) return fail("no 'end' line: the dump was cut short");
  return true;
}

}  // namespace ncclwatch::trace
