#include "show.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "trace/fingerprint.h"

namespace ncclwatch::show {
namespace {

using trace::CallRecord;
using trace::CommInfo;
using trace::TraceFile;

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "%016" PRIx64, value);
  return text;
}

std::string milliseconds(int64_t ns, int64_t anchorNs) {
  if (ns == 0) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", static_cast<double>(ns - anchorNs) / 1e6);
  return text;
}

std::string jsonString(const char* text, size_t maxLength) {
  std::string out = "\"";
  for (size_t i = 0; i < maxLength && text[i] != '\0'; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

template <size_t N>
std::string jsonString(const char (&text)[N]) {
  return jsonString(text, N);
}

const char* kindName(uint8_t kind) {
  return trace::opName(static_cast<trace::OpKind>(kind));
}

}  // namespace

// The table's trailing notes: how far a record's state can be trusted. Lifecycle calls never
// get GPU events (they are done when they return), so only communication says "untracked".
std::string flagNotes(const CallRecord& record) {
  std::string notes;
  bool communication = trace::isCollective(record.op) || trace::isPointToPoint(record.op) ||
                       trace::isOneSided(record.op);
  if (record.flags & trace::kRecordInGroup) notes += " group";
  if (record.flags & trace::kRecordCaptured) notes += " captured";
  if (communication && (record.flags & trace::kRecordNoEvents)) {
    notes += (record.flags & trace::kRecordShed) ? " untracked(shed)" : " untracked";
  }
  if (record.flags & trace::kRecordFromPlugin) notes += " plugin";
  if (record.flags & trace::kRecordKernelTracked) notes += " kernel-tracked";
  if (record.flags & trace::kRecordStartInferred) notes += " start-inferred";
  if (trace::isPythonSite(record.callSite)) {
    notes += " py#" + std::to_string(trace::pythonSiteNumber(record.callSite));
  }
  return notes;
}

// How the process saw its calls, where pending calls waited inside NCCL, and the Python lines
// the records' py#N refer to; each section only when the trace has it.
void printPluginAndSites(const TraceFile& file, std::ostream& out) {
  uint32_t sources = file.header.recordingSources;
  if (sources != 0) {
    out << "\nseen through:";
    if (sources & trace::kSourceInterposer) out << " LD_PRELOAD wrappers";
    if ((sources & trace::kSourceInterposer) && (sources & trace::kSourcePlugin)) out << ",";
    if (sources & trace::kSourcePlugin) out << " NCCL profiler plugin";
    out << "\n";
  }
  if (!file.waits.empty()) {
    out << "\nwaiting inside NCCL (profiler plugin):\n";
    for (const trace::WaitNote& note : file.waits) {
      out << "  comm " << hex(note.commHash) << " seq " << note.seq << ": "
          << trace::describeWait(note, note.updatedNs) << "\n";
    }
  }
  if (!file.pythonSites.empty()) {
    out << "\nPython call sites:\n";
    for (const trace::PythonSite& site : file.pythonSites) {
      out << "  py#" << site.number << "  " << trace::issuedAtText(site) << "\n";
      for (const std::string& frame : site.frames) out << "          " << frame << "\n";
    }
  }
}

// Each dump: when and why, the findings, every thread's frames, the Python stacks.
void printDumps(const TraceFile& file, std::ostream& out) {
  if (file.dumps.empty()) return;
  out << "\ndumps:\n";
  int number = 0;
  for (const trace::Dump& dump : file.dumps) {
    out << "  dump " << ++number << " (" << dump.trigger << ") at "
        << milliseconds(dump.timeNs, file.header.anchorMonotonicNs) << " ms: " << dump.reason
        << " (took " << dump.tookNs / 1000000 << " ms)\n";
    if (dump.partial) out << "    PARTIAL: the process ended while writing this dump\n";
    if (!dump.stackRoute.empty()) out << "    native stacks: " << dump.stackRoute << "\n";
    for (const trace::DumpFinding& finding : dump.findings) {
      out << "    finding: comm " << hex(finding.commHash) << " seq " << finding.seq << " "
          << finding.op << " " << finding.state << ", " << finding.ageMs
          << " ms: " << finding.explanation << "\n";
    }
    for (const trace::DumpThread& thread : dump.threads) {
      out << "    thread " << thread.tid << " (" << thread.name << ")";
      if (!thread.answered) {
        out << ": no native stack; kernel wait " << (thread.wchan.empty() ? "?" : thread.wchan)
            << ", " << thread.syscall;
      }
      out << "\n";
      int depth = 0;
      for (const trace::DumpFrame& frame : thread.frames) {
        char line[1024];
        std::snprintf(line, sizeof line, "      #%-2d %s+0x%" PRIx64 " (%s+0x%" PRIx64 ")\n",
                      depth++, frame.function.empty() ? "??" : frame.function.c_str(),
                      frame.functionOffset, frame.module.empty() ? "??" : frame.module.c_str(),
                      frame.moduleOffset);
        out << line;
      }
    }
    out << "    python: " << dump.pythonNote << "\n";
    for (const trace::DumpPythonThread& thread : dump.pythonThreads) {
      out << "    python thread " << hex(thread.threadId) << (thread.current ? " (current)" : "")
          << "\n";
      for (const trace::DumpPythonFrame& frame : thread.frames) {
        out << "      File \"" << frame.file << "\", line " << frame.line << ", in "
            << frame.function << "\n";
      }
    }
  }
}

void printDumpsJson(const TraceFile& file, std::ostream& out) {
  out << ",\"dumps\":[";
  for (size_t d = 0; d < file.dumps.size(); ++d) {
    const trace::Dump& dump = file.dumps[d];
    auto text = [](const std::string& value) { return jsonString(value.c_str(), value.size()); };
    out << (d ? "," : "") << "{\"trigger\":" << text(dump.trigger)
        << ",\"reason\":" << text(dump.reason) << ",\"time_ns\":" << dump.timeNs
        << ",\"took_ns\":" << dump.tookNs << ",\"partial\":" << (dump.partial ? "true" : "false")
        << ",\"stack_route\":" << text(dump.stackRoute) << ",\"findings\":[";
    for (size_t i = 0; i < dump.findings.size(); ++i) {
      const trace::DumpFinding& f = dump.findings[i];
      out << (i ? "," : "") << "{\"comm\":\"" << hex(f.commHash) << "\",\"seq\":" << f.seq
          << ",\"op\":" << text(f.op) << ",\"state\":" << text(f.state) << ",\"age_ms\":" << f.ageMs
          << ",\"thread\":" << f.threadId << ",\"explanation\":" << text(f.explanation) << "}";
    }
    out << "],\"threads\":[";
    for (size_t i = 0; i < dump.threads.size(); ++i) {
      const trace::DumpThread& t = dump.threads[i];
      out << (i ? "," : "") << "{\"tid\":" << t.tid << ",\"name\":" << text(t.name)
          << ",\"answered\":" << (t.answered ? "true" : "false") << ",\"wchan\":" << text(t.wchan)
          << ",\"syscall\":" << text(t.syscall) << ",\"frames\":[";
      for (size_t j = 0; j < t.frames.size(); ++j) {
        const trace::DumpFrame& f = t.frames[j];
        out << (j ? "," : "") << "{\"pc\":\"" << hex(f.pc) << "\",\"function\":" << text(f.function)
            << ",\"function_offset\":" << f.functionOffset << ",\"module\":" << text(f.module)
            << ",\"module_offset\":" << f.moduleOffset << ",\"build_id\":" << text(f.buildId)
            << "}";
      }
      out << "]}";
    }
    out << "],\"python\":" << text(dump.pythonNote) << ",\"python_threads\":[";
    for (size_t i = 0; i < dump.pythonThreads.size(); ++i) {
      const trace::DumpPythonThread& t = dump.pythonThreads[i];
      out << (i ? "," : "") << "{\"thread\":\"" << hex(t.threadId)
          << "\",\"current\":" << (t.current ? "true" : "false") << ",\"frames\":[";
      for (size_t j = 0; j < t.frames.size(); ++j) {
        const trace::DumpPythonFrame& f = t.frames[j];
        out << (j ? "," : "") << "{\"file\":" << text(f.file) << ",\"line\":" << f.line
            << ",\"function\":" << text(f.function) << "}";
      }
      out << "]}";
    }
    out << "]}";
  }
  out << "]";
}

void printTable(const TraceFile& file, std::ostream& out) {
  const trace::RingHeader& h = file.header;
  char line[512];
  out << "file: " << file.path << "\n";
  std::snprintf(line, sizeof line,
                "process: pid %d on %.64s, rank %d of %d (local %d), job %.64s\n", h.pid, h.host,
                h.rank, h.world, h.localRank, h.jobId);
  out << line;
  std::snprintf(line, sizeof line, "nccl: %d %.256s\n", h.ncclVersion,
                h.ncclLibrary[0] ? h.ncclLibrary : "(unknown library)");
  out << line;
  out << "ended: ";
  if (h.cleanShutdown) {
    out << "cleanly";
    if (h.exitStatusKnown) out << ", exit status " << h.exitStatus;
    out << "\n";
  } else if (h.fatalSignal != 0) {
    out << "by signal " << h.fatalSignal << " (" << strsignal(h.fatalSignal) << ") in thread "
        << h.fatalThread << "\n";
  } else {
    out << "not cleanly (still running, killed or crashed)\n";
  }
  std::snprintf(line, sizeof line,
                "records: %zu valid in %" PRIu64 " slots (%" PRIu64 " empty), %" PRIu64
                " ever written; dropped: %" PRIu64 " communicators, %" PRIu64 " records\n",
                file.records.size(), file.slotsPresent, file.emptySlots, h.nextIndex,
                h.droppedComms, h.droppedRecords);
  out << line;
  if (file.continuous) {
    std::snprintf(line, sizeof line,
                  "mode: full trace: %" PRIu64 " records from %" PRIu64 " segments, %" PRIu64
                  " from the ring; %" PRIu64 " lost\n",
                  file.segmentRecords, file.segments, file.ringRecords, file.lostRecords);
  } else {
    std::snprintf(line, sizeof line, "mode: ring (the newest %u calls)\n", h.capacity);
  }
  out << line;
  if (h.unwrittenBlocks + h.failedSegmentWrites + h.mappingFaults != 0) {
    // Storage trouble the writer survived (a full disk, the file truncated under it).
    std::snprintf(line, sizeof line,
                  "storage: %" PRIu64 " dump blocks not written, %" PRIu64
                  " segment writes failed, %u pages faulted%s\n",
                  h.unwrittenBlocks, h.failedSegmentWrites, h.mappingFaults,
                  h.mappingFaults != 0 ? " (the file stopped following the process there)" : "");
    out << line;
  }
  for (const trace::TraceProblem& problem : file.problems) {
    out << "problem at offset " << problem.offset << ": " << problem.what << "\n";
  }
  out << "\ncommunicators:\n";
  std::snprintf(line, sizeof line, "  %-16s  %-16s  %5s  %4s  %5s  %-6s  %s\n", "comm", "parent",
                "ranks", "rank", "color", "kind", "name");
  out << line;
  for (const CommInfo& comm : file.comms) {
    std::snprintf(line, sizeof line, "  %-16s  %-16s  %5d  %4d  %5d  %-6s  %.64s\n",
                  hex(comm.commHash).c_str(), comm.parentHash ? hex(comm.parentHash).c_str() : "-",
                  comm.nranks, comm.rank, comm.color, kindName(comm.kind), comm.name);
    out << line;
  }
  out << "\nrecords (times in ms since the trace began):\n";
  std::snprintf(line, sizeof line,
                "  %6s  %-16s  %5s  %-13s  %10s  %-8s  %-6s  %5s  %-9s  %10s  %10s  %10s  %s\n",
                "index", "comm", "seq", "op", "count", "dtype", "redop", "r/p", "state", "issued",
                "started", "completed", "result");
  out << line;
  for (const CallRecord& r : file.records) {
    bool hasRedop = trace::hasReduction(r.op);
    bool movesData = trace::isCollective(r.op) || trace::isPointToPoint(r.op) ||
                     r.op == trace::OpKind::kPutSignal;
    std::snprintf(
        line, sizeof line,
        "  %6" PRIu64 "  %-16s  %5" PRIu64 "  %-13s  %10" PRIu64
        "  %-8s  %-6s  %5d  %-9s  %10s  %10s  %10s  %d%s\n",
        r.ringIndex, hex(r.commHash).c_str(), r.seq, trace::opName(r.op), r.count,
        movesData ? dtypeName(r.dtype) : "-", hasRedop ? redopName(r.redop).c_str() : "-",
        r.rootOrPeer, stateName(r.state), milliseconds(r.issueNs, h.anchorMonotonicNs).c_str(),
        milliseconds(r.startNs, h.anchorMonotonicNs).c_str(),
        milliseconds(r.completeNs, h.anchorMonotonicNs).c_str(), r.result, flagNotes(r).c_str());
    out << line;
  }
  printPluginAndSites(file, out);
  printDumps(file, out);
}

void printJson(const TraceFile& file, std::ostream& out) {
  const trace::RingHeader& h = file.header;
  out << "{\"file\":" << jsonString(file.path.c_str(), file.path.size())
      << ",\"usable\":" << (file.usable ? "true" : "false") << ",\"pid\":" << h.pid
      << ",\"host\":" << jsonString(h.host) << ",\"rank\":" << h.rank << ",\"world\":" << h.world
      << ",\"local_rank\":" << h.localRank << ",\"job\":" << jsonString(h.jobId)
      << ",\"nccl_version\":" << h.ncclVersion << ",\"nccl_library\":" << jsonString(h.ncclLibrary)
      << ",\"clean_shutdown\":" << (h.cleanShutdown ? "true" : "false") << ",\"exit_status\":"
      << (h.exitStatusKnown ? std::to_string(h.exitStatus) : std::string("null"))
      << ",\"fatal_signal\":" << h.fatalSignal << ",\"fatal_thread\":" << h.fatalThread
      << ",\"anchor_monotonic_ns\":" << h.anchorMonotonicNs
      << ",\"anchor_realtime_ns\":" << h.anchorRealtimeNs << ",\"next_index\":" << h.nextIndex
      << ",\"dropped_comms\":" << h.droppedComms << ",\"dropped_records\":" << h.droppedRecords
      << ",\"mode\":\"" << (file.continuous ? "full" : "ring") << "\""
      << ",\"segments\":" << file.segments << ",\"segment_records\":" << file.segmentRecords
      << ",\"lost_records\":" << file.lostRecords << ",\"problems\":[";
  for (size_t i = 0; i < file.problems.size(); ++i) {
    out << (i ? "," : "") << "{\"offset\":" << file.problems[i].offset
        << ",\"what\":" << jsonString(file.problems[i].what.c_str(), file.problems[i].what.size())
        << "}";
  }
  out << "],\"communicators\":[";
  for (size_t i = 0; i < file.comms.size(); ++i) {
    const CommInfo& c = file.comms[i];
    out << (i ? "," : "") << "{\"comm\":\"" << hex(c.commHash) << "\",\"parent\":\""
        << hex(c.parentHash) << "\",\"nranks\":" << c.nranks << ",\"rank\":" << c.rank
        << ",\"device\":" << c.device << ",\"color\":" << c.color
        << ",\"split_index\":" << c.splitIndex << ",\"shrink_index\":" << c.shrinkIndex
        << ",\"kind\":\"" << kindName(c.kind) << "\",\"name\":" << jsonString(c.name) << "}";
  }
  out << "],\"records\":[";
  for (size_t i = 0; i < file.records.size(); ++i) {
    const CallRecord& r = file.records[i];
    out << (i ? ",\n" : "\n") << "{\"index\":" << r.ringIndex << ",\"comm\":\"" << hex(r.commHash)
        << "\",\"seq\":" << r.seq << ",\"p2p_seq\":" << r.p2pSeq
        << ",\"nccl_seq\":" << r.ncclSeqNumber << ",\"op\":\"" << trace::opName(r.op)
        << "\",\"count\":" << r.count << ",\"dtype\":\"" << dtypeName(r.dtype) << "\",\"redop\":\""
        << redopName(r.redop) << "\",\"root_or_peer\":" << r.rootOrPeer << ",\"state\":\""
        << stateName(r.state)
        << "\",\"captured\":" << ((r.flags & trace::kRecordCaptured) ? "true" : "false")
        << ",\"no_events\":" << ((r.flags & trace::kRecordNoEvents) ? "true" : "false")
        << ",\"in_group\":" << ((r.flags & trace::kRecordInGroup) ? "true" : "false")
        << ",\"start_inferred\":" << ((r.flags & trace::kRecordStartInferred) ? "true" : "false")
        << ",\"fingerprint\":\"" << hex(r.fingerprint) << "\",\"stream\":\"" << hex(r.stream)
        << "\",\"issue_ns\":" << r.issueNs << ",\"start_ns\":" << r.startNs
        << ",\"complete_ns\":" << r.completeNs << ",\"result\":" << r.result
        << ",\"thread\":" << r.threadId << ",\"call_site\":\""
        << (trace::isPythonSite(r.callSite)
                ? "py#" + std::to_string(trace::pythonSiteNumber(r.callSite))
                : hex(r.callSite))
        << "\",\"from_plugin\":" << ((r.flags & trace::kRecordFromPlugin) ? "true" : "false")
        << "}";
  }
  out << "]";
  printDumpsJson(file, out);
  out << "}\n";
}

int run(const std::string& path, bool json, std::ostream& out, std::ostream& err) {
  trace::TraceFile file = trace::readTraceFile(path);
  if (!file.usable) {
    std::string why = file.problems.empty() ? "not a trace" : file.problems.front().what;
    err << "ncclwatch show: " << path << ": " << why << "\n";
    return 2;
  }
  if (json) {
    printJson(file, out);
  } else {
    printTable(file, out);
  }
  return file.problems.empty() ? 0 : 1;
}

}  // namespace ncclwatch::show
