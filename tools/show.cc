#include "show.h"

#include <cinttypes>
#include <cstdio>

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

const char* dtypeName(int dtype) {
  static const char* const kNames[] = {"int8", "uint8", "int32",  "uint32",   "int64",   "uint64",
                                       "half", "float", "double", "bfloat16", "fp8e4m3", "fp8e5m2"};
  return dtype >= 0 && dtype < 12 ? kNames[dtype] : "?";
}

std::string redopName(int redop) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  if (redop >= 0 && redop < 5) return kNames[redop];
  return "premulsum#" + std::to_string(redop);
}

const char* stateName(trace::RecordState state) {
  switch (state) {
    case trace::RecordState::kEmpty:
      return "empty";
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
  }
  return "?";
}

// The table's trailing notes: how far a record's state can be trusted.
std::string flagNotes(uint8_t flags) {
  std::string notes;
  if (flags & trace::kRecordInGroup) notes += " group";
  if (flags & trace::kRecordCaptured) notes += " captured";
  if (flags & trace::kRecordNoEvents) notes += " untracked";
  return notes;
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
  out << "ended: "
      << (h.cleanShutdown ? "cleanly" : "not cleanly (still running, killed or crashed)") << "\n";
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
    bool movesData = trace::isCollective(r.op) || trace::isPointToPoint(r.op);
    std::snprintf(line, sizeof line,
                  "  %6" PRIu64 "  %-16s  %5" PRIu64 "  %-13s  %10" PRIu64
                  "  %-8s  %-6s  %5d  %-9s  %10s  %10s  %10s  %d%s\n",
                  r.ringIndex, hex(r.commHash).c_str(), r.seq, trace::opName(r.op), r.count,
                  movesData ? dtypeName(r.dtype) : "-", hasRedop ? redopName(r.redop).c_str() : "-",
                  r.rootOrPeer, stateName(r.state),
                  milliseconds(r.issueNs, h.anchorMonotonicNs).c_str(),
                  milliseconds(r.startNs, h.anchorMonotonicNs).c_str(),
                  milliseconds(r.completeNs, h.anchorMonotonicNs).c_str(), r.result,
                  flagNotes(r.flags).c_str());
    out << line;
  }
}

void printJson(const TraceFile& file, std::ostream& out) {
  const trace::RingHeader& h = file.header;
  out << "{\"file\":" << jsonString(file.path.c_str(), file.path.size())
      << ",\"usable\":" << (file.usable ? "true" : "false") << ",\"pid\":" << h.pid
      << ",\"host\":" << jsonString(h.host) << ",\"rank\":" << h.rank << ",\"world\":" << h.world
      << ",\"local_rank\":" << h.localRank << ",\"job\":" << jsonString(h.jobId)
      << ",\"nccl_version\":" << h.ncclVersion << ",\"nccl_library\":" << jsonString(h.ncclLibrary)
      << ",\"clean_shutdown\":" << (h.cleanShutdown ? "true" : "false")
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
        << ",\"fingerprint\":\"" << hex(r.fingerprint) << "\",\"stream\":\"" << hex(r.stream)
        << "\",\"issue_ns\":" << r.issueNs << ",\"start_ns\":" << r.startNs
        << ",\"complete_ns\":" << r.completeNs << ",\"result\":" << r.result
        << ",\"thread\":" << r.threadId << ",\"call_site\":\"" << hex(r.callSite) << "\"}";
  }
  out << "]}\n";
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
