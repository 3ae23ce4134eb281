#include "watchdog/dumper.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>

#include "trace/clock.h"
#include "watchdog/python_stacks.h"
#include "watchdog/stacks.h"

namespace ncclwatch::watchdog {
namespace {

constexpr size_t kMaxThreads = 512;
constexpr size_t kMaxPythonBytes = 1 << 20;

StackRoute g_route = StackRoute::kAuto;
StackHelperSetup* g_helper = nullptr;  // set once at prepare time, never freed

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "%016" PRIx64, value);
  return text;
}

const char* stateInWords(const std::string& state) {
  if (state == "issued") {
    return "issued, not started: queued behind earlier work on its stream that never finished";
  }
  if (state == "started") {
    return "started, not completed: everything ahead of it on its stream finished, so it waits "
           "inside the collective (a peer that never arrived, a mismatch, or a stalled network)";
  }
  if (state == "reached") {
    return "reached, not completed: every earlier NCCL call on its stream completed; it waits "
           "inside the collective, or behind GPU work outside NCCL (a kernel on its stream, or "
           "another stream it waits on): one event per call cannot tell which; "
           "NCCLWATCH_EVENTS=full sees the start";
  }
  return state.c_str();
}

// The frames worth showing first: the innermost ones, minus the watchdog's own signal handler.
std::string topFrames(const trace::DumpThread& thread, int count) {
  std::string out;
  int shown = 0;
  for (const trace::DumpFrame& frame : thread.frames) {
    if (shown == count) break;
    char line[512];
    std::snprintf(line, sizeof line, "      #%d %s+0x%" PRIx64 " (%s+0x%" PRIx64 ")\n", shown,
                  frame.function.empty() ? "??" : frame.function.c_str(), frame.functionOffset,
                  frame.module.empty() ? "??" : frame.module.c_str(), frame.moduleOffset);
    out += line;
    ++shown;
  }
  if (!thread.answered) {
    out += "      (no native stack; kernel wait: " +
           (thread.wchan.empty() ? std::string("?") : thread.wchan) + ", " + thread.syscall + ")\n";
  }
  return out;
}

}  // namespace

bool prepareDumps(int stackSignalOffset, std::string* error, StackRoute route) {
  preparePythonStacks(0);
  g_route = route;
  if (route != StackRoute::kSignal && g_helper == nullptr) {
    g_helper = new StackHelperSetup(stackHelperFromEnvironment());
  }
  return StackSampler::install(SIGRTMIN + stackSignalOffset, error);
}

namespace {

std::string signalName() {
  int number = StackSampler::signalNumber();
  return number == 0 ? std::string("(not installed)")
                     : "SIGRTMIN+" + std::to_string(number - SIGRTMIN);
}

// Every thread signalled in turn, each unwinding itself; then symbolized here.
void captureWithSignal(trace::Dump& dump, const DumpBounds& bounds) {
  auto slots = std::make_unique<ThreadStack[]>(kMaxThreads);
  CaptureResult captured =
      StackSampler::captureAll(std::span<ThreadStack>(slots.get(), kMaxThreads), bounds.perThread);
  auto symbolizeUntil = std::chrono::steady_clock::now() + bounds.symbolize;
  for (size_t i = 0; i < captured.count; ++i) {
    const ThreadStack& stack = slots[i];
    trace::DumpThread thread;
    thread.tid = stack.tid;
    thread.name = stack.name;
    thread.answered = stack.answered;
    thread.pthreadId = stack.pthreadId;
    thread.wchan = stack.wchan;
    thread.syscall = stack.syscall;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        symbolizeUntil - std::chrono::steady_clock::now());
    if (left < std::chrono::milliseconds(1)) left = std::chrono::milliseconds(1);
    for (const Frame& frame :
         symbolize(std::span<const uintptr_t>(stack.pcs, stack.frameCount), left)) {
      trace::DumpFrame& out = thread.frames.emplace_back();
      out.pc = frame.pc;
      out.function = frame.function;
      out.functionOffset = frame.functionOffset;
      out.module = frame.module;
      out.moduleOffset = frame.moduleOffset;
      out.buildId = frame.buildId;
    }
    dump.threads.push_back(std::move(thread));
  }
  if (captured.threads > captured.count) {
    dump.reason += " (" + std::to_string(captured.threads - captured.count) +
                   " threads beyond the dump's bound left out)";
  }
}

// The ptrace route when allowed, else the signal; dump.stackRoute says which and why.
void captureNativeStacks(trace::Dump& dump, const DumpBounds& bounds) {
  std::string why;
  if (dump.trigger == "fatal-signal") {
    why = "fatal signal: the dying process starts no helper";
  } else if (g_route == StackRoute::kSignal) {
    why = "NCCLWATCH_STACK_ROUTE=signal";
  } else if (takeStacksThroughHelper(g_helper != nullptr ? *g_helper : StackHelperSetup{},
                                     bounds.helper, &dump.threads, &why)) {
    dump.stackRoute = "ptrace (no signal sent)";
    return;
  } else if (g_route == StackRoute::kPtrace) {
    dump.stackRoute = "none: ptrace failed (" + why + ") and NCCLWATCH_STACK_ROUTE=ptrace";
    return;
  } else {
    why = "fallback: " + why;
  }
  dump.threads.clear();
  captureWithSignal(dump, bounds);
  dump.stackRoute = "signal " + signalName() + " (" + why + ")";
}

}  // namespace

trace::Dump takeDump(const std::string& trigger, const std::string& reason,
                     std::vector<trace::DumpFinding> findings, const DumpBounds& bounds) {
  int64_t start = trace::FastClock::nowNs();
  trace::Dump dump;
  dump.trigger = trigger;
  dump.reason = reason;
  dump.timeNs = start;
  dump.findings = std::move(findings);

  captureNativeStacks(dump, bounds);

  std::string pythonText;
  PythonStackRoute route = dumpPythonStacks(&pythonText, kMaxPythonBytes, bounds.python);
  switch (route) {
    case PythonStackRoute::kNotPython:
      dump.pythonNote = "not a Python process";
      break;
    case PythonStackRoute::kUnavailable:
      dump.pythonNote = pythonText;
      break;
    case PythonStackRoute::kDumpTracebackThreads:
    case PythonStackRoute::kFaulthandler:
      dump.pythonNote = route == PythonStackRoute::kDumpTracebackThreads
                            ? "CPython's _Py_DumpTracebackThreads"
                            : "CPython's faulthandler";
      for (const PythonThreadStack& thread : parsePythonTraceback(pythonText)) {
        trace::DumpPythonThread python;
        python.threadId = thread.threadId;
        python.current = thread.current;
        for (const PythonFrame& frame : thread.frames) {
          python.frames.push_back({frame.file, frame.line, frame.function});
        }
        dump.pythonThreads.push_back(std::move(python));
      }
      break;
  }
  dump.tookNs = trace::FastClock::nowNs() - start;
  return dump;
}

std::string describeDump(const trace::Dump& dump, const ProcessLabel& label, bool written,
                         int topFrameCount) {
  std::string out;
  char line[1024];
  std::snprintf(line, sizeof line, "[ncclwatch] rank %d (pid %d): dump (%s): %s\n", label.rank,
                label.pid, dump.trigger.c_str(), dump.reason.c_str());
  out += line;
  std::vector<int> shownThreads;
  for (const trace::DumpFinding& finding : dump.findings) {
    if (finding.state == "idle") {
      std::snprintf(line, sizeof line,
                    "  comm %s: nothing pending, last completed seq %" PRIu64
                    " %.1f s ago: its next call is not issued, the thread is elsewhere\n",
                    hex(finding.commHash).c_str(), finding.seq,
                    static_cast<double>(finding.ageMs) / 1000.0);
      out += line;
      continue;
    }
    std::snprintf(line, sizeof line, "  comm %s seq %" PRIu64 " %s: pending %.1f s, %s\n    %s\n",
                  hex(finding.commHash).c_str(), finding.seq, finding.op.c_str(),
                  static_cast<double>(finding.ageMs) / 1000.0, stateInWords(finding.state),
                  finding.explanation.c_str());
    out += line;
    for (const trace::DumpThread& thread : dump.threads) {
      if (thread.tid != finding.threadId) continue;
      bool shown =
          std::find(shownThreads.begin(), shownThreads.end(), thread.tid) != shownThreads.end();
      std::snprintf(line, sizeof line, "    issued by thread %d (%s)%s\n", thread.tid,
                    thread.name.c_str(), shown ? ", shown above" : ", now at:");
      out += line;
      if (!shown) out += topFrames(thread, topFrameCount);
      shownThreads.push_back(thread.tid);
    }
  }
  // Python: each thread's innermost frames on one line, the place a user looks first. Threads
  // with no Python frame (a framework's C++ threads that once took the GIL, like PyTorch's
  // autograd threads) are counted, not listed: a line each with nothing on it was noise.
  size_t withoutFrames = 0;
  for (const trace::DumpPythonThread& thread : dump.pythonThreads) {
    if (thread.frames.empty()) {
      ++withoutFrames;
      continue;
    }
    std::string frames;
    for (size_t i = 0; i < thread.frames.size() && i < 3; ++i) {
      const trace::DumpPythonFrame& frame = thread.frames[i];
      size_t slash = frame.file.rfind('/');
      frames += (i ? " <- " : "") + frame.function + " (" +
                frame.file.substr(slash == std::string::npos ? 0 : slash + 1) + ":" +
                std::to_string(frame.line) + ")";
    }
    std::snprintf(line, sizeof line, "    python thread %" PRIx64 "%s: %s\n", thread.threadId,
                  thread.current ? " (current)" : "", frames.c_str());
    out += line;
  }
  if (withoutFrames > 0) {
    std::snprintf(line, sizeof line, "    %zu more Python thread%s with no Python frame\n",
                  withoutFrames, withoutFrames == 1 ? "" : "s");
    out += line;
  }
  size_t answered = 0;
  for (const trace::DumpThread& thread : dump.threads) answered += thread.answered ? 1 : 0;
  std::string route = dump.stackRoute.empty() ? "" : " by " + dump.stackRoute;
  std::string where = written                   ? "written to " + label.tracePath
                      : label.tracePath.empty() ? std::string("kept on stderr only (no trace file)")
                                                : "COULD NOT be written to " + label.tracePath;
  // The note is a line of the dump's Python section (its newline would break this one in two).
  std::string pythonNote = dump.pythonNote;
  while (!pythonNote.empty() && (pythonNote.back() == '\n' || pythonNote.back() == ' ')) {
    pythonNote.pop_back();
  }
  std::snprintf(
      line, sizeof line, "  %zu threads (%zu with native stacks%s), Python: %s; %s in %.0f ms\n",
      dump.threads.size(), answered, route.c_str(),
      dump.pythonThreads.empty()
          ? pythonNote.c_str()
          : (std::to_string(dump.pythonThreads.size()) + " threads via " + pythonNote).c_str(),
      where.c_str(), static_cast<double>(dump.tookNs) / 1e6);
  out += line;
  return out;
}

}  // namespace ncclwatch::watchdog
