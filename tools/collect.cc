#include "collect.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/describe.h"
#include "analysis/live_triage.h"
#include "load.h"
#include "trace/ring_reader.h"
#include "trace/wire.h"

namespace ncclwatch::collect {
namespace wire = trace::wire;

namespace {

constexpr size_t kMaxIncoming = 2 * wire::kMaxPayload + sizeof(wire::FrameHeader);
constexpr size_t kMaxOutgoing = 1u << 20;
constexpr int64_t kHelloTimeoutNs = 5'000'000'000;
constexpr int64_t kMs = 1'000'000;
constexpr int64_t kReconnectGraceNs = 1000 * kMs;
// Agents poll every 100 ms by default and a dump takes tens of ms: the aborts wait for them.
constexpr int64_t kAbortAfterDumpNs = 400 * kMs;
// epoll tags of the two descriptors that are not connections (connections use their slot).
constexpr uint64_t kListenTag = ~0ull;
constexpr uint64_t kWakeTag = ~0ull - 1;

int64_t realtimeNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// host:port → a bound, listening, non-blocking socket.
int listenOn(const std::string& address, std::string* error) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    *error = "--listen " + address + " is not host:port";
    return -1;
  }
  std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found) != 0 ||
      found == nullptr) {
    *error = "--listen " + address + ": cannot resolve";
    return -1;
  }
  int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, 4096) != 0) {
    int why = errno;
    *error = "--listen " + address + ": " + std::strerror(why);
    if (fd >= 0) close(fd);
    freeaddrinfo(found);
    errno = why;  // the caller may wait for a port in use to free up
    return -1;
  }
  freeaddrinfo(found);
  return fd;
}

// Thousands of agents need thousands of descriptors: take what the hard limit allows.
void raiseDescriptorLimit(size_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= wanted) return;
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, wanted);
  setrlimit(RLIMIT_NOFILE, &limit);
}

}  // namespace

// One agent connection, in a slot of State::connections (the slot is its epoll tag).
struct Connection {
  int fd = -1;
  bool authenticated = false;
  bool wantsWrite = false;  // EPOLLOUT is in its interest set
  int64_t acceptedNs = 0;
  int process = -1;  // index into State::processes once HELLO arrived
  std::vector<std::byte> incoming;
  std::vector<std::byte> outgoing;
};

// What the collector knows of one process (one rank of one job attempt). Its calls are
// State::files[i]: the newest `window` of them, in ring-index order, as the analysis reads them.
struct Process {
  size_t window = 0;
  uint64_t firstNewIndex = 0;  // ring indices below it arrived before: later copies are updates
  int64_t toWall = 0;          // add to a record time for the wall clock
  bool connected = false;
  bool saidBye = false;
  int connection = -1;
  // A connection that ended without BYE: when, and whether the process is certainly gone (it ran
  // on this host and no longer maps its trace). Otherwise it counts as alive for a grace period,
  // long enough for an agent to reconnect after a network hiccup.
  int64_t goneNs = 0;
  bool goneForSure = false;
  // Known only from its trace file in the collector's folder (it never connected: it ended, or
  // crashed, before it reached the collector); read again while it runs.
  bool adopted = false;
  bool adoptedAlive = false;
  // Nothing it could still send changes what it did: it said BYE or is gone for sure.
  bool ended() const { return saidBye || goneForSure || (adopted && !adoptedAlive); }
};

struct Collector::State {
  Options options;
  int64_t startedRealtimeNs = 0;  // a HELLO from a process started later is a newer job's
  std::ostream* out = nullptr;
  int listenFd = -1;
  int epollFd = -1;
  int port = 0;
  int wakePipe[2] = {-1, -1};
  std::thread thread;
  std::atomic<bool> stopping{false};
  Counters counters;
  std::vector<Connection> connections;  // slots; fd < 0: free
  std::vector<size_t> freeSlots;
  std::vector<Process> processes;
  std::vector<trace::TraceFile> files;                            // parallel to processes
  std::map<std::tuple<std::string, int, int>, int> processIndex;  // (job, rank, pid)
  analysis::LiveTriage triage;
  std::set<std::string> reported;  // verdict keys already said
  struct Candidate {
    std::string culprits;
    int64_t sinceNs;
  };
  std::map<std::string, Candidate> candidates;  // verdicts seen, not yet settled
  // What asks for an analysis pass: a divergence the triage saw or a member joining or leaving
  // (`wanted`), or any new record (`activity`). Passes are paced by their own cost.
  bool wanted = false;
  bool activity = false;
  int64_t nextCheckNs = 0;
  int64_t nextSweepNs = 0;
  int64_t lastAnalysisNs = 0;
  int64_t lastCostNs = 0;

  void run();
  void accept();
  void read(Connection& connection);
  bool handle(Connection& connection, wire::Frame& frame);
  bool hello(Connection& connection, const wire::Hello& hello);
  void store(size_t process, const trace::CallRecord& record);
  void reloadFromFile(size_t process);
  void drop(Connection& connection, bool rejected);
  void write(Connection& connection);
  void watchWrites(Connection& connection, bool on);
  void maybeAnalyze(int64_t now);
  // `final`: the job is over (every rank said BYE): every verdict is said, none waits to settle.
  void analyze(int64_t now, bool final = false);
  void drainAndFinish();
  // Reads the trace files in the collector's folder of ranks that never connected (or that
  // ended while it thought them alive): a rank that crashed before its first exchange is still
  // evidence, as `ncclwatch inspect` sees it.
  void adoptTraceFiles(int64_t now);
  bool jobMissesRanks() const;
  bool sameAttempt(const trace::RingHeader& header) const;
  int64_t nextAdoptNs = 0;
  std::set<std::string> foreignFiles;  // trace files in the folder that are not this job's
  void report(const analysis::Verdict& verdict, const analysis::JobReport& job);
  bool culpritsEnded(const analysis::Verdict& verdict, const analysis::JobReport& job) const;
  void queueFrame(size_t slot, const std::vector<std::byte>& frame);
  void sendDueAborts(int64_t now);
  struct PendingAbort {
    size_t process;
    uint64_t commHash;
    int64_t dueNs;
  };
  std::vector<PendingAbort> pendingAborts;
};

void Collector::State::accept() {
  for (;;) {
    int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (counters.connected.load() + 1 > options.maxAgents ||
        connections.size() - freeSlots.size() >= options.maxAgents) {
      close(fd);
      counters.rejected++;
      continue;
    }
    size_t slot = connections.size();
    if (!freeSlots.empty()) {
      slot = freeSlots.back();
      freeSlots.pop_back();
    } else {
      connections.emplace_back();
    }
    Connection& connection = connections[slot];
    connection = Connection{};
    connection.fd = fd;
    connection.acceptedNs = steadyNs();
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = slot;
    epoll_ctl(epollFd, EPOLL_CTL_ADD, fd, &event);
  }
}

void Collector::State::drop(Connection& connection, bool rejected) {
  if (rejected) counters.rejected++;
  if (connection.process >= 0) {
    Process& process = processes[static_cast<size_t>(connection.process)];
    process.connected = false;
    process.connection = -1;
    counters.connected--;
    if (!process.saidBye) {
      process.goneNs = steadyNs();
      const trace::TraceFile& file = files[static_cast<size_t>(connection.process)];
      process.goneForSure = analysis::onThisHost(file) && !analysis::runningHere(file);
      if (process.goneForSure) reloadFromFile(static_cast<size_t>(connection.process));
    }
    wanted = true;  // a rank gone without BYE may be a dead rank
  }
  close(connection.fd);  // also leaves the epoll set
  size_t slot = static_cast<size_t>(&connection - connections.data());
  connection = Connection{};
  freeSlots.push_back(slot);
}

bool Collector::State::hello(Connection& connection, const wire::Hello& hello) {
  if (!wire::secretMatches(hello.secret, options.secret)) {
    // An agent of ncclwatch with another secret, started after this collector: a newer job (an
    // elastic restart's next attempt) expects its own collector on this port.
    if (hello.anchorRealtimeNs > startedRealtimeNs) counters.newerJobKnocks++;
    return false;
  }
  auto key = std::make_tuple(std::string(hello.jobId, strnlen(hello.jobId, sizeof hello.jobId)),
                             hello.rank, hello.pid);
  auto [found, added] = processIndex.emplace(key, static_cast<int>(processes.size()));
  if (added) {
    // Processes are never forgotten (a dead one is evidence): bound them too.
    if (processes.size() >= 4 * options.maxAgents) {
      processIndex.erase(found);
      return false;
    }
    Process process;
    // The record budget is shared by the job's ranks; the world size is known from HELLO.
    size_t share = options.maxRecords / static_cast<size_t>(std::max(hello.world, 1));
    process.window = std::clamp<size_t>(share, 256, 65536);
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
    processes.push_back(process);
    files.push_back(std::move(file));
  }
  Process& process = processes[static_cast<size_t>(found->second)];
  if (process.connected) return false;  // one connection per process
  connection.authenticated = true;
  connection.process = found->second;
  process.connected = true;
  process.connection = static_cast<int>(&connection - connections.data());
  counters.agents++;
  counters.connected++;
  wanted = true;
  return true;
}

// Keeps the newest copy of each ring index, the newest `window` indices of the process.
void Collector::State::store(size_t index, const trace::CallRecord& record) {
  Process& process = processes[index];
  std::vector<trace::CallRecord>& records = files[index].records;
  size_t before = records.size();
  int64_t wall = analysis::latestTime(record);
  wall = wall == 0 ? 0 : wall + process.toWall;
  if (record.ringIndex >= process.firstNewIndex) {
    if (triage.observe(record, wall)) wanted = true;
    process.firstNewIndex = record.ringIndex + 1;
  } else {
    triage.observeUpdate(wall);  // a state change, or a resend after a reconnect
  }
  // Exactly the window and its trim slack: growth by doubling would overshoot the budget.
  if (records.capacity() == 0) records.reserve(process.window + process.window / 4 + 1);
  if (records.empty() || record.ringIndex > records.back().ringIndex) {
    records.push_back(record);
  } else {
    auto at = std::lower_bound(records.begin(), records.end(), record.ringIndex,
                               [](const trace::CallRecord& kept, uint64_t ringIndex) {
                                 return kept.ringIndex < ringIndex;
                               });
    if (at != records.end() && at->ringIndex == record.ringIndex) {
      *at = record;
    } else if (at != records.begin() || records.size() < process.window) {
      records.insert(at, record);
    }
  }
  // Trim in steps of a quarter window, so that each record is moved a few times at most.
  if (records.size() > process.window + process.window / 4) {
    records.erase(records.begin(), records.end() - static_cast<std::ptrdiff_t>(process.window));
  }
  counters.recordsHeld += records.size() - before;  // unsigned: wraps right when it shrank
}

// A process that died on this host took its last unsent calls with it, but its ring file
// survives: read them from there, so that the verdict shows where it really stopped.
void Collector::State::reloadFromFile(size_t index) {
  trace::TraceFile& known = files[index];
  trace::TraceFile file = trace::readTraceFile(known.path);
  if (!file.usable || file.header.pid != known.header.pid) return;
  if (!file.comms.empty()) {
    known.comms = file.comms;
    for (const trace::CommInfo& comm : file.comms) triage.addComm(comm);
  }
  for (const trace::CallRecord& record : file.records) store(index, record);
  known.dumps = std::move(file.dumps);
}

bool Collector::State::handle(Connection& connection, wire::Frame& frame) {
  if (!connection.authenticated) {
    return frame.type == wire::FrameType::kHello && hello(connection, frame.hello);
  }
  size_t index = static_cast<size_t>(connection.process);
  Process& process = processes[index];
  trace::TraceFile& file = files[index];
  switch (frame.type) {
    case wire::FrameType::kComms:
      file.comms.clear();
      for (const trace::CommInfo& comm : frame.comms) {
        if (comm.commHash == 0 || comm.nranks <= 0) continue;
        file.comms.push_back(comm);
        triage.addComm(comm);
      }
      wanted = true;
      break;
    case wire::FrameType::kRecords:
      for (const trace::CallRecord& record : frame.records) store(index, record);
      counters.records += frame.records.size();
      activity |= !frame.records.empty();
      break;
    case wire::FrameType::kSites: {
      std::string why;
      trace::parsePythonSites(frame.reason, &file.pythonSites, &why);  // keeps the good lines
      break;
    }
    case wire::FrameType::kWaits:
      // The whole current set: where this rank's pending calls wait inside NCCL.
      file.waits = std::move(frame.waits);
      wanted = true;
      break;
    case wire::FrameType::kBye:
      process.saidBye = true;
      file.header.cleanShutdown = 1;
      wanted = true;
      break;
    default:
      return false;  // HELLO twice, or a collector's frame from an agent
  }
  return true;
}

void Collector::State::read(Connection& connection) {
  std::byte buffer[65536];
  bool ended = false;
  for (;;) {
    ssize_t got = recv(connection.fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (got <= 0) {
      ended = true;  // the frames received before the end still count (the last is BYE)
      break;
    }
    connection.incoming.insert(connection.incoming.end(), buffer, buffer + got);
    if (connection.incoming.size() > kMaxIncoming) {
      drop(connection, true);
      return;
    }
    if (static_cast<size_t>(got) < sizeof buffer) break;  // drained: spare the EAGAIN call
  }
  size_t offset = 0;
  for (;;) {
    wire::Frame frame;
    size_t consumed = 0;
    std::string error;
    auto status = wire::decodeFrame(std::span(connection.incoming).subspan(offset), &frame,
                                    &consumed, &error);
    if (status == wire::DecodeStatus::kNeedMore) break;
    if (status == wire::DecodeStatus::kInvalid || !handle(connection, frame)) {
      drop(connection, true);
      return;
    }
    counters.frames++;
    offset += consumed;
  }
  connection.incoming.erase(connection.incoming.begin(),
                            connection.incoming.begin() + static_cast<std::ptrdiff_t>(offset));
  if (ended) drop(connection, false);
}

void Collector::State::watchWrites(Connection& connection, bool on) {
  if (connection.wantsWrite == on) return;
  connection.wantsWrite = on;
  epoll_event event{};
  event.events = EPOLLIN | (on ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  event.data.u64 = static_cast<uint64_t>(&connection - connections.data());
  epoll_ctl(epollFd, EPOLL_CTL_MOD, connection.fd, &event);
}

void Collector::State::write(Connection& connection) {
  while (!connection.outgoing.empty()) {
    ssize_t sent = send(connection.fd, connection.outgoing.data(), connection.outgoing.size(),
                        MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) break;  // a slow agent keeps its backlog (bounded when queued)
    connection.outgoing.erase(connection.outgoing.begin(), connection.outgoing.begin() + sent);
  }
  watchWrites(connection, !connection.outgoing.empty());
}

void Collector::State::report(const analysis::Verdict& verdict, const analysis::JobReport& job) {
  std::ostringstream text;
  analysis::printVerdictText(verdict, text, analysis::TextStyle{options.colour});
  if (verdict.divergenceNs > 0 && verdict.detectionNs >= verdict.divergenceNs) {
    text << "  (reported " << (verdict.detectionNs - verdict.divergenceNs) / kMs
         << " ms after the divergent call)\n";
  }
  if (!options.directory.empty()) {
    std::ofstream jsonl(options.directory + "/verdicts.jsonl", std::ios::app);
    jsonl << analysis::verdictJson(verdict, job.jobId, job.attempt) << "\n";
  }
  *out << text.str() << std::flush;
  // Every involved rank dumps, so that its trace file shows where each one was.
  std::set<int> involved(verdict.culprits.begin(), verdict.culprits.end());
  for (const analysis::RankClass& rankClass : verdict.classes) {
    involved.insert(rankClass.ranks.begin(), rankClass.ranks.end());
  }
  std::string reason = std::string("collector: ") + analysis::kindName(verdict.kind) + " on comm " +
                       analysis::hashText(verdict.comm.hash) + " at call #" +
                       std::to_string(verdict.seq) + ": " + verdict.explanation;
  // With --abort, the communicators the verdict involves are aborted on every rank that has
  // them, so that nobody stays blocked in them: the verdict's own, and for a dead rank every
  // communicator it belonged to (its partners wait in those too).
  std::set<uint64_t> toAbort;
  if (options.abortOnVerdict && verdict.kind != analysis::VerdictKind::kStraggler) {
    toAbort.insert(verdict.comm.hash);
    if (verdict.kind == analysis::VerdictKind::kDeadRank) {
      for (const trace::TraceFile& file : files) {
        bool culprit = std::find(verdict.culprits.begin(), verdict.culprits.end(),
                                 file.header.rank) != verdict.culprits.end();
        if (!culprit || std::string(file.header.jobId) != job.jobId) continue;
        for (const trace::CommInfo& comm : file.comms) toAbort.insert(comm.commHash);
      }
    }
  }
  // The aborts go out a little after the dump requests: a rank that aborts fails and exits at
  // once, its launcher stops the job, and ranks still taking their dump would lose it.
  int64_t abortAt = steadyNs() + kAbortAfterDumpNs;
  for (size_t i = 0; i < processes.size(); ++i) {
    const Process& process = processes[i];
    if (!process.connected || process.connection < 0) continue;
    if (std::string(files[i].header.jobId) != job.jobId) continue;
    if (involved.count(files[i].header.rank)) {
      std::vector<std::byte> frame;
      wire::encodeDump(reason, frame);
      queueFrame(static_cast<size_t>(process.connection), frame);
    }
    for (const trace::CommInfo& comm : files[i].comms) {
      if (toAbort.count(comm.commHash)) pendingAborts.push_back({i, comm.commHash, abortAt});
    }
  }
}

void Collector::State::queueFrame(size_t slot, const std::vector<std::byte>& frame) {
  Connection& connection = connections[slot];
  if (connection.outgoing.size() + frame.size() > kMaxOutgoing) return;  // a stuck agent
  connection.outgoing.insert(connection.outgoing.end(), frame.begin(), frame.end());
  write(connection);
}

void Collector::State::sendDueAborts(int64_t now) {
  // A process's due aborts go out in one write, so that its agent reads them together and can
  // abort the communicator its rank is blocked in first (an abort may wait for the device).
  std::vector<PendingAbort> later;
  std::map<size_t, std::vector<std::byte>> frames;  // connection -> its abort frames
  for (const PendingAbort& abort : pendingAborts) {
    if (abort.dueNs > now) {
      later.push_back(abort);
      continue;
    }
    const Process& process = processes[abort.process];
    if (!process.connected || process.connection < 0) continue;
    std::vector<std::byte> frame;
    wire::encodeAbort(abort.commHash, frame);
    std::vector<std::byte>& batch = frames[static_cast<size_t>(process.connection)];
    batch.insert(batch.end(), frame.begin(), frame.end());
  }
  for (const auto& [connection, batch] : frames) queueFrame(connection, batch);
  pendingAborts = std::move(later);
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

// Whether every culprit of the verdict has ended (BYE, or a process known to be gone): nothing
// it could still send would change the verdict, so it need not wait to settle (a launcher that
// stops the other ranks after a crash would otherwise end the job first).
bool Collector::State::culpritsEnded(const analysis::Verdict& verdict,
                                     const analysis::JobReport& job) const {
  for (int culprit : verdict.culprits) {
    bool ended = false;
    for (size_t i = 0; i < processes.size(); ++i) {
      if (files[i].header.rank == culprit && std::string(files[i].header.jobId) == job.jobId) {
        ended |= processes[i].ended();
      }
    }
    if (!ended) return false;
  }
  return !verdict.culprits.empty();
}

void Collector::State::maybeAnalyze(int64_t now) {
  if (now < nextCheckNs) return;
  nextCheckNs = now + options.analyzeEveryMs * kMs;
  // Time-based verdicts (missing, stuck, deadlock, dead rank) need passes while nothing moves.
  bool quiet = counters.connected.load() > 0 && triage.lastActivityNs() > 0 &&
               realtimeNs() - triage.lastActivityNs() >= options.quietMs * kMs;
  int64_t since = now - lastAnalysisNs;
  // Each pass's cost paces the next: a divergence, a settling verdict or a quiet job may use a
  // quarter of a core; plain activity a tenth (a healthy job of thousands of ranks costs little).
  bool urgent = wanted || !candidates.empty();
  bool due = (urgent && since >= 3 * lastCostNs) ||
             (quiet && since >= std::max<int64_t>(200 * kMs, 3 * lastCostNs)) ||
             (activity && since >= 9 * lastCostNs) ||
             since >= std::max<int64_t>(2000 * kMs, 20 * lastCostNs);
  if (!due || processes.empty()) return;
  wanted = activity = false;
  analyze(now);
  int64_t end = steadyNs();
  lastCostNs = end - now;
  counters.analysisNs += static_cast<uint64_t>(lastCostNs);
  lastAnalysisNs = end;
}

void Collector::State::analyze(int64_t now, bool final) {
  analysis::Options analysisOptions;
  analysisOptions.nowNs = realtimeNs();
  analysisOptions.quietNs = options.quietMs * kMs;
  analysisOptions.probeProcesses = false;
  bool graceRunning = false;
  for (size_t i = 0; i < processes.size(); ++i) {
    const Process& process = processes[i];
    bool inGrace = !process.connected && !process.saidBye && !process.goneForSure &&
                   !process.adopted && now - process.goneNs < kReconnectGraceNs;
    graceRunning |= inGrace;
    if ((process.connected && !process.saidBye) || inGrace ||
        (process.adopted && !process.connected && process.adoptedAlive)) {
      analysisOptions.aliveRanks.push_back(files[i].header.rank);
    }
  }
  if (graceRunning) wanted = true;  // look again once the grace is over
  counters.analyses++;
  analysis::Report result = analysis::analyze(files, analysisOptions);
  // A verdict is said once every member of its communicator has issued the call, or once it
  // has held, with the same culprits, for settleMs: ranks report a little apart, and a verdict
  // drawn before the last of them has spoken can blame the wrong one.
  std::map<std::string, Candidate> seen;
  for (const analysis::JobReport& job : result.jobs) {
    for (const analysis::Verdict& verdict : job.verdicts) {
      if (!verdict.primary) continue;
      std::string key = job.jobId + "/" + std::to_string(job.attempt) + "/" +
                        analysis::kindName(verdict.kind) + "/" +
                        analysis::hashText(verdict.comm.hash) + "/" + std::to_string(verdict.seq);
      if (reported.count(key)) continue;
      std::string culprits = analysis::formatRanks(verdict.culprits);
      auto previous = candidates.find(key);
      int64_t since = previous != candidates.end() && previous->second.culprits == culprits
                          ? previous->second.sinceNs
                          : now;
      seen[key] = Candidate{culprits, since};
      bool settled =
          final || now - since >= options.settleMs * kMs ||
          (verdict.kind == analysis::VerdictKind::kMismatch && everyMemberSpoke(verdict, job)) ||
          ((verdict.kind == analysis::VerdictKind::kDeadRank ||
            verdict.kind == analysis::VerdictKind::kError) &&
           culpritsEnded(verdict, job));
      if (!settled) continue;
      reported.insert(key);
      seen.erase(key);
      counters.verdicts++;
      report(verdict, job);
    }
  }
  candidates = std::move(seen);
}

void Collector::State::run() {
  epoll_event events[256];
  while (!stopping.load()) {
    int ready = epoll_wait(epollFd, events, 256, options.analyzeEveryMs);
    for (int i = 0; i < ready; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kListenTag) {
        accept();
        continue;
      }
      if (tag == kWakeTag) continue;  // stop() wrote it; the loop condition sees why
      if (tag >= connections.size()) continue;
      Connection& connection = connections[tag];
      if (connection.fd < 0) continue;  // dropped earlier in this batch
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read(connection);
      if (connection.fd >= 0 && (events[i].events & EPOLLOUT)) write(connection);
    }
    int64_t now = steadyNs();
    if (now >= nextSweepNs) {
      nextSweepNs = now + 100 * kMs;
      // A connection that never proves it belongs to the job is dropped.
      for (Connection& connection : connections) {
        if (connection.fd >= 0 && !connection.authenticated &&
            now - connection.acceptedNs > kHelloTimeoutNs) {
          drop(connection, true);
        }
      }
    }
    if (!pendingAborts.empty()) sendDueAborts(now);
    if (now >= nextAdoptNs) {
      nextAdoptNs = now + 500 * kMs;
      adoptTraceFiles(now);
    }
    maybeAnalyze(now);
  }
  drainAndFinish();
}

// At the end: the frames agents sent before their connections closed (a job that just ended
// is still in the socket buffers), then, when every rank ended normally, one last pass that
// says whatever it finds. A job whose ranks were killed gets none: killed ranks never sent
// their last calls, and a verdict drawn from that could blame the wrong rank (`ncclwatch
// inspect` reads their complete files instead).
void Collector::State::drainAndFinish() {
  int64_t deadline = steadyNs() + 2000 * kMs, lastNews = steadyNs();
  epoll_event events[256];
  for (;;) {
    // Connections still in the listen queue, agents still sending, or closed ones whose last
    // frames are unread: until none is left, or agents still connected stay silent for 200 ms
    // (a collector stopped while its job runs), or the bound.
    int ready = epoll_wait(epollFd, events, 256, 20);
    bool open = false, news = false;
    for (const Connection& connection : connections) open |= connection.fd >= 0;
    for (int i = 0; i < ready; ++i) news |= events[i].data.u64 != kWakeTag;  // stop() woke us
    int64_t now = steadyNs();
    if (news) lastNews = now;
    if ((!news && !open) || now - lastNews >= 200 * kMs || now >= deadline) break;
    for (int i = 0; i < ready; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kListenTag) {
        accept();
        continue;
      }
      if (tag == kWakeTag || tag >= connections.size()) continue;
      Connection& connection = connections[tag];
      if (connection.fd >= 0 && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
        read(connection);
      }
    }
  }
  if (processes.empty()) return;
  adoptTraceFiles(steadyNs());
  for (const Process& process : processes) {
    if (!process.saidBye && !(process.adopted && !process.adoptedAlive && !process.connected)) {
      return;
    }
  }
  for (const trace::TraceFile& file : files) {
    if (file.header.cleanShutdown == 0) return;
  }
  analyze(steadyNs(), true);
}

// Whether a trace file found in the folder belongs to the attempt the collector watches: its
// rank is not known yet, and it started with the known ranks (a restarted job reuses its id and
// folder; the earlier attempt's files are older).
bool Collector::State::sameAttempt(const trace::RingHeader& header) const {
  int64_t earliest = INT64_MAX;
  for (size_t i = 0; i < files.size(); ++i) {
    const trace::RingHeader& known = files[i].header;
    if (std::strncmp(known.jobId, header.jobId, sizeof known.jobId) != 0) continue;
    if (known.rank == header.rank && known.pid != header.pid) return false;
    if (!processes[i].adopted) earliest = std::min(earliest, known.anchorRealtimeNs);
  }
  return earliest == INT64_MAX || header.anchorRealtimeNs >= earliest - 60'000 * kMs;
}

bool Collector::State::jobMissesRanks() const {
  std::map<std::string, std::pair<int, std::set<int>>> jobs;  // job -> (world, ranks known)
  for (const trace::TraceFile& file : files) {
    auto& job = jobs[file.header.jobId];
    job.first = std::max(job.first, file.header.world);
    job.second.insert(file.header.rank);
  }
  for (const auto& [id, job] : jobs) {
    if (static_cast<int>(job.second.size()) < job.first) return true;
  }
  return false;
}

void Collector::State::adoptTraceFiles(int64_t now) {
  if (options.directory.empty() || processes.empty()) return;
  // Processes that left without BYE while they still mapped their file (exiting): gone now?
  for (size_t i = 0; i < processes.size(); ++i) {
    Process& process = processes[i];
    if (process.connected || process.saidBye || process.goneForSure || process.adopted) continue;
    if (analysis::onThisHost(files[i]) && !analysis::runningHere(files[i])) {
      process.goneForSure = true;
      reloadFromFile(i);
      wanted = true;
    }
  }
  bool rereadAdopted = false;
  for (const Process& process : processes) {
    rereadAdopted |= process.adopted && process.adoptedAlive && !process.connected;
  }
  if (!rereadAdopted && !jobMissesRanks()) return;
  std::set<std::string> jobIds;
  for (const trace::TraceFile& file : files) jobIds.insert(file.header.jobId);
  // Files known already (by name: <host>-<pid>.ncclwatch), except adopted ones that may still
  // grow; only this host's (a shared folder holds every host's); a few new ones per scan.
  std::set<std::string> known;
  for (size_t i = 0; i < files.size(); ++i) {
    const Process& process = processes[i];
    if (process.adopted && process.adoptedAlive && !process.connected) continue;
    known.insert(std::filesystem::path(files[i].path).filename().string());
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string prefix = std::string(host) + "-";
  int reads = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(options.directory, error)) {
    std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".ncclwatch" || name.rfind(prefix, 0) != 0 ||
        known.count(name) || foreignFiles.count(name)) {
      continue;
    }
    if (++reads > 64) break;
    std::string path = entry.path().string();
    trace::TraceFile file = trace::readTraceFile(path);
    if (!file.usable) continue;  // not (yet) a trace: look again next time
    if (!jobIds.count(file.header.jobId) || !analysis::onThisHost(file) ||
        !sameAttempt(file.header)) {
      foreignFiles.insert(name);  // another job's, or an earlier attempt's: never read again
      continue;
    }
    auto key = std::make_tuple(std::string(file.header.jobId), file.header.rank, file.header.pid);
    auto found = processIndex.find(key);
    size_t index = 0;
    if (found == processIndex.end()) {
      if (processes.size() >= 4 * options.maxAgents) return;
      Process process;
      process.adopted = true;
      size_t share = options.maxRecords / static_cast<size_t>(std::max(file.header.world, 1));
      process.window = std::clamp<size_t>(share, 256, 65536);
      process.toWall = file.header.anchorRealtimeNs - file.header.anchorMonotonicNs;
      index = processes.size();
      processIndex.emplace(key, static_cast<int>(index));
      processes.push_back(process);
      trace::TraceFile known;
      known.header = file.header;
      known.path = path;
      known.usable = true;
      files.push_back(std::move(known));
    } else {
      index = static_cast<size_t>(found->second);
      if (!processes[index].adopted || processes[index].connected) continue;
    }
    Process& process = processes[index];
    bool alive = file.header.cleanShutdown == 0 && analysis::runningHere(file);
    files[index].header.cleanShutdown = file.header.cleanShutdown;
    if (!alive && !process.adoptedAlive && found != processIndex.end()) continue;  // read before
    process.adoptedAlive = alive;
    if (!file.comms.empty()) {
      files[index].comms = file.comms;
      for (const trace::CommInfo& comm : file.comms) triage.addComm(comm);
    }
    for (const trace::CallRecord& record : file.records) store(index, record);
    files[index].dumps = std::move(file.dumps);
    wanted = true;
  }
  (void)now;
}

Collector::Collector() : state_(std::make_unique<State>()) {}

Collector::~Collector() {
  stop();
}

bool Collector::start(const Options& options, std::ostream& out, std::string* error) {
  if (options.secret.empty() || options.secret.size() >= wire::kSecretBytes) {
    *error = "the collector needs a secret of 1 to " + std::to_string(wire::kSecretBytes - 1) +
             " characters";
    return false;
  }
  state_->options = options;
  state_->out = &out;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  state_->startedRealtimeNs = int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
  state_->listenFd = listenOn(options.listen, error);
  for (int waited = 0; state_->listenFd < 0 && errno == EADDRINUSE && waited < options.listenWaitMs;
       waited += 100) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    state_->listenFd = listenOn(options.listen, error);
  }
  if (state_->listenFd < 0) return false;
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  getsockname(state_->listenFd, reinterpret_cast<sockaddr*>(&bound), &length);
  state_->port = bound.ss_family == AF_INET6
                     ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                     : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(state_->wakePipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    *error = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  state_->epollFd = epoll_create1(EPOLL_CLOEXEC);
  if (state_->epollFd < 0) {
    *error = std::string("epoll: ") + std::strerror(errno);
    return false;
  }
  epoll_event listenEvent{};
  listenEvent.events = EPOLLIN;
  listenEvent.data.u64 = kListenTag;
  epoll_ctl(state_->epollFd, EPOLL_CTL_ADD, state_->listenFd, &listenEvent);
  epoll_event wakeEvent{};
  wakeEvent.events = EPOLLIN;
  wakeEvent.data.u64 = kWakeTag;
  epoll_ctl(state_->epollFd, EPOLL_CTL_ADD, state_->wakePipe[0], &wakeEvent);
  raiseDescriptorLimit(options.maxAgents + 64);
  if (!options.directory.empty()) {
    // A folder that cannot be made (a file in its place, read-only) costs verdicts.jsonl only:
    // the verdicts still go to stderr.
    std::error_code error;
    std::filesystem::create_directories(options.directory, error);
    if (error) {
      std::fprintf(stderr,
                   "[ncclwatch] collector: cannot create %s (%s): verdicts on stderr only\n",
                   options.directory.c_str(), error.message().c_str());
    }
  }
  state_->thread = std::thread([state = state_.get()] { state->run(); });
  return true;
}

int Collector::port() const {
  return state_->port;
}

void Collector::stop() {
  if (!state_->thread.joinable()) return;
  state_->stopping.store(true);
  char byte = 1;
  ssize_t ignored = ::write(state_->wakePipe[1], &byte, 1);
  (void)ignored;
  state_->thread.join();
  for (Connection& connection : state_->connections) {
    if (connection.fd >= 0) close(connection.fd);
  }
  state_->connections.clear();
  close(state_->epollFd);
  close(state_->listenFd);
  close(state_->wakePipe[0]);
  close(state_->wakePipe[1]);
}

const Counters& Collector::counters() const {
  return state_->counters;
}

std::string makeSecret() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  static const char* const kHex = "0123456789abcdef";
  std::string secret;
  for (unsigned char byte : bytes) {
    secret += kHex[byte >> 4];
    secret += kHex[byte & 15];
  }
  return secret;
}

namespace {
std::atomic<pid_t> g_child{0};
std::atomic<bool> g_stopCollect{false};

void forward(int signal) {
  pid_t child = g_child.load();
  if (child > 0) kill(child, signal);
  g_stopCollect.store(true);
}

// ../lib/libncclwatch.so beside the running CLI (build/bin/ncclwatch → build/lib).
std::string defaultPreload() {
  std::error_code error;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "";
  return (self.parent_path().parent_path() / "lib" / "libncclwatch.so").string();
}
}  // namespace

int runCollect(const Options& options, std::ostream& out, std::ostream& err) {
  Collector collector;
  std::string error;
  // Verdicts go to stderr, as a launcher's would; stdout says where the collector listens.
  if (!collector.start(options, err, &error)) {
    err << "ncclwatch collect: " << error << "\n";
    return 2;
  }
  out << "[ncclwatch] collector listening on port " << collector.port() << "\n" << std::flush;
  signal(SIGINT, forward);
  signal(SIGTERM, forward);
  // A sidecar prints on rank 0's stderr, which may close before the last verdict: that verdict
  // still goes to verdicts.jsonl.
  signal(SIGPIPE, SIG_IGN);
  const Counters& counters = collector.counters();
  auto started = std::chrono::steady_clock::now(), lastConnected = started;
  while (!g_stopCollect.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto now = std::chrono::steady_clock::now();
    if (counters.connected.load() > 0) lastConnected = now;
    if (!options.untilIdle) continue;
    if (counters.newerJobKnocks.load() > 0 && counters.connected.load() == 0) {
      // A lingering sidecar of a failed attempt: the new attempt's sidecar waits for this port.
      err << "[ncclwatch] collector on port " << collector.port()
          << ": agents of a newer job knock with another secret and none of this job's is "
             "connected; leaving the port to the newer job's collector\n";
      break;
    }
    bool came = counters.agents.load() > 0;
    if ((came && now - lastConnected >= std::chrono::seconds(1)) ||
        (!came && now - started >= std::chrono::seconds(60))) {
      break;
    }
  }
  collector.stop();
  err << "[ncclwatch] collector stats: agents=" << counters.agents.load()
      << " rejected=" << counters.rejected.load() << " frames=" << counters.frames.load()
      << " records=" << counters.records.load() << " verdicts=" << counters.verdicts.load()
      << " analyses=" << counters.analyses.load()
      << " analysis_ms=" << counters.analysisNs.load() / 1'000'000 << "\n";
  return counters.verdicts.load() > 0 ? 1 : 0;
}

int runJob(const RunOptions& options, std::ostream& out, std::ostream& err) {
  if (options.command.empty()) {
    err << "ncclwatch run: no program given (ncclwatch run -- PROGRAM ARGS...)\n";
    return 2;
  }
  std::string preload = options.preload.empty() ? defaultPreload() : options.preload;
  if (preload.empty() || !std::filesystem::exists(preload)) {
    err << "ncclwatch run: " << (preload.empty() ? "libncclwatch.so" : preload)
        << " not found; give it with --preload\n";
    return 2;
  }
  std::string directory = options.directory;
  if (directory.empty()) {
    const char* set = std::getenv("NCCLWATCH_DIR");
    directory = set != nullptr && *set ? set : "ncclwatch-logs/run-" + std::to_string(getpid());
  }
  Options collectorOptions;
  collectorOptions.secret = makeSecret();
  collectorOptions.directory = directory;
  collectorOptions.abortOnVerdict = options.abortOnVerdict;
  collectorOptions.quietMs = options.quietMs;
  collectorOptions.colour = cli::useColour(-1, STDERR_FILENO);
  Collector collector;
  std::string error;
  if (!collector.start(collectorOptions, err, &error)) {
    err << "ncclwatch run: " << error << "\n";
    return 2;
  }
  if (options.pluginOnly) {
    // NCCL dlopens this path itself at its first communicator init.
    setenv("NCCL_PROFILER_PLUGIN", std::filesystem::absolute(preload).c_str(), 1);
  } else {
    const char* existing = std::getenv("LD_PRELOAD");
    std::string preloadList =
        preload + (existing != nullptr && *existing ? ":" + std::string(existing) : "");
    setenv("LD_PRELOAD", preloadList.c_str(), 1);
  }
  setenv("NCCLWATCH_COLLECTOR", ("127.0.0.1:" + std::to_string(collector.port())).c_str(), 1);
  setenv("NCCLWATCH_SECRET", collectorOptions.secret.c_str(), 1);
  setenv("NCCLWATCH_DIR", directory.c_str(), 1);
  out << "[ncclwatch] watching " << options.command[0] << "; traces and verdicts in " << directory
      << "\n"
      << std::flush;
  pid_t child = fork();
  if (child == 0) {
    std::vector<char*> argv;
    for (const std::string& word : options.command) argv.push_back(const_cast<char*>(word.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "ncclwatch run: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  if (child < 0) {
    err << "ncclwatch run: fork: " << std::strerror(errno) << "\n";
    collector.stop();
    return 2;
  }
  g_child.store(child);
  signal(SIGINT, forward);
  signal(SIGTERM, forward);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  collector.stop();
  uint64_t verdicts = collector.counters().verdicts.load();
  out << "[ncclwatch] " << verdicts << (verdicts == 1 ? " verdict" : " verdicts");
  if (verdicts > 0) out << " (" << directory << "/verdicts.jsonl)";
  out << "; run `ncclwatch inspect " << directory << "` for the whole picture\n" << std::flush;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace ncclwatch::collect
