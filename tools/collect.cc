#include "collect.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/describe.h"
#include "load.h"
#include "trace/wire.h"

namespace ncclwatch::collect {
namespace wire = trace::wire;

namespace {

constexpr size_t kMaxIncoming = 2 * wire::kMaxPayload + sizeof(wire::FrameHeader);
constexpr size_t kMaxOutgoing = 1u << 20;
constexpr size_t kMaxRecordsPerProcess = 1u << 16;  // the newest calls of each rank analysed
constexpr int64_t kHelloTimeoutNs = 5'000'000'000;

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
  if (fd < 0 || bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
    *error = "--listen " + address + ": " + std::strerror(errno);
    if (fd >= 0) close(fd);
    freeaddrinfo(found);
    return -1;
  }
  freeaddrinfo(found);
  return fd;
}

}  // namespace

// One agent connection.
struct Connection {
  int fd = -1;
  bool authenticated = false;
  int64_t acceptedNs = 0;
  int process = -1;  // index into State::processes once HELLO arrived
  std::vector<std::byte> incoming;
  std::vector<std::byte> outgoing;
};

// What the collector knows of one process (one rank of one job attempt).
struct Process {
  trace::TraceFile file;
  std::map<uint64_t, trace::CallRecord> records;  // by ring index
  bool connected = false;
  bool said_bye = false;
  int connection = -1;
};

struct Collector::State {
  Options options;
  std::ostream* out = nullptr;
  int listenFd = -1;
  int port = 0;
  int wakePipe[2] = {-1, -1};
  std::thread thread;
  std::atomic<bool> stopping{false};
  Counters counters;
  std::vector<Connection> connections;
  std::vector<Process> processes;
  std::map<std::tuple<std::string, int, int>, int> processIndex;  // (job, rank, pid)
  std::set<std::string> reported;                                 // verdict keys already said
  struct Candidate {
    std::string culprits;
    int64_t sinceNs;
  };
  std::map<std::string, Candidate> candidates;  // verdicts seen, not yet settled
  bool dirty = false;
  int64_t lastAnalysisNs = 0;

  void run();
  void accept();
  void read(Connection& connection);
  bool handle(Connection& connection, wire::Frame& frame);
  void drop(Connection& connection, bool rejected);
  void write(Connection& connection);
  void analyze();
  void report(const analysis::Verdict& verdict, const analysis::JobReport& job);
};

void Collector::State::accept() {
  for (;;) {
    int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (connections.size() >= options.maxAgents) {
      close(fd);
      counters.rejected++;
      continue;
    }
    Connection connection;
    connection.fd = fd;
    connection.acceptedNs = steadyNs();
    connections.push_back(std::move(connection));
  }
}

void Collector::State::drop(Connection& connection, bool rejected) {
  if (rejected) counters.rejected++;
  if (connection.process >= 0) {
    Process& process = processes[static_cast<size_t>(connection.process)];
    process.connected = false;
    process.connection = -1;
    dirty = true;
  }
  close(connection.fd);
  connection.fd = -1;
}

bool Collector::State::handle(Connection& connection, wire::Frame& frame) {
  if (!connection.authenticated) {
    if (frame.type != wire::FrameType::kHello ||
        !wire::secretMatches(frame.hello.secret, options.secret)) {
      return false;
    }
    connection.authenticated = true;
    counters.agents++;
    const wire::Hello& hello = frame.hello;
    auto key = std::make_tuple(std::string(hello.jobId, strnlen(hello.jobId, sizeof hello.jobId)),
                               hello.rank, hello.pid);
    auto [found, added] = processIndex.emplace(key, static_cast<int>(processes.size()));
    if (added) {
      Process process;
      trace::RingHeader& header = process.file.header;
      header.pid = hello.pid;
      header.rank = hello.rank;
      header.world = hello.world;
      header.localRank = hello.localRank;
      header.anchorMonotonicNs = hello.anchorMonotonicNs;
      header.anchorRealtimeNs = hello.anchorRealtimeNs;
      std::memcpy(header.host, hello.host, sizeof header.host);
      std::memcpy(header.jobId, hello.jobId, sizeof header.jobId);
      header.host[sizeof header.host - 1] = header.jobId[sizeof header.jobId - 1] = '\0';
      process.file.usable = true;
      process.file.path = std::string(hello.tracePath, strnlen(hello.tracePath, 256));
      processes.push_back(std::move(process));
    }
    connection.process = found->second;
    Process& process = processes[static_cast<size_t>(found->second)];
    process.connected = true;
    process.connection = static_cast<int>(&connection - connections.data());
    dirty = true;
    return true;
  }
  Process& process = processes[static_cast<size_t>(connection.process)];
  switch (frame.type) {
    case wire::FrameType::kComms:
      process.file.comms.clear();
      for (const trace::CommInfo& comm : frame.comms) {
        if (comm.commHash != 0 && comm.nranks > 0) process.file.comms.push_back(comm);
      }
      break;
    case wire::FrameType::kRecords:
      for (const trace::CallRecord& record : frame.records) {
        process.records[record.ringIndex] = record;
      }
      while (process.records.size() > kMaxRecordsPerProcess) {
        process.records.erase(process.records.begin());
      }
      counters.records += frame.records.size();
      break;
    case wire::FrameType::kBye:
      process.said_bye = true;
      process.file.header.cleanShutdown = 1;
      break;
    default:
      return false;  // HELLO twice, or a collector's frame from an agent
  }
  dirty |= frame.type != wire::FrameType::kRecords || !frame.records.empty();
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

void Collector::State::write(Connection& connection) {
  while (!connection.outgoing.empty()) {
    ssize_t sent = send(connection.fd, connection.outgoing.data(), connection.outgoing.size(),
                        MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return;  // a slow agent keeps its backlog (bounded when queued)
    connection.outgoing.erase(connection.outgoing.begin(), connection.outgoing.begin() + sent);
  }
}

void Collector::State::report(const analysis::Verdict& verdict, const analysis::JobReport& job) {
  std::ostringstream text;
  analysis::printVerdictText(verdict, text, analysis::TextStyle{options.colour});
  if (verdict.divergenceNs > 0 && verdict.detectionNs >= verdict.divergenceNs) {
    text << "  (reported " << (verdict.detectionNs - verdict.divergenceNs) / 1'000'000
         << " ms after the divergent call)\n";
  }
  *out << text.str() << std::flush;
  if (!options.directory.empty()) {
    std::ofstream jsonl(options.directory + "/verdicts.jsonl", std::ios::app);
    jsonl << analysis::verdictJson(verdict, job.jobId, job.attempt) << "\n";
  }
  // Every involved rank dumps, so that its trace file shows where each one was.
  std::set<int> involved(verdict.culprits.begin(), verdict.culprits.end());
  for (const analysis::RankClass& rankClass : verdict.classes) {
    involved.insert(rankClass.ranks.begin(), rankClass.ranks.end());
  }
  std::string reason = std::string("collector: ") + analysis::kindName(verdict.kind) + " on comm " +
                       analysis::hashText(verdict.comm.hash) + " at call #" +
                       std::to_string(verdict.seq) + ": " + verdict.explanation;
  for (Process& process : processes) {
    if (!process.connected || process.connection < 0) continue;
    if (std::string(process.file.header.jobId) != job.jobId) continue;
    if (!involved.count(process.file.header.rank)) continue;
    Connection& connection = connections[static_cast<size_t>(process.connection)];
    std::vector<std::byte> frame;
    wire::encodeDump(reason, frame);
    if (options.abortOnVerdict && verdict.kind != analysis::VerdictKind::kStraggler) {
      wire::encodeAbort(verdict.comm.hash, frame);
    }
    if (connection.outgoing.size() + frame.size() <= kMaxOutgoing) {
      connection.outgoing.insert(connection.outgoing.end(), frame.begin(), frame.end());
      write(connection);
    }
  }
}

void Collector::State::analyze() {
  int64_t now = steadyNs();
  // Verdicts that depend on time (missing, stuck, dead) need passes without new data too.
  if (!dirty && candidates.empty() && now - lastAnalysisNs < 200'000'000) return;
  lastAnalysisNs = now;
  dirty = false;
  std::vector<trace::TraceFile> files;
  analysis::Options analysisOptions;
  analysisOptions.nowNs = realtimeNs();
  analysisOptions.quietNs = options.quietMs * 1'000'000;
  analysisOptions.probeProcesses = false;
  for (const Process& process : processes) {
    trace::TraceFile file = process.file;
    file.records.reserve(process.records.size());
    for (const auto& [index, record] : process.records) file.records.push_back(record);
    if (process.connected && !process.said_bye) {
      analysisOptions.aliveRanks.push_back(process.file.header.rank);
    }
    files.push_back(std::move(file));
  }
  if (files.empty()) return;
  counters.analyses++;
  analysis::Report result = analysis::analyze(files, analysisOptions);
  // A verdict is said once it has held, with the same culprits, for settleMs: ranks report a
  // little apart, and a verdict drawn before the last of them has spoken can blame the wrong one.
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
      if (now - since < options.settleMs * 1'000'000) continue;
      reported.insert(key);
      counters.verdicts++;
      report(verdict, job);
    }
  }
  candidates = std::move(seen);
}

void Collector::State::run() {
  while (!stopping.load()) {
    std::vector<pollfd> fds;
    fds.push_back({listenFd, POLLIN, 0});
    fds.push_back({wakePipe[0], POLLIN, 0});
    for (const Connection& connection : connections) {
      short events = POLLIN | (connection.outgoing.empty() ? 0 : POLLOUT);
      fds.push_back({connection.fd, events, 0});
    }
    poll(fds.data(), fds.size(), options.analyzeEveryMs);
    if (fds[0].revents & POLLIN) accept();
    int64_t now = steadyNs();
    for (size_t i = 2; i < fds.size(); ++i) {
      Connection& connection = connections[i - 2];
      if (connection.fd < 0) continue;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read(connection);
      if (connection.fd >= 0 && (fds[i].revents & POLLOUT)) write(connection);
      // A connection that never proves it belongs to the job is dropped.
      if (connection.fd >= 0 && !connection.authenticated &&
          now - connection.acceptedNs > kHelloTimeoutNs) {
        drop(connection, true);
      }
    }
    // Closed connections leave; processes keep pointing at the live ones.
    std::vector<Connection> open;
    for (Connection& connection : connections) {
      if (connection.fd >= 0) open.push_back(std::move(connection));
    }
    connections = std::move(open);
    for (Process& process : processes) process.connection = -1;
    for (size_t i = 0; i < connections.size(); ++i) {
      if (connections[i].process >= 0) {
        processes[static_cast<size_t>(connections[i].process)].connection = static_cast<int>(i);
      }
    }
    analyze();
  }
  // No last pass once the job is gone: ranks killed while stopping never sent their last calls,
  // and a verdict drawn from that would blame the wrong rank; `ncclwatch inspect` reads the
  // complete files instead.
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
  state_->listenFd = listenOn(options.listen, error);
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
  if (!options.directory.empty()) std::filesystem::create_directories(options.directory);
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
  for (Connection& connection : state_->connections) close(connection.fd);
  state_->connections.clear();
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
  if (!collector.start(options, out, &error)) {
    err << "ncclwatch collect: " << error << "\n";
    return 2;
  }
  out << "[ncclwatch] collector listening on port " << collector.port() << "\n" << std::flush;
  signal(SIGINT, forward);
  signal(SIGTERM, forward);
  while (!g_stopCollect.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  collector.stop();
  return collector.counters().verdicts.load() > 0 ? 1 : 0;
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
  collectorOptions.colour = cli::useColour(-1, STDOUT_FILENO);
  Collector collector;
  std::string error;
  if (!collector.start(collectorOptions, out, &error)) {
    err << "ncclwatch run: " << error << "\n";
    return 2;
  }
  const char* existing = std::getenv("LD_PRELOAD");
  std::string preloadList =
      preload + (existing != nullptr && *existing ? ":" + std::string(existing) : "");
  setenv("LD_PRELOAD", preloadList.c_str(), 1);
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
