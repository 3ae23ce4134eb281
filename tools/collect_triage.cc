#include "collect_triage.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "analysis/describe.h"
#include "analysis/recent_two.h"
#include "load.h"
#include "trace/job_secret.h"
#include "trace/python_sites.h"

namespace ncclwatch::collect {
namespace wire = trace::wire;

namespace {

constexpr int64_t kReconnectGraceNs = 1000 * kMs;
// Agents poll every 100 ms by default and a dump takes tens of ms: the aborts wait for them.
constexpr int64_t kAbortAfterDumpNs = 400 * kMs;
// How long a divergence waits for its ordinal's last member while members keep reporting it, in
// settles (settleMs each).
constexpr int64_t kDivergenceWaitSettles = 8;
// How long a verdict waits for the Python line of one of its calls (sitesPending): two of an
// agent's polls (100 ms) and the way.
constexpr int64_t kSiteWaitNs = 300 * kMs;

// How long ranks wait inside a root init before the job reads as hung there
// (analysis::Options::initPatienceNs): NCCLWATCH_INIT_PATIENCE_MS, read once; a bad value is
// said once and the default kept.
int64_t initPatienceNs() {
  static const int64_t patience = [] {
    const int64_t fallback = analysis::Options{}.initPatienceNs;
    const char* text = std::getenv("NCCLWATCH_INIT_PATIENCE_MS");
    if (text == nullptr || *text == '\0') return fallback;
    char* end = nullptr;
    errno = 0;
    long long ms = std::strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || ms < 0 || ms > 86'400'000) {
      std::fprintf(stderr,
                   "[ncclwatch] NCCLWATCH_INIT_PATIENCE_MS=%s is not 0-86400000 ms: kept %lld ms\n",
                   text, static_cast<long long>(fallback / kMs));
      return fallback;
    }
    return static_cast<int64_t>(ms) * kMs;
  }();
  return patience;
}

// Whether a class's call was issued from a Python line whose text has not arrived yet.
bool sitesPending(const analysis::Verdict& verdict) {
  return std::any_of(verdict.classes.begin(), verdict.classes.end(), [](const auto& rankClass) {
    return trace::isPythonSite(rankClass.call.callSite) && rankClass.call.issuedAt.empty();
  });
}

// "<host>-": how this host's trace files' names begin (<host>-<pid>.ncclwatch); a shared folder
// holds every host's.
std::string thisHostsTracePrefix() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + "-";
}

// A sidecar that no agent reached in this long looks in its folder for its ended job's files:
// agents that are coming connect within a poll (100 ms) of their collector listening.
constexpr int64_t kOrphanWaitNs = 1000 * kMs;

// The CPU time of this process, every thread's: a pass that splits its work over threads
// (Options::threads) costs more CPU than the wall clock shows.
int64_t processCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int64_t realtimeNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Whether every member of the verdict's communicator has issued its call: then no rank still
// to report can change the classes, and the verdict need not wait to settle.
bool everyMemberSpoke(const analysis::Verdict& verdict, const analysis::JobReport& job) {
  for (const analysis::CommSummary& comm : job.comms) {
    if (comm.comm.hash != verdict.comm.hash) continue;
    if (static_cast<int>(comm.ranks.size()) < comm.comm.size) return false;
    for (const analysis::CommSummary::Progress& progress : comm.progress) {
      if (progress.issuedSeq < verdict.seq) return false;
    }
    return true;
  }
  return false;
}

// A TraceFile's header is the ring file's (trace/ring_format.h): 15 KB, 14 KB of which are the
// ring's own communicator table and wait notes. The collector never fills those two (an agent's
// tables arrive as TraceFile::comms and ::waits, which the analysis reads): they hold zeros, and
// the whole pages inside them go back to the kernel, where they read as zeros again. At 4096
// ranks that is about 40 of the 59 MiB the headers took (docs/scale.md).
static_assert(offsetof(trace::RingHeader, waits) ==
              offsetof(trace::RingHeader, comms) + sizeof(trace::RingHeader::comms));
void releaseRingTables(trace::TraceFile& file) {
  static const auto kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  auto begin = reinterpret_cast<uintptr_t>(&file.header.comms[0]);
  auto end = reinterpret_cast<uintptr_t>(&file.header.waits[0]) + sizeof file.header.waits;
  uintptr_t from = (begin + kPage - 1) & ~(kPage - 1), to = end & ~(kPage - 1);
  if (to > from) madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
}

}  // namespace

void Triage::addFile(trace::TraceFile file, int world) {
  std::memset(file.header.comms, 0, sizeof file.header.comms);
  std::memset(file.header.waits, 0, sizeof file.header.waits);
  // Room for the whole job at once: every move to a larger array would bring the pages back.
  size_t wanted = std::min<size_t>(static_cast<size_t>(std::max(world, 1)), 4 * options_.maxAgents);
  if (files_.capacity() < wanted) files_.reserve(wanted);
  std::string_view jobId = trace::jobIdOf(file.header);
  auto job = jobRanks_.find(jobId);
  if (job == jobRanks_.end()) job = jobRanks_.emplace(std::string(jobId), JobRanks{}).first;
  job->second.world = std::max(job->second.world, file.header.world);
  job->second.ranks.insert(file.header.rank);
  const trace::TraceFile* before = files_.data();
  files_.push_back(std::move(file));
  if (files_.data() != before) {
    for (trace::TraceFile& moved : files_) releaseRingTables(moved);
  } else {
    releaseRingTables(files_.back());
  }
}

int Triage::hello(size_t connection, const wire::Hello& hello) {
  if (!wire::secretMatches(hello.secret, options_.secret)) {
    // An agent of ncclwatch with another secret, started after this collector: a newer job (an
    // elastic restart's next attempt) expects its own collector on this port.
    if (hello.anchorRealtimeNs > startedRealtimeNs_) counters_.newerJobKnocks++;
    return -1;
  }
  auto key = std::make_tuple(std::string(hello.jobId, strnlen(hello.jobId, sizeof hello.jobId)),
                             hello.rank, hello.pid);
  auto [found, added] = processIndex_.emplace(key, static_cast<int>(processes_.size()));
  if (added) {
    // Processes are never forgotten (a dead one is evidence): bound them too.
    if (processes_.size() >= 4 * options_.maxAgents) {
      processIndex_.erase(found);
      return -1;
    }
    Process process;
    // The record budget is shared by the job's ranks; the world size is known from HELLO.
    process.window = process.fullWindow = windowFor(options_.maxRecords, hello.world);
    process.toWall = hello.anchorRealtimeNs - hello.anchorMonotonicNs;
    trace::TraceFile file;
    trace::RingHeader& header = file.header;
    header.pid = hello.pid;
    header.rank = hello.rank;
    header.world = hello.world;
    header.localRank = hello.localRank;
    header.anchorMonotonicNs = hello.anchorMonotonicNs;
    header.anchorRealtimeNs = hello.anchorRealtimeNs;
    std::memcpy(header.host, hello.host, sizeof header.host);
    std::memcpy(header.jobId, hello.jobId, sizeof header.jobId);
    header.host[sizeof header.host - 1] = header.jobId[sizeof header.jobId - 1] = '\0';
    file.usable = true;
    file.path = std::string(hello.tracePath, strnlen(hello.tracePath, sizeof hello.tracePath));
    processes_.push_back(process);
    addFile(std::move(file), hello.world);
  }
  Process& process = processes_[static_cast<size_t>(found->second)];
  if (process.connected) return -1;  // one connection per process
  // A process that connects again may never have read the aborts asked on its lost connection:
  // its COMMS, next, asks them again (an agent whose communicator is aborted already says so).
  if (!added) {
    auto index = static_cast<size_t>(found->second);
    for (auto asked = abortsAsked_.lower_bound({index, 0});
         asked != abortsAsked_.end() && asked->first == index;) {
      asked = abortsAsked_.erase(asked);
    }
  }
  process.connected = true;
  process.connection = static_cast<int64_t>(connection);
  counters_.agents++;
  counters_.connected++;
  wanted_ = true;
  return found->second;
}

// Keeps the newest copy of each ring index, the newest `window` indices of the process.
void Triage::store(size_t index, const trace::CallRecord& record) {
  Process& process = processes_[index];
  // A failed call: NCCL's message for it is in the header of its process's trace file, when
  // that file is on this host (a relayed rank on another host keeps it to the offline reading).
  if (record.state == trace::RecordState::kFailed && record.result != 0 &&
      (files_[index].lastNcclError.empty() ||
       files_[index].lastNcclErrorIndex != record.ringIndex)) {
    readLastNcclError(files_[index]);
  }
  trace::RecordWindow& records = files_[index].records;
  size_t before = records.size();
  analysis_.touch(record.commHash);  // the next pass redoes this communicator
  int64_t wall = analysis::latestTime(record);
  wall = wall == 0 ? 0 : wall + process.toWall;
  // Where the record goes in the window (ring-index order): at its end, in place of its older
  // copy, inserted in the middle, or nowhere (older than a full window holds).
  enum class Place { kAppend, kReplace, kInsert, kNone };
  Place place = Place::kAppend;
  auto at = records.end();
  if (!records.empty() && record.ringIndex <= records.back().ringIndex) {
    at = std::lower_bound(records.begin(), records.end(), record.ringIndex,
                          [](const trace::CallRecord& kept, uint64_t ringIndex) {
                            return kept.ringIndex < ringIndex;
                          });
    place = at != records.end() && at->ringIndex == record.ringIndex   ? Place::kReplace
            : at != records.begin() || records.size() < process.window ? Place::kInsert
                                                                       : Place::kNone;
  }
  // A record seen for the first time: past every ring index received, or one the window takes
  // in its middle (a relay that folds sends a call it held after later calls of other
  // communicators). Anything else is a newer copy (a state change, a resend after a reconnect).
  bool fresh = record.ringIndex >= process.firstNewIndex || place == Place::kInsert;
  if (fresh) {
    ++process.callsStored;
    if (triage_.observe(record, wall)) {
      auto [held, added] = heldDivergences_.try_emplace(record.commHash, record.ncclSeqNumber);
      if (!added) held->second = std::min(held->second, record.ncclSeqNumber);
      if (triage_.lastCompletedOrdinal()) {
        wanted_ = true;
        divergent_.insert(record.commHash);
        divergingSince_.erase(record.commHash);
      } else {
        // No full pass asked for yet: one now would run while the members still come (and read
        // nothing meanwhile), find them absent, and leave its verdict to settle. The
        // divergence's own pass asks for the full one once its members are in (maybeAnalyze).
        int64_t now = steadyNs();
        auto [at, added] = divergingSince_.try_emplace(record.commHash, Diverging{now, now});
        at->second.lastJoinNs = now;
      }
    } else if (triage_.lastJoinedDivergence()) {
      // Another member reached the diverged ordinal: its classes are still filling.
      auto at = divergingSince_.find(record.commHash);
      if (at != divergingSince_.end()) at->second.lastJoinNs = steadyNs();
    }
    process.firstNewIndex = std::max(process.firstNewIndex, record.ringIndex + 1);
  } else {
    triage_.observeUpdate(wall);  // a state change, or a resend after a reconnect
  }
  // A failed call is an error verdict to be said (urgent pacing), not plain activity.
  if (analysis::isFailedCall(record)) wanted_ = true;
  // Exactly the window and its trim slack: growth by doubling would overshoot the budget.
  if (records.capacity() == 0) records.reserve(process.window + trimSlack(process.window) + 1);
  // The analysis's per-communicator progress follows the window (analysis/comm_progress.h): an
  // append at once (one add), a trim as records dropped (before they are erased: it reads them),
  // and a record inserted in the middle by a rebuild once the window is trimmed (a rebuild
  // before the trim would be wasted work).
  const bool appended = place == Place::kAppend, reshaped = place == Place::kInsert;
  if (appended) {
    records.push_back(record);
    analysis_.appended(index, files_[index]);
  } else if (place == Place::kReplace) {
    trace::CallRecord before = *at;
    *at = record;
    analysis_.replaced(index, files_[index], before, record);
  } else if (reshaped) {
    records.insert(at, record);
  }
  // Trim in steps of the slack (a quarter window): the progress trims once for that many records.
  const size_t slack = trimSlack(process.window), reserved = process.window + slack + 1;
  if (records.size() > std::max(process.trimAt, process.window + slack)) {
    size_t drop = records.size() - process.window;
    // A call a verdict still needs stays, with what came after it, up to the cap.
    size_t kept = droppable(records, drop, process.window);
    bool held = kept < drop;
    const size_t quarter = std::max<size_t>(slack / 4, 1);
    if (held && records.size() > heldWindowCap(process.window)) {
      counters_.windowHoldsBroken++;
      held = false;
    } else if (held && !roomToHold(process, records, quarter)) {
      counters_.windowHoldsBroken++;
      counters_.windowHoldsOverBudget++;
      held = false;
    } else if (held) {
      counters_.windowHolds++;
      drop = kept;
    }
    process.trimAt = records.size() - drop + (held ? quarter : slack);
    // What leaves the window changes its communicators' alignment too.
    uint64_t lastHash = record.commHash;
    for (auto it = records.begin(); it != records.begin() + static_cast<std::ptrdiff_t>(drop);
         ++it) {
      if (it->commHash != lastHash) analysis_.touch(lastHash = it->commHash);
    }
    if (!reshaped && drop > 0) {
      analysis_.trimming(index, files_[index], drop);
      counters_.progressTrims = analysis_.stats().progressTrims;
      counters_.progressTrimRebuilds = analysis_.stats().progressTrimRebuilds;
    }
    records.dropFront(drop);  // a ring's front: nothing moves
    // A window that grew while held goes back to its reserve once trimmed to its size.
    if (records.capacity() > reserved && records.size() <= process.window) {
      records.setCapacity(reserved);
      heldCapacity_ -= process.heldCapacity;
      process.heldCapacity = 0;
    }
  }
  if (reshaped) analysis_.reshaped(index, files_[index]);
  // Only this thread writes the counter: a plain load and store, not a locked add per record
  // (one was a fifth of this function's samples at 2048 ranks). Unsigned: wraps right when the
  // window shrank.
  counters_.recordsHeld.store(
      counters_.recordsHeld.load(std::memory_order_relaxed) + (records.size() - before),
      std::memory_order_relaxed);
}

std::string verdictKey(const analysis::JobReport& job, const analysis::Verdict& verdict) {
  std::string key = job.jobId + "/" + std::to_string(job.attempt) + "/" +
                    analysis::kindName(verdict.kind) + "/" + analysis::hashText(verdict.comm.hash) +
                    "/" + std::to_string(verdict.seq);
  if (verdict.kind == analysis::VerdictKind::kDeadlock) {
    key += "/" + analysis::formatRanks(verdict.culprits);
  }
  return key;
}

void Triage::dropFolded(size_t index, const std::vector<wire::FoldedNote>& notes) {
  trace::TraceFile& file = files_[index];
  auto folded = [&](const trace::CallRecord& record) {
    if (!trace::isCollective(record.op)) return false;
    return std::any_of(notes.begin(), notes.end(), [&](const wire::FoldedNote& note) {
      return note.commHash == record.commHash && record.ncclSeqNumber <= note.lastOrdinal;
    });
  };
  if (std::none_of(file.records.begin(), file.records.end(), folded)) return;
  std::vector<trace::CallRecord> kept;
  for (const trace::CallRecord& record : file.records) {
    if (folded(record)) {
      analysis_.touch(record.commHash);
    } else {
      kept.push_back(record);
    }
  }
  size_t capacity = file.records.capacity();
  counters_.recordsHeld -= file.records.size() - kept.size();
  file.records = trace::RecordWindow(kept);
  file.records.setCapacity(capacity);
  analysis_.reshaped(index, file);
}

bool Triage::roomToHold(Process& process, trace::RecordWindow& records, size_t appends) {
  size_t needed = records.size() + appends + 1;
  if (needed <= records.capacity()) return true;
  // Half again each time, up to what the cap allows: few copies, and a window held only a little
  // past its reserve takes only a little more.
  size_t grown = std::max(needed, records.capacity() + records.capacity() / 2);
  grown = std::max(needed, std::min(grown, heldWindowCap(process.window) + appends + 1));
  size_t growth = grown - records.capacity();
  if (heldCapacity_ + growth > heldRecordBudget(options_.maxRecords)) return false;
  records.reserve(grown);
  process.heldCapacity += growth;
  heldCapacity_ += growth;
  if (heldCapacity_ > counters_.heldRecordsPeak.load(std::memory_order_relaxed)) {
    counters_.heldRecordsPeak.store(heldCapacity_, std::memory_order_relaxed);
  }
  return true;
}

size_t Triage::droppable(const trace::RecordWindow& records, size_t drop, size_t window) {
  const int largestHeld =
      static_cast<int>(std::min<size_t>(largestHeldComm(options_.maxRecords, window), INT_MAX));
  // A window's records alternate between a few communicators (a tensor-parallel one and the
  // world, say), and the answer does not change within a trim: the last two are kept.
  analysis::RecentTwo<uint64_t> known;
  auto keepFrom = [&](uint64_t commHash) {
    if (const uint64_t* from = known.find(commHash)) return *from;
    uint64_t from = triage_.oldestOpenOrdinal(commHash, largestHeld);
    if (!heldDivergences_.empty()) {
      auto held = heldDivergences_.find(commHash);
      if (held != heldDivergences_.end()) from = std::min(from, held->second);
    }
    known.remember(commHash, from);
    return from;
  };
  for (size_t i = 0; i < drop; ++i) {
    const trace::CallRecord& record = records[i];
    if (trace::isCollective(record.op) && record.ncclSeqNumber >= keepFrom(record.commHash)) {
      return i;
    }
  }
  return drop;
}

// NCCL's message for the newest failed call of `file`'s process, from its trace's header: one
// read of the header, on a failure only.
void Triage::readLastNcclError(trace::TraceFile& file) {
  if (file.path.empty()) return;
  int fd = open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  std::vector<std::byte> header(trace::kRingHeaderBytes);
  ssize_t got = pread(fd, header.data(), header.size(), 0);
  close(fd);
  if (got != static_cast<ssize_t>(header.size())) return;
  const auto* ring = reinterpret_cast<const trace::RingHeader*>(header.data());
  if (std::memcmp(ring->magic, trace::kRingMagic, sizeof trace::kRingMagic) != 0 ||
      ring->pid != file.header.pid) {
    return;  // another process's file by now, or not a trace
  }
  trace::lastNcclErrorOf(header, &file.lastNcclError, &file.lastNcclErrorIndex);
}

// A process that died on this host took its last unsent calls with it, but its ring file
// survives: read them from there, so that the verdict shows where it really stopped.
void Triage::reloadFromFile(size_t index) {
  trace::TraceFile& known = files_[index];
  trace::TraceFile file = trace::readTraceFile(known.path);
  if (!file.usable || file.header.pid != known.header.pid) return;
  if (!file.comms.empty()) {
    known.comms = file.comms;
    for (const trace::CommInfo& comm : file.comms) triage_.addComm(comm);
  }
  for (const trace::CallRecord& record : file.records) store(index, record);
  known.dumps = std::move(file.dumps);
  // How it ended, as its handlers wrote it (nothing: SIGKILL or _exit).
  known.header.fatalSignal = file.header.fatalSignal;
  known.header.fatalThread = file.header.fatalThread;
  known.endRecorded = true;
  known.lastNcclError = file.lastNcclError;
  known.lastNcclErrorIndex = file.lastNcclErrorIndex;
}

bool Triage::frame(int processIndex, wire::Frame& frame) {
  size_t index = static_cast<size_t>(processIndex);
  Process& process = processes_[index];
  trace::TraceFile& file = files_[index];
  switch (frame.type) {
    case wire::FrameType::kComms:
      file.comms.clear();
      for (const trace::CommInfo& comm : frame.comms) {
        if (comm.commHash == 0 || comm.nranks <= 0) continue;
        file.comms.push_back(comm);
        triage_.addComm(comm);
        // A job being aborted for a dead rank: a communicator reported now is aborted too; so
        // is one a verdict had aborted, reported by a rank that was not connected then.
        bool aborted = abortingProcesses_.count(index) != 0;
        if (!aborted) {
          auto job = abortedComms_.find(trace::jobIdOf(file.header));
          aborted = job != abortedComms_.end() && job->second.count(comm.commHash) != 0;
        }
        if (aborted && abortsAsked_.insert({index, comm.commHash}).second) {
          pendingAborts_.push_back({index, comm.commHash, steadyNs()});
        }
      }
      wanted_ = true;
      break;
    case wire::FrameType::kRecords:
      for (const trace::CallRecord& record : frame.records) store(index, record);
      counters_.records += frame.records.size();
      activity_ |= !frame.records.empty();
      break;
    case wire::FrameType::kFolded: {
      // Calls its relay folded: matched by every member on its host, so nothing to analyse, but
      // the rank was active then (the quiet and silent-rank checks read activity).
      int64_t latest = 0;
      bool dropsSent = false;
      for (const wire::FoldedNote& note : frame.folded) {
        counters_.foldedCalls += note.calls;
        process.callsFolded += note.calls;
        latest = std::max(latest, note.latestNs);
        dropsSent |= (note.flags & wire::kFoldedDropsSent) != 0;
        triage_.settled(note.commHash, note.lastOrdinal);
      }
      process.window = foldedWindow(process.fullWindow, process.callsStored, process.callsFolded);
      if (latest > file.foldedLatestNs) {
        file.foldedLatestNs = latest;
        triage_.observeUpdate(latest + process.toWall);
      }
      if (dropsSent || process.readFromFile) dropFolded(index, frame.folded);
      break;
    }
    case wire::FrameType::kSites: {
      std::string why;
      trace::parsePythonSites(frame.reason, &file.pythonSites, &why);  // keeps the good lines
      // A verdict waiting for a Python line of its calls (sitesPending) is drawn again.
      for (const auto& [key, candidate] : candidates_) analysis_.touch(candidate.commHash);
      wanted_ |= !candidates_.empty();
      break;
    }
    case wire::FrameType::kWaits:
      // The whole current set: where this rank's pending calls wait inside NCCL.
      file.waits = std::move(frame.waits);
      wanted_ = true;
      break;
    case wire::FrameType::kBye:
      process.saidBye = true;
      file.header.cleanShutdown = 1;
      if (frame.exitStatus) {
        file.header.exitStatus = *frame.exitStatus;
        file.header.exitStatusKnown = 1;
      }
      wanted_ = true;
      break;
    default:
      return false;  // HELLO twice, or a collector's frame from an agent
  }
  return true;
}

void Triage::closed(int index) {
  Process& process = processes_[static_cast<size_t>(index)];
  process.connected = false;
  process.connection = -1;
  counters_.connected--;
  if (!process.saidBye) {
    process.goneNs = steadyNs();
    const trace::TraceFile& file = files_[static_cast<size_t>(index)];
    process.goneForSure = analysis::onThisHost(file) && !analysis::runningHere(file);
    if (process.goneForSure) reloadFromFile(static_cast<size_t>(index));
  }
  wanted_ = true;  // a rank gone without BYE may be a dead rank
}

void Triage::housekeeping(int64_t now) {
  if (!silentRanks_.empty()) checkSilentRanks(now);
  if (!pendingAborts_.empty()) sendDueAborts(now);
  if (firstHousekeepingNs_ == 0) firstHousekeepingNs_ = now;
  if (now >= nextAdoptNs_) {
    nextAdoptNs_ = now + 500 * kMs;
    adoptTraceFiles(now);
    adoptOrphanedJob(now);
  }
}

// A job whose ranks were killed gets no last pass: killed ranks never sent their last calls,
// and a verdict drawn from that could blame the wrong rank (`ncclwatch inspect` reads their
// complete files instead).
void Triage::finish() {
  if (processes_.empty()) return;
  adoptTraceFiles(steadyNs());
  if (counters_.agents.load() == 0) {
    // A job known from its files alone (adoptOrphanedJob): a pass over some of its ranks would
    // take the others for absent. Those of other hosts are in their own folders.
    for (const auto& [jobId, job] : jobRanks_) {
      if (static_cast<int>(job.ranks.size()) < job.world) {
        out_ << "[ncclwatch] collector: the trace files here hold " << job.ranks.size() << " of "
             << job.world << " ranks of job " << jobId
             << ": no verdict from them (`ncclwatch inspect` over every host's folder has one)\n"
             << std::flush;
        return;
      }
    }
  }
  for (const Process& process : processes_) {
    if (!process.saidBye && !(process.adopted && !process.adoptedAlive && !process.connected)) {
      return;
    }
  }
  for (const trace::TraceFile& file : files_) {
    if (file.header.cleanShutdown == 0) return;
  }
  analyze(steadyNs(), true);
}

void Triage::appendVerdictLine(const std::string& json) {
  if (options_.directory.empty()) return;
  std::ofstream jsonl(options_.directory + "/verdicts.jsonl", std::ios::app);
  jsonl << json << "\n";
}

void Triage::report(analysis::Verdict verdict, const analysis::JobReport& job) {
  // Under --abort, what the job does once its communicators are aborted (a rank that exits, a
  // split that fails, a rank left waiting in another communicator) is what the abort set off:
  // said as a consequence of the verdict that asked for it, not headed as a finding of its own.
  // A verdict said before the aborts went out (another one of the same pass) is not one.
  bool afterAbort = false;
  if (auto aborted = abortedFor_.find(job.jobId);
      aborted != abortedFor_.end() && steadyNs() >= aborted->second.dueNs) {
    afterAbort = true;
    verdict.primary = false;
    verdict.explanation = "after ncclwatch aborted the job's communicators for the " +
                          aborted->second.verdict +
                          ", most likely what the abort set off: " + verdict.explanation;
    counters_.verdictsAfterAbort++;
  }
  std::ostringstream text;
  analysis::printVerdictText(verdict, text, analysis::TextStyle{options_.colour});
  if (verdict.divergenceNs > 0 && verdict.detectionNs >= verdict.divergenceNs) {
    text << "  (reported " << (verdict.detectionNs - verdict.divergenceNs) / kMs
         << " ms after the divergent call)\n";
  }
  appendVerdictLine(analysis::verdictJson(verdict, job.jobId, job.attempt));
  out_ << text.str() << std::flush;
  // Every involved rank dumps, so that its trace file shows where each one was. Not after the
  // abort: the ranks are being torn down, and a dump of their teardown (an interpreter
  // finalizing) would be the newest one, which the offline stacks read, instead of the one the
  // verdict that asked for the abort took.
  // Its communicators are aborted as any verdict's (a dead rank's partners may wait in others).
  if (afterAbort) {
    if (options_.abortOnVerdict && verdict.kind != analysis::VerdictKind::kStraggler) {
      scheduleAborts(verdict, job.jobId);
    }
    return;
  }
  std::set<int> involved(verdict.culprits.begin(), verdict.culprits.end());
  for (const analysis::RankClass& rankClass : verdict.classes) {
    involved.insert(rankClass.ranks.begin(), rankClass.ranks.end());
  }
  std::string reason = std::string("collector: ") + analysis::kindName(verdict.kind) + " on comm " +
                       analysis::hashText(verdict.comm.hash) + " at call #" +
                       std::to_string(verdict.seq) + ": " + verdict.explanation;
  for (size_t i = 0; i < processes_.size(); ++i) {
    const Process& process = processes_[i];
    if (!process.connected || process.connection < 0) continue;
    if (trace::jobIdOf(files_[i].header) != job.jobId) continue;
    if (involved.count(files_[i].header.rank)) {
      std::vector<std::byte> frame;
      wire::encodeDump(reason, frame);
      connections_->send(static_cast<size_t>(process.connection), frame);
    }
  }
  // A rank alive but silent while the others wait (a dead_rank on timing alone) may be a rank
  // that saves a checkpoint or loads data for longer than the quiet time: its verdict is
  // withdrawn if it issues calls again (Triage::checkSilentRanks), and under --abort the job is
  // aborted for it only if it stays silent for silentRankAbortMs more.
  const bool silentAlive = verdict.kind == analysis::VerdictKind::kDeadRank &&
                           verdict.culpritAlive && !culpritsEnded(verdict, job);
  if (silentAlive) {
    SilentRank held{verdict, job.jobId, job.attempt, {}, steadyNs(), 0};
    for (size_t i = 0; i < processes_.size(); ++i) {
      const trace::RingHeader& header = files_[i].header;
      if (trace::jobIdOf(header) != job.jobId || processes_[i].ended()) continue;
      for (int culprit : verdict.culprits) {
        if (header.rank == culprit) held.culprits.push_back({i, processes_[i].firstNewIndex});
      }
    }
    // Without a culprit process to watch (none known here), under --abort the job is aborted
    // at once, as for any verdict.
    if (!held.culprits.empty()) {
      // A rank stopped (state T) saves no checkpoint: under --abort its job is aborted at once,
      // as for any verdict (exp25's sigstop waited for it; the abort frees the others).
      const bool holdAbort = options_.abortOnVerdict && !verdict.culpritStopped;
      if (holdAbort) {
        held.dueNs = held.saidNs + options_.silentRankAbortMs * kMs;
        out_ << "[ncclwatch] --abort: rank" << (verdict.culprits.size() > 1 ? "s " : " ")
             << analysis::formatRanks(verdict.culprits)
             << " alive; the job is aborted if no NCCL call comes from "
             << (verdict.culprits.size() > 1 ? "them" : "it") << " within "
             << options_.silentRankAbortMs / 1000.0
             << " s (a checkpoint or data loading on one rank looks the same for a while)\n"
             << std::flush;
      }
      silentRanks_.push_back(std::move(held));
      if (holdAbort) return;
    }
  }
  if (!options_.abortOnVerdict || verdict.kind == analysis::VerdictKind::kStraggler) return;
  scheduleAborts(verdict, job.jobId);
}

// The learned quiet time's cap: PyTorch's own collective timeout is ten minutes.
constexpr int64_t kLongestLearnedQuietNs = 600'000 * kMs;

int64_t Triage::quietNs() const {
  return std::max(options_.quietMs * kMs, learnedQuietNs_);
}

void Triage::checkSilentRanks(int64_t now) {
  std::vector<SilentRank> waiting;
  for (SilentRank& held : silentRanks_) {
    bool spoke = false, gone = true;
    for (const auto& [process, firstNewIndex] : held.culprits) {
      // New records from a live agent, or its last ones before a clean end (BYE). Not those
      // read back from the ring of a process that died (a stopped rank killed by its launcher:
      // exp25's sigstop was "withdrawn ... issued NCCL calls again" when its file was reread).
      const Process& culprit = processes_[process];
      spoke |= culprit.firstNewIndex != firstNewIndex && (!culprit.ended() || culprit.saidBye);
      gone &= culprit.ended();
    }
    const analysis::Verdict& verdict = held.verdict;
    if (spoke) {
      // Said at the quiet time, it was a long host step: the verdict is withdrawn, so that a
      // healthy job's checkpoint does not stand as a finding (exp25's ckpt_pause: one rank
      // 25 s in a checkpoint, "DEAD_RANK" the only verdict of a job that ended well).
      std::ostringstream why;
      why << analysis::namedRanks(verdict.culprits) << " issued NCCL calls again " << std::fixed
          << std::setprecision(1) << static_cast<double>(now - held.saidNs) / 1e9
          << " s after this verdict: a long host step (a checkpoint, data loading), not a hang";
      // The silence it came back from: the quiet time before the verdict and the time since.
      const int64_t before = quietNs();
      const int64_t silence = before + (now - held.saidNs);
      learnedQuietNs_ = std::min(kLongestLearnedQuietNs, std::max(learnedQuietNs_, 2 * silence));
      out_ << "[ncclwatch] " << analysis::upperCase(analysis::kindName(verdict.kind)) << " on comm "
           << analysis::hashText(verdict.comm.hash).substr(0, 4) << "\u2026 at call #"
           << verdict.seq << " withdrawn: " << why.str()
           << (held.dueNs != 0 ? "; no abort for it" : "");
      if (quietNs() > before) {
        out_ << "; verdicts on timing alone now wait " << std::fixed << std::setprecision(1)
             << static_cast<double>(quietNs()) / 1e9 << " s of silence (twice this one)";
      }
      out_ << "\n" << std::flush;
      appendVerdictLine(analysis::withdrawalJson(verdict, held.jobId, held.attempt, why.str()));
      counters_.verdictsWithdrawn++;
    } else if (held.dueNs != 0 && (gone || held.dueNs <= now)) {
      scheduleAborts(verdict, held.jobId);
    } else if (!gone) {
      waiting.push_back(std::move(held));
    }
  }
  silentRanks_ = std::move(waiting);
}

// The communicators the verdict involves are aborted on every rank that has them, so that
// nobody stays blocked in them: the verdict's own, and for a dead rank every communicator of the
// job (the dead rank's among them: its partners wait in those).
void Triage::scheduleAborts(const analysis::Verdict& verdict, const std::string& jobId) {
  std::set<uint64_t> toAbort;
  toAbort.insert(verdict.comm.hash);
  if (verdict.kind == analysis::VerdictKind::kDeadRank) {
    // A rank that died soon after creating communicators may never have sent the collector
    // its newer comm table, nor its partners theirs: the job cannot go on without the dead
    // rank, so every communicator of the job is aborted, those its processes report later
    // included (frame(), kComms). Else the dead rank's partners in a communicator the
    // collector never heard of wait in it for ever.
    for (size_t i = 0; i < files_.size(); ++i) {
      if (trace::jobIdOf(files_[i].header) != jobId) continue;
      // The processes of the job now, not of a later attempt under the same job id (an
      // elastic restart): those start over.
      abortingProcesses_.insert(i);
      for (const trace::CommInfo& comm : files_[i].comms) toAbort.insert(comm.commHash);
    }
  }
  // The aborts go out a little after the dump requests: a rank that aborts fails and exits at
  // once, its launcher stops the job, and ranks still taking their dump would lose it.
  int64_t abortAt = steadyNs() + kAbortAfterDumpNs;
  std::set<uint64_t>& jobComms = abortedComms_[jobId];
  jobComms.insert(toAbort.begin(), toAbort.end());
  abortedFor_.try_emplace(
      jobId, AbortedJob{analysis::upperCase(analysis::kindName(verdict.kind)) + " on comm " +
                            analysis::hashText(verdict.comm.hash) + " at call #" +
                            std::to_string(verdict.seq),
                        abortAt});
  for (size_t i = 0; i < processes_.size(); ++i) {
    const Process& process = processes_[i];
    if (!process.connected || process.connection < 0) continue;
    if (trace::jobIdOf(files_[i].header) != jobId) continue;
    for (const trace::CommInfo& comm : files_[i].comms) {
      if (toAbort.count(comm.commHash) && abortsAsked_.insert({i, comm.commHash}).second) {
        pendingAborts_.push_back({i, comm.commHash, abortAt});
      }
    }
  }
}

void Triage::sendDueAborts(int64_t now) {
  // A process's due aborts go out in one write, so that its agent reads them together and can
  // abort the communicator its rank is blocked in first (an abort may wait for the device).
  std::vector<PendingAbort> later;
  std::map<size_t, std::vector<std::byte>> frames;  // connection -> its abort frames
  for (const PendingAbort& abort : pendingAborts_) {
    if (abort.dueNs > now) {
      later.push_back(abort);
      continue;
    }
    const Process& process = processes_[abort.process];
    if (!process.connected || process.connection < 0) continue;
    std::vector<std::byte> frame;
    wire::encodeAbort(abort.commHash, frame);
    std::vector<std::byte>& batch = frames[static_cast<size_t>(process.connection)];
    batch.insert(batch.end(), frame.begin(), frame.end());
    counters_.abortsSent++;
  }
  for (const auto& [connection, batch] : frames) connections_->send(connection, batch);
  pendingAborts_ = std::move(later);
}

// Whether every culprit of the verdict has ended (BYE, or a process known to be gone): nothing
// it could still send would change the verdict, so it need not wait to settle (a launcher that
// stops the other ranks after a crash would otherwise end the job first).
bool Triage::culpritsEnded(const analysis::Verdict& verdict, const analysis::JobReport& job) const {
  for (int culprit : verdict.culprits) {
    bool ended = false;
    for (size_t i = 0; i < processes_.size(); ++i) {
      if (files_[i].header.rank == culprit && trace::jobIdOf(files_[i].header) == job.jobId) {
        ended |= processes_[i].ended();
      }
    }
    if (!ended) return false;
  }
  return !verdict.culprits.empty();
}

void Triage::maybeAnalyze(int64_t now) {
  // A divergence whose last member has reported goes at once, not at the next check: waiting
  // for the check's beat cost up to analyzeEveryMs of the verdict's latency.
  bool divergenceReady = !divergent_.empty() && now - lastAnalysisNs_ >= lastFirstCostNs_;
  if (now < nextCheckNs_ && !divergenceReady) return;
  nextCheckNs_ = now + options_.analyzeEveryMs * kMs;
  // Time-based verdicts (missing, stuck, deadlock, dead rank) need passes while nothing moves.
  bool quiet = counters_.connected.load() > 0 && triage_.lastActivityNs() > 0 &&
               realtimeNs() - triage_.lastActivityNs() >= quietNs();
  int64_t since = now - lastAnalysisNs_;
  // Each pass's cost paces the next: a divergence, a failed call, a settling verdict or a quiet
  // job may use a quarter of a core; plain activity a twentieth. What only an activity pass
  // finds (a wrong split colour the triage's fingerprints did not flag, unpaired sends and
  // receives before the job stalls, stragglers) is said within about twenty passes' cost (4 s at
  // 4096 ranks, 50 ms for a small job): a healthy job of thousands of ranks, whose passes cost
  // 0.1-0.3 s, must not spend a tenth of a core on them (a tenth before: a third of the
  // collector's time at 4096 ranks). Jobs whose passes cost under 2.5 ms still get one every
  // analyzeEveryMs.
  bool urgent = wanted_ || !candidates_.empty();
  const int64_t longestGap = std::max<int64_t>(2000 * kMs, 20 * lastCostNs_);
  bool due = (urgent && since >= 3 * lastCostNs_) ||
             (quiet && since >= std::max<int64_t>(200 * kMs, 3 * lastCostNs_)) ||
             (activity_ && since >= 19 * lastCostNs_) || since >= longestGap;
  // A divergence the triage saw is looked at on its own communicator at once, by a pass that
  // redoes only that one (when the rest still holds: analysis/incremental.h), paced by its own
  // cost: at most half a core.
  // A divergence still missing members waits for them while they keep coming (settleMs after
  // the last one, kDivergenceWaitSettles settles at most): a pass before the last member's record
  // finds the mismatch incomplete, redoes every communicator to say where the absent ones are,
  // and its verdict must then settle (at 32,768 ranks the members' records of one call arrive
  // over a few hundred ms, and that cost 1.6 s).
  for (auto it = divergingSince_.begin(); it != divergingSince_.end();) {
    const Diverging& diverging = it->second;
    bool stillComing = now - diverging.lastJoinNs < options_.settleMs * kMs &&
                       now - diverging.sinceNs < kDivergenceWaitSettles * options_.settleMs * kMs;
    if (stillComing) {
      ++it;
      continue;
    }
    divergent_.insert(it->first);
    wanted_ = true;  // a full pass follows the divergence's own
    it = divergingSince_.erase(it);
  }
  bool divergence = !divergent_.empty() && since >= lastFirstCostNs_;
  if ((!due && !divergence) || processes_.empty()) return;
  // While a divergence's members still come, no other pass: it would stop the reading for its
  // duration, and the divergence's own pass, which waits for the last member, with it (at 32,768
  // ranks on the 16-core host a mismatch took 1,010 ms instead of 346 that way). Each wait is
  // bounded (kDivergenceWaitSettles), and the passes due meanwhile run after it; a job that
  // diverges again and again still gets the pass every 2 s (or 20 passes' cost) at least.
  if (!divergence && !divergingSince_.empty() && since < longestGap) return;
  // A divergence goes first, on its own communicator, even when a full pass is also due: the
  // full pass follows on a later tick (wanted_ stays set).
  // A pass's cost is the larger of its wall time and its CPU time: with the work split over
  // threads the wall clock understates what the pass takes from the machine, and pacing by it
  // alone made a 4096-rank collector run twice the passes on 16 cores (0.47 cores against 0.43
  // with one thread, docs/scale.md).
  const int64_t cpuBefore = processCpuNs();
  auto costOfPass = [&](int64_t end) {
    int64_t wall = end - now, cpu = processCpuNs() - cpuBefore;
    counters_.analysisNs += static_cast<uint64_t>(wall);
    counters_.analysisCpuNs += static_cast<uint64_t>(cpu);
    return std::max(wall, cpu);
  };
  if (divergence) {
    std::set<uint64_t> first = std::move(divergent_);
    divergent_.clear();
    analyze(now, false, &first);
    int64_t end = steadyNs();
    lastFirstCostNs_ = costOfPass(end);
    counters_.divergencePasses++;
    counters_.divergencePassNs += static_cast<uint64_t>(end - now);
    lastAnalysisNs_ = end;
    return;
  }
  wanted_ = activity_ = false;
  divergent_.clear();
  analyze(now);
  int64_t end = steadyNs();
  lastCostNs_ = costOfPass(end);
  lastAnalysisNs_ = end;
  // Nothing was read while the pass ran: members of a waiting divergence get their settleMs of
  // reading from here.
  for (auto& [hash, diverging] : divergingSince_) {
    diverging.lastJoinNs = std::max(diverging.lastJoinNs, end);
  }
}

void Triage::analyze(int64_t now, bool final, const std::set<uint64_t>* first) {
  analysis::Options analysisOptions;
  analysisOptions.nowNs = realtimeNs();
  analysisOptions.quietNs = quietNs();
  analysisOptions.initPatienceNs = initPatienceNs();
  analysisOptions.probeProcesses = false;
  analysisOptions.threads =
      options_.analysisThreads > 0 ? options_.analysisThreads : analysis::defaultAnalysisThreads();
  bool graceRunning = false;
  for (size_t i = 0; i < processes_.size(); ++i) {
    const Process& process = processes_[i];
    bool inGrace = !process.connected && !process.saidBye && !process.goneForSure &&
                   !process.adopted && now - process.goneNs < kReconnectGraceNs;
    graceRunning |= inGrace;
    if ((process.connected && !process.saidBye) || inGrace ||
        (process.adopted && !process.connected && process.adoptedAlive)) {
      analysisOptions.aliveRanks.push_back(files_[i].header.rank);
    }
  }
  if (graceRunning) wanted_ = true;  // look again once the grace is over
  counters_.analyses++;
  // Only the communicators touched since the last pass are redone when the rest still holds
  // (analysis/incremental.h); the verdicts are those of analysis::analyze on the same files.
  analysis::Report result = first != nullptr
                                ? analysis_.analyzeFirst(files_, analysisOptions, *first)
                                : analysis_.analyze(files_, analysisOptions);
  counters_.partialAnalyses = analysis_.stats().partialPasses;
  counters_.hangAnalyses = analysis_.stats().hangPasses;
  for (const auto& [why, count] : analysis_.stats().fullBecause) {
    for (size_t i = 0; i < std::size(Counters::kFullReasons); ++i) {
      if (why == Counters::kFullReasons[i]) counters_.fullBecause[i] = count;
    }
  }
  // A verdict is said once every member of its communicator has issued the call, or once it
  // has held, with the same culprits, for settleMs: ranks report a little apart, and a verdict
  // drawn before the last of them has spoken can blame the wrong one.
  std::map<std::string, Candidate> seen;
  for (const analysis::JobReport& job : result.jobs) {
    for (const analysis::Verdict& verdict : job.verdicts) {
      if (!verdict.primary) continue;
      std::string key = verdictKey(job, verdict);
      if (reported_.count(key)) continue;
      std::string culprits = analysis::formatRanks(verdict.culprits);
      auto previous = candidates_.find(key);
      int64_t since = previous != candidates_.end() && previous->second.culprits == culprits
                          ? previous->second.sinceNs
                          : now;
      seen[key] = Candidate{culprits, since, verdict.comm.hash};
      bool settled =
          final || now - since >= options_.settleMs * kMs ||
          (verdict.kind == analysis::VerdictKind::kMismatch && everyMemberSpoke(verdict, job)) ||
          ((verdict.kind == analysis::VerdictKind::kDeadRank ||
            verdict.kind == analysis::VerdictKind::kError) &&
           culpritsEnded(verdict, job));
      // A call whose Python line its agent has not sent yet: a rank's first call from a new line
      // reaches the collector in one exchange and the line's text in the next (a poll later), and
      // a verdict said at once would lack the line a user looks for first. It waits for it a
      // little (kSiteWaitNs), then goes without.
      if (settled && !final && now - since < kSiteWaitNs && sitesPending(verdict)) settled = false;
      if (!settled) continue;
      reported_.insert(key);
      seen.erase(key);
      report(verdict, job);
      // Counted once said: whoever sees the count (a test, the stats line) sees the text.
      counters_.verdicts++;
    }
  }
  candidates_ = std::move(seen);
  // A divergence whose communicator this pass looked at, and that has no verdict waiting to be
  // said (said now, or none found), no longer holds its call in the windows.
  for (auto it = heldDivergences_.begin(); it != heldDivergences_.end();) {
    bool looked = first == nullptr || first->count(it->first) > 0;
    bool waiting = std::any_of(candidates_.begin(), candidates_.end(), [&](const auto& candidate) {
      return candidate.second.commHash == it->first;
    });
    it = looked && !waiting ? heldDivergences_.erase(it) : std::next(it);
  }
}

// Whether a trace file found in the folder belongs to the attempt the collector watches: its
// rank is not known yet, and it started with the known ranks (a restarted job reuses its id and
// folder; the earlier attempt's files are older).
bool Triage::sameAttempt(const trace::RingHeader& header) const {
  int64_t earliest = INT64_MAX;
  for (size_t i = 0; i < files_.size(); ++i) {
    const trace::RingHeader& known = files_[i].header;
    if (std::strncmp(known.jobId, header.jobId, sizeof known.jobId) != 0) continue;
    if (known.rank == header.rank && known.pid != header.pid) return false;
    if (!processes_[i].adopted) earliest = std::min(earliest, known.anchorRealtimeNs);
  }
  return earliest == INT64_MAX || header.anchorRealtimeNs >= earliest - 60'000 * kMs;
}

bool Triage::jobMissesRanks() const {
  for (const auto& [id, job] : jobRanks_) {
    if (static_cast<int>(job.ranks.size()) < job.world) return true;
  }
  return false;
}

void Triage::adoptTraceFiles(int64_t now) {
  if (options_.directory.empty() || processes_.empty()) return;
  // Processes that left without BYE while they still mapped their file (exiting): gone now?
  for (size_t i = 0; i < processes_.size(); ++i) {
    Process& process = processes_[i];
    if (process.connected || process.saidBye || process.goneForSure || process.adopted) continue;
    if (analysis::onThisHost(files_[i]) && !analysis::runningHere(files_[i])) {
      process.goneForSure = true;
      reloadFromFile(i);
      wanted_ = true;
    }
  }
  bool rereadAdopted = false;
  for (const Process& process : processes_) {
    rereadAdopted |= process.adopted && process.adoptedAlive && !process.connected;
  }
  if (!rereadAdopted && !jobMissesRanks()) return;
  // Files known already (by name: <host>-<pid>.ncclwatch), except adopted ones that may still
  // grow; only this host's (a shared folder holds every host's); a few new ones per scan.
  std::set<std::string> known;
  for (size_t i = 0; i < files_.size(); ++i) {
    const Process& process = processes_[i];
    if (process.adopted && process.adoptedAlive && !process.connected) continue;
    known.insert(std::filesystem::path(files_[i].path).filename().string());
  }
  const std::string prefix = thisHostsTracePrefix();
  int reads = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(options_.directory, error)) {
    std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".ncclwatch" || name.rfind(prefix, 0) != 0 ||
        known.count(name) || foreignFiles_.count(name)) {
      continue;
    }
    if (++reads > 64) break;
    std::string path = entry.path().string();
    trace::TraceFile file = trace::readTraceFile(path);
    if (!file.usable) continue;  // not (yet) a trace: look again next time
    if (!jobRanks_.count(trace::jobIdOf(file.header)) || !analysis::onThisHost(file) ||
        !sameAttempt(file.header)) {
      foreignFiles_.insert(name);  // another job's, or an earlier attempt's: never read again
      continue;
    }
    if (!adoptFile(std::move(file), path)) return;
  }
  (void)now;
}

bool Triage::adoptFile(trace::TraceFile file, const std::string& path) {
  auto key =
      std::make_tuple(std::string(trace::jobIdOf(file.header)), file.header.rank, file.header.pid);
  auto found = processIndex_.find(key);
  size_t index = 0;
  if (found == processIndex_.end()) {
    if (processes_.size() >= 4 * options_.maxAgents) return false;
    Process process;
    process.adopted = true;
    process.window = process.fullWindow = windowFor(options_.maxRecords, file.header.world);
    process.toWall = file.header.anchorRealtimeNs - file.header.anchorMonotonicNs;
    index = processes_.size();
    processIndex_.emplace(key, static_cast<int>(index));
    processes_.push_back(process);
    trace::TraceFile known;
    known.header = file.header;
    known.path = path;
    known.usable = true;
    addFile(std::move(known), file.header.world);
  } else {
    index = static_cast<size_t>(found->second);
    if (!processes_[index].adopted || processes_[index].connected) return true;
  }
  Process& process = processes_[index];
  // Read while it ran and found gone after: its exit handler may have written its end between
  // the two, and a clean rank read as crashed was a DEAD_RANK in a clean short job (graph_clean,
  // its sidecar reading the files as the ranks ended, on a loaded machine). Gone, it writes no
  // more: its header is final on a second read.
  if (file.header.cleanShutdown == 0 && !analysis::runningHere(file)) {
    trace::TraceFile final = trace::readTraceFile(path);
    if (final.usable) file = std::move(final);
  }
  bool alive = file.header.cleanShutdown == 0 && analysis::runningHere(file);
  files_[index].header.cleanShutdown = file.header.cleanShutdown;
  files_[index].header.exitStatus = file.header.exitStatus;
  files_[index].header.exitStatusKnown = file.header.exitStatusKnown;
  if (!alive && !process.adoptedAlive && found != processIndex_.end()) return true;  // read before
  process.adoptedAlive = alive;
  if (!file.comms.empty()) {
    files_[index].comms = file.comms;
    for (const trace::CommInfo& comm : file.comms) triage_.addComm(comm);
  }
  for (const trace::CallRecord& record : file.records) store(index, record);
  process.readFromFile |= !file.records.empty();
  files_[index].dumps = std::move(file.dumps);
  wanted_ = true;
  return true;
}

void Triage::adoptOrphanedJob(int64_t now) {
  if (!options_.untilIdle || counters_.agents.load() > 0 || options_.directory.empty() ||
      now - firstHousekeepingNs_ < kOrphanWaitNs) {
    return;
  }
  const std::string prefix = thisHostsTracePrefix();
  // The job's files were written at most a few minutes before its rank 0 started this sidecar;
  // older ones (earlier jobs in the same folder) are not even opened.
  const auto recent = std::filesystem::file_time_type::clock::now() - std::chrono::minutes(10);
  int adopted = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(options_.directory, error)) {
    std::string name = entry.path().filename().string();
    std::error_code timeError;
    if (entry.path().extension() != ".ncclwatch" || name.rfind(prefix, 0) != 0 ||
        foreignFiles_.count(name) || orphanFiles_.count(name) ||
        entry.last_write_time(timeError) < recent || timeError) {
      continue;
    }
    // <host>-<pid>.ncclwatch: a process still running is read once it ended (a later round).
    long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) continue;
    trace::TraceFile file = trace::readTraceFile(entry.path().string());
    if (!file.usable || !analysis::onThisHost(file)) continue;
    bool ours = false;
    for (const trace::CommInfo& comm : file.comms) {
      trace::DerivedSecretText secret;
      trace::deriveSecretFromCommHash(comm.commHash, secret);
      ours |= options_.secret == secret;
    }
    if (!ours) {
      foreignFiles_.insert(name);
      continue;
    }
    if (!adoptFile(std::move(file), entry.path().string())) break;
    orphanFiles_.insert(name);
    ++adopted;
  }
  if (adopted > 0 && counters_.orphansAdopted.load() == 0) {
    out_ << "[ncclwatch] collector: no rank of the job reached it (the job ended before it "
            "listened): reading the job's trace files in "
         << options_.directory << " instead\n"
         << std::flush;
  }
  counters_.orphansAdopted += static_cast<uint64_t>(adopted);
}

}  // namespace ncclwatch::collect
