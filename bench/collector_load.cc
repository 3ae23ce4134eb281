// Collector scale benchmark: starts `ncclwatch collect` and speaks the agent protocol
// (docs/protocol.md) to it as N agents (default 4096) that each make `rate` NCCL calls a second,
// every agent sending one RECORDS frame per poll interval as the real watchdog does. Prints the
// collector's CPU (cores) and resident memory over a steady window, the generator's own CPU (so
// that a saturated machine is not mistaken for a slow collector), and how long the collector
// takes to report a mismatched collective injected at the end. The numbers are for humans: no
// budget is asserted here.
//
// Every agent of a communicator issues the same calls in the same order with the same
// arguments, so a correct collector reports nothing until the injected mismatch.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "trace/fingerprint.h"
#include "trace/identity.h"
#include "trace/wire.h"

namespace {

namespace trace = ncclwatch::trace;
namespace wire = ncclwatch::trace::wire;
using trace::CallRecord;
using trace::OpKind;

// A backlogged connection holds at most this much in the generator; whole frames beyond it are
// dropped and counted, as a real agent's bounded send buffer does. Small enough that 4096 stuck
// connections cannot exhaust the machine (1 GiB), large enough for seconds of one agent's calls.
constexpr size_t kMaxQueuedBytes = 256 * 1024;
constexpr size_t kConnectBatch = 256;  // well under the collector's listen backlog of 1024
constexpr int64_t kConnectDeadlineNs = 120'000'000'000;
constexpr int64_t kStartDeadlineNs = 10'000'000'000;
constexpr int64_t kStopDeadlineNs = 30'000'000'000;
constexpr size_t kMaxStderrBytes = 64 * 1024;
constexpr uint8_t kBfloat16 = 9;  // ncclBfloat16
constexpr uint8_t kSum = 0;       // ncclSum
constexpr uint64_t kEpollStdout = ~0ull;
constexpr uint64_t kEpollStderr = ~0ull - 1;

volatile sig_atomic_t g_interrupted = 0;

int64_t monotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1'000'000'000ll + ts.tv_nsec;
}

int64_t realtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec * 1'000'000'000ll + ts.tv_nsec;
}

double mib(double bytes) {
  return bytes / (1024.0 * 1024.0);
}

struct Args {
  std::string cli;
  long agents = 4096;
  double rate = 100;  // calls per second per agent
  double seconds = 20;
  double warmup = 3;
  double verdictWait = 30;
  long tickMs = 100;
  long commSize = 8;
};

const char* const kUsage =
    "usage: collector_load --cli PATH_TO_ncclwatch [--agents 4096] [--rate 100] [--seconds 20]\n"
    "                      [--tick-ms 100] [--comm-size 8] [--warmup 3] [--verdict-wait 30]\n";

bool parseNumber(const char* text, double low, double high, double* value) {
  char* end = nullptr;
  errno = 0;
  double parsed = std::strtod(text, &end);
  if (end == text || *end != '\0' || errno != 0 || !(parsed >= low && parsed <= high)) {
    return false;
  }
  *value = parsed;
  return true;
}

bool parseArgs(int argc, char** argv, Args* args, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    if (name == "--help" || name == "-h") {
      *error = "";
      return false;
    }
    if (i + 1 >= argc) {
      *error = name + " needs a value";
      return false;
    }
    const char* text = argv[++i];
    double value = 0;
    auto number = [&](double low, double high, bool whole = false) {
      if (parseNumber(text, low, high, &value) && (!whole || value == static_cast<long>(value))) {
        return true;
      }
      char range[64];
      std::snprintf(range, sizeof range, " in [%g, %g]", low, high);
      *error = name + " " + text + " is not a " + (whole ? "whole number" : "number") + range;
      return false;
    };
    if (name == "--cli") {
      args->cli = text;
    } else if (name == "--agents") {
      if (!number(2, 100000, true)) return false;
      args->agents = static_cast<long>(value);
    } else if (name == "--rate") {
      if (!number(0.001, 1e6)) return false;
      args->rate = value;
    } else if (name == "--seconds") {
      if (!number(1, 86400)) return false;
      args->seconds = value;
    } else if (name == "--warmup") {
      if (!number(0, 3600)) return false;
      args->warmup = value;
    } else if (name == "--verdict-wait") {
      if (!number(0.1, 3600)) return false;
      args->verdictWait = value;
    } else if (name == "--tick-ms") {
      if (!number(1, 60000, true)) return false;
      args->tickMs = static_cast<long>(value);
    } else if (name == "--comm-size") {
      if (!number(1, 100000, true)) return false;
      args->commSize = static_cast<long>(value);
    } else {
      *error = "unknown option " + name;
      return false;
    }
  }
  if (args->cli.empty()) {
    *error = "--cli PATH_TO_ncclwatch is required";
    return false;
  }
  if (access(args->cli.c_str(), X_OK) != 0) {
    *error = args->cli + " is not an executable: " + std::strerror(errno);
    return false;
  }
  // Unequal children would be a colour mismatch to the analysis: a correct collector must stay
  // silent in the steady window, so the split has to be regular.
  if (args->commSize > args->agents || args->agents % args->commSize != 0) {
    *error = "--comm-size " + std::to_string(args->commSize) + " must divide --agents " +
             std::to_string(args->agents);
    return false;
  }
  if (args->rate * static_cast<double>(args->tickMs) / 1000.0 > wire::kMaxRecordsPerFrame) {
    *error = "--rate x --tick-ms is over " + std::to_string(wire::kMaxRecordsPerFrame) +
             " calls per frame";
    return false;
  }
  return true;
}

// What /proc says about the collector process.
struct ProcSample {
  bool ok = false;
  double cpuSeconds = 0;  // utime + stime
  long rssKiB = 0;
  long hwmKiB = 0;
};

ProcSample sampleProcess(pid_t pid) {
  ProcSample sample;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // The command name may hold spaces and parentheses: fields are counted after the last ')'.
  size_t close = text.rfind(')');
  if (close == std::string::npos) return sample;
  std::istringstream fields(text.substr(close + 1));
  std::vector<std::string> words;
  for (std::string word; fields >> word;) words.push_back(word);
  if (words.size() < 13) return sample;  // words[0] is field 3 (state); utime is field 14
  double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  sample.cpuSeconds = (std::stod(words[11]) + std::stod(words[12])) / ticks;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) sample.rssKiB = std::atol(line.c_str() + 6);
    if (line.rfind("VmHWM:", 0) == 0) sample.hwmKiB = std::atol(line.c_str() + 6);
  }
  sample.ok = true;
  return sample;
}

double ownCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Bytes the kernel holds for the collector that it has not read yet, over its established
// connections (each socket's receive queue): the backlog that our own queues cannot see. Asked
// over sock_diag netlink, which answers for thousands of sockets in a few ms, where reading
// /proc/net/tcp takes tens of ms and would stall the ticks.
uint64_t collectorUnreadBytes(int port) {
  int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return 0;
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  message.header.nlmsg_len = sizeof message;
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  message.request.sdiag_family = AF_INET;
  message.request.sdiag_protocol = IPPROTO_TCP;
  message.request.idiag_states = 1u << TCP_ESTABLISHED;
  uint64_t total = 0;
  if (send(fd, &message, sizeof message, 0) == static_cast<ssize_t>(sizeof message)) {
    alignas(nlmsghdr) char buffer[65536];
    bool done = false;
    while (!done) {
      ssize_t got = recv(fd, buffer, sizeof buffer, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      int left = static_cast<int>(got);
      for (auto* h = reinterpret_cast<nlmsghdr*>(buffer); NLMSG_OK(h, left);
           h = NLMSG_NEXT(h, left)) {
        if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
          done = true;
          break;
        }
        const auto* socketInfo = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
        if (ntohs(socketInfo->id.idiag_sport) == port) total += socketInfo->idiag_rqueue;
      }
    }
  }
  close(fd);
  return total;
}

// The whole machine's CPU time (/proc/stat), to tell a saturated machine from a slow collector.
// Softirq is shown apart: on loopback the kernel's TCP work for both ends runs there, charged to
// whichever process it interrupted (mostly the generator, whose sends deliver the segments).
struct MachineCpu {
  double busy = 0;     // seconds, every kind but idle and iowait
  double softirq = 0;  // seconds
  double niced = 0;    // seconds of niced processes: other work sharing the machine
};

MachineCpu machineCpu() {
  MachineCpu cpu;
  std::ifstream stat("/proc/stat");
  std::string name;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  stat >> name >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  cpu.busy = (user + nice + system + irq + softirq + steal) / ticks;
  cpu.softirq = softirq / ticks;
  cpu.niced = nice / ticks;
  return cpu;
}

// Splits what a pipe delivers into lines.
struct LineReader {
  int fd = -1;
  bool open = true;
  std::string partial;

  // Appends the complete lines read so far to `lines`; false once the pipe is at its end.
  bool drain(std::vector<std::string>* lines) {
    char buffer[4096];
    for (;;) {
      ssize_t got = read(fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) break;  // EAGAIN: all read for now
      if (got == 0) {
        if (!partial.empty()) lines->push_back(std::move(partial));
        partial.clear();
        open = false;
        break;
      }
      partial.append(buffer, static_cast<size_t>(got));
    }
    for (size_t newline; (newline = partial.find('\n')) != std::string::npos;) {
      lines->push_back(partial.substr(0, newline));
      partial.erase(0, newline + 1);
    }
    return open;
  }
};

// "[ncclwatch] KIND ..." with KIND in capitals: the first line of a verdict as the collector
// prints it (analysis::printVerdictText).
bool isVerdictHeader(const std::string& line) {
  const std::string prefix = "[ncclwatch] ";
  if (line.rfind(prefix, 0) != 0) return false;
  size_t i = prefix.size();
  while (i < line.size() && ((line[i] >= 'A' && line[i] <= 'Z') || line[i] == '_')) ++i;
  return i > prefix.size() && (i == line.size() || line[i] == ' ');
}

// One simulated rank: its connection and the state its interposer would keep.
struct Agent {
  int fd = -1;
  int rank = 0;
  uint64_t tpHash = 0;
  uint64_t ringIndex = 0;
  uint64_t worldRolling = trace::kRollingSeed;
  uint64_t tpRolling = trace::kRollingSeed;
  // Bytes the socket would not take yet, from `head`; `frameEnds` are stream positions (counted
  // in `flushed`) at which a queued frame is completely written, with its record count.
  std::vector<std::byte> queue;
  size_t head = 0;
  uint64_t appended = 0;
  uint64_t flushed = 0;
  std::deque<std::pair<uint64_t, uint32_t>> frameEnds;
  bool writeWatched = false;
  // The connection's delta bases (docs/protocol.md, RECORDS): a RECORDS frame once encoded must
  // reach the collector, so records are encoded only when the queue can take their frame.
  wire::RecordEncoder encoder;
};

struct Counters {
  uint64_t calls = 0;  // calls the agents made (offered load), dropped ones included
  uint64_t framesSent = 0;
  uint64_t recordsSent = 0;
  uint64_t bytesSent = 0;
  uint64_t framesDropped = 0;
  uint64_t recordsDropped = 0;
  uint64_t queuedBytes = 0;  // all connections' backlog in the generator now
  uint64_t maxQueuedBytes = 0;
  uint64_t bytesFromCollector = 0;  // DUMP/ABORT frames the collector sent
  uint64_t closedByCollector = 0;
  int64_t maxTickLateNs = 0;
  uint64_t lateTicks = 0;  // ticks that began more than a tick late: the generator lagged
  uint64_t ticks = 0;
  uint64_t tickNs = 0;  // time spent building and sending all agents' frames
  int64_t maxTickNs = 0;
};

struct Sample {
  double at = 0;  // seconds since the steady window began
  ProcSample collector;
  double ownCpu = 0;
  MachineCpu machine;
  uint64_t queuedBytes = 0;
  uint64_t unreadBytes = 0;
  Counters counters;
};

class LoadGenerator {
 public:
  explicit LoadGenerator(const Args& args) : args_(args) {}
  ~LoadGenerator();
  int run();

 private:
  bool startCollector(std::string* error);
  bool connectAgents(std::string* error);
  void greet(Agent& agent);
  void tick(int64_t now, uint64_t calls);
  void sendFrame(Agent& agent, uint32_t records);
  void flush(Agent& agent);
  void watchWrites(Agent& agent, bool on);
  void closeAgent(Agent& agent);
  void pump(int64_t untilNs);
  void handleLines(bool fromStdout, int64_t now);
  Sample takeSample(int64_t steadyStart) const;
  void stopCollector();
  void printReport(const std::vector<Sample>& samples, int64_t steadyNs) const;

  Args args_;
  std::string workDir_;
  std::string secret_;
  long finalHwmKiB_ = 0;
  pid_t child_ = -1;
  int childStatus_ = 0;
  bool childExited_ = false;
  bool collectorDiedEarly_ = false;
  int port_ = 0;
  LineReader out_, err_;
  std::string stderrText_;
  int epoll_ = -1;
  std::vector<Agent> agents_;
  Counters counters_;
  std::vector<std::byte> frame_;
  std::vector<CallRecord> records_;

  uint64_t worldHash_ = 0;
  uint64_t callsMade_ = 0;  // per agent, identical for all
  uint64_t worldCalls_ = 0;
  uint64_t tpCalls_ = 0;
  int64_t lastTickNs_ = 0;
  double connectSeconds_ = 0;

  // Phase 2: one agent issues a mismatched world allreduce.
  int culprit_ = 17;
  bool injectMismatch_ = false;
  int64_t mismatchSentNs_ = 0;
  bool mismatchQueued_ = false;
  int64_t verdictNs_ = 0;
  std::string verdictLine_;
  long collectorSaysMs_ = -1;
  std::vector<std::string> earlyVerdicts_;  // verdicts before the mismatch: false positives
};

LoadGenerator::~LoadGenerator() {
  for (Agent& agent : agents_) {
    if (agent.fd >= 0) close(agent.fd);
  }
  if (epoll_ >= 0) close(epoll_);
  if (out_.fd >= 0) close(out_.fd);
  if (err_.fd >= 0) close(err_.fd);
  if (child_ > 0 && !childExited_) {
    kill(child_, SIGKILL);
    waitpid(child_, nullptr, 0);
  }
  if (!workDir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(workDir_, ignored);
  }
}

bool LoadGenerator::startCollector(std::string* error) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/nw-load.XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    *error = "cannot create a temporary folder: " + std::string(std::strerror(errno));
    return false;
  }
  workDir_ = pattern;
  std::random_device device;
  std::string secret;
  for (int i = 0; i < 32; ++i) secret += "0123456789abcdef"[device() % 16];
  secret_ = secret;
  std::string secretFile = workDir_ + "/secret";
  {
    std::ofstream file(secretFile);
    file << secret << "\n";
    if (!file) {
      *error = "cannot write " + secretFile;
      return false;
    }
  }
  int outPipe[2], errPipe[2];
  if (pipe2(outPipe, O_CLOEXEC) != 0 || pipe2(errPipe, O_CLOEXEC) != 0) {
    *error = "pipe: " + std::string(std::strerror(errno));
    return false;
  }
  std::string logDir = workDir_ + "/logs";
  std::vector<std::string> words = {args_.cli,       "collect",  "--listen", "127.0.0.1:0",
                                    "--secret-file", secretFile, "--dir",    logDir};
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  pid_t parent = getpid();
  child_ = fork();
  if (child_ < 0) {
    *error = "fork: " + std::string(std::strerror(errno));
    return false;
  }
  if (child_ == 0) {
    // A generator that dies must not leave a collector behind.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    dup2(outPipe[1], STDOUT_FILENO);
    dup2(errPipe[1], STDERR_FILENO);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  close(outPipe[1]);
  close(errPipe[1]);
  out_.fd = outPipe[0];
  err_.fd = errPipe[0];
  fcntl(out_.fd, F_SETFL, O_NONBLOCK);
  fcntl(err_.fd, F_SETFL, O_NONBLOCK);

  int64_t deadline = monotonicNs() + kStartDeadlineNs;
  const std::string marker = "[ncclwatch] collector listening on port ";
  while (port_ == 0) {
    int64_t left = deadline - monotonicNs();
    if (left <= 0 || !out_.open) break;
    pollfd fds[2] = {{out_.fd, POLLIN, 0}, {err_.fd, POLLIN, 0}};
    poll(fds, err_.open ? 2 : 1, static_cast<int>(left / 1'000'000) + 1);
    std::vector<std::string> lines;
    out_.drain(&lines);
    for (const std::string& line : lines) {
      if (line.rfind(marker, 0) == 0) port_ = std::atoi(line.c_str() + marker.size());
    }
    lines.clear();
    if (err_.open) err_.drain(&lines);
    for (const std::string& line : lines) stderrText_ += line + "\n";
  }
  if (port_ <= 0) {
    std::string said = stderrText_;
    while (!said.empty() && said.back() == '\n') said.pop_back();
    std::replace(said.begin(), said.end(), '\n', ' ');
    *error = "the collector did not start" + (said.empty() ? std::string() : ": " + said);
    return false;
  }
  return true;
}

void LoadGenerator::greet(Agent& agent) {
  int i = agent.rank;
  int world = static_cast<int>(args_.agents);
  int size = static_cast<int>(args_.commSize);
  int64_t now = monotonicNs();
  frame_.clear();
  wire::Hello hello{};
  std::snprintf(hello.secret, sizeof hello.secret, "%s", secret_.c_str());
  hello.pid = 100000 + i;
  hello.rank = i;
  hello.world = world;
  hello.localRank = i % 8;
  std::snprintf(hello.host, sizeof hello.host, "loadgen");
  std::snprintf(hello.jobId, sizeof hello.jobId, "loadgen");
  // Real clock anchors, as an agent reads them when its trace opens: the collector maps record
  // times to wall time with them, so its time-based checks and its "reported N ms after" see
  // the calls as recent.
  hello.anchorMonotonicNs = now;
  hello.anchorRealtimeNs = realtimeNs();
  wire::encodeHello(hello, frame_);
  sendFrame(agent, 0);

  // The world communicator from ncclCommInitRank, and its tensor-parallel child from
  // ncclCommSplit(world, color = rank / size, key = rank), the first split of the parent.
  trace::CommInfo comms[2] = {};
  comms[0].commHash = worldHash_;
  comms[0].commPointer = 0x7f0000100000ull + static_cast<uint64_t>(i) * 0x1000;
  comms[0].createdNs = now;
  comms[0].nranks = world;
  comms[0].rank = i;
  comms[0].device = i % 8;
  comms[0].color = -1;
  comms[0].kind = static_cast<uint8_t>(OpKind::kInit);
  comms[1] = comms[0];
  comms[1].commHash = agent.tpHash;
  comms[1].parentHash = worldHash_;
  comms[1].commPointer += 0x800;
  comms[1].nranks = size;
  comms[1].rank = i % size;
  comms[1].color = i / size;
  comms[1].splitIndex = 1;
  comms[1].kind = static_cast<uint8_t>(OpKind::kSplit);
  frame_.clear();
  wire::encodeComms(comms, frame_);
  sendFrame(agent, 0);

  // The lifecycle records the interposer writes for those: init (outside the sequence), the
  // split on the parent (its first sequenced operation), the child's init.
  CallRecord base{};
  base.threadId = 100000 + i;
  base.rootOrPeer = -1;
  base.state = trace::RecordState::kCompleted;
  base.flags = trace::kRecordNoEvents;  // host-synchronous calls have no completion events
  base.slotVersion = 2;
  CallRecord init = base;
  init.commHash = worldHash_;
  init.op = OpKind::kInit;
  init.count = static_cast<uint64_t>(world);
  init.rootOrPeer = i;
  init.issueNs = init.startNs = now - 2'000'000;
  init.completeNs = now - 1'500'000;
  init.ringIndex = agent.ringIndex++;
  CallRecord split = base;
  split.commHash = worldHash_;
  split.op = OpKind::kSplit;
  split.seq = 1;
  split.rootOrPeer = i / size;
  split.issueNs = split.startNs = now - 1'000'000;
  split.completeNs = now - 600'000;
  split.ringIndex = agent.ringIndex++;
  CallRecord childInit = base;
  childInit.commHash = agent.tpHash;
  childInit.op = OpKind::kInit;
  childInit.count = static_cast<uint64_t>(size);
  childInit.rootOrPeer = i % size;
  childInit.issueNs = childInit.startNs = now - 500'000;
  childInit.completeNs = now - 400'000;
  childInit.ringIndex = agent.ringIndex++;
  CallRecord lifecycle[3] = {init, split, childInit};
  frame_.clear();
  wire::encodeRecords(monotonicNs(), lifecycle, agent.encoder, frame_);
  sendFrame(agent, 3);
}

bool LoadGenerator::connectAgents(std::string* error) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port_));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int64_t started = monotonicNs();
  int64_t deadline = started + kConnectDeadlineNs;
  size_t total = agents_.size();
  // Batches far below the listen backlog, each completed before the next: a full backlog drops
  // SYNs, and the kernel would retry them only after a second.
  for (size_t first = 0; first < total; first += kConnectBatch) {
    std::vector<size_t> todo;
    for (size_t i = first; i < std::min(total, first + kConnectBatch); ++i) todo.push_back(i);
    while (!todo.empty()) {
      if (monotonicNs() > deadline || g_interrupted) {
        *error = "connected only " + std::to_string(first) + " of " + std::to_string(total) +
                 " agents in " + std::to_string(kConnectDeadlineNs / 1'000'000'000) + " s";
        return false;
      }
      std::vector<size_t> retry;
      std::vector<pollfd> fds;
      std::vector<size_t> who;
      for (size_t index : todo) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
          *error = "socket: " + std::string(std::strerror(errno)) + " after " +
                   std::to_string(index) + " agents";
          return false;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // as the agents do
        if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 ||
            errno == EINPROGRESS) {
          fds.push_back({fd, POLLOUT, 0});
          who.push_back(index);
        } else {
          close(fd);  // EAGAIN, ECONNREFUSED: the collector is busy; again shortly
          retry.push_back(index);
        }
      }
      // Wait for this batch's connections to finish, five seconds at most.
      int64_t batchDeadline = monotonicNs() + 5'000'000'000;
      for (;;) {
        std::vector<pollfd> waiting;
        for (const pollfd& p : fds) {
          if (p.revents == 0) waiting.push_back(p);
        }
        int64_t left = batchDeadline - monotonicNs();
        if (waiting.empty() || left <= 0) break;
        if (poll(waiting.data(), waiting.size(), static_cast<int>(left / 1'000'000) + 1) <= 0) {
          continue;
        }
        size_t next = 0;
        for (pollfd& p : fds) {
          if (p.revents == 0 && next < waiting.size() && waiting[next].fd == p.fd) {
            p.revents = waiting[next++].revents;
          }
        }
      }
      for (size_t k = 0; k < fds.size(); ++k) {
        int soError = 0;
        socklen_t length = sizeof soError;
        if (fds[k].revents != 0 &&
            getsockopt(fds[k].fd, SOL_SOCKET, SO_ERROR, &soError, &length) == 0 && soError == 0) {
          Agent& agent = agents_[who[k]];
          agent.fd = fds[k].fd;
          epoll_event event{};
          event.events = EPOLLIN;
          event.data.u64 = who[k];
          epoll_ctl(epoll_, EPOLL_CTL_ADD, agent.fd, &event);
          greet(agent);
        } else {
          close(fds[k].fd);
          retry.push_back(who[k]);
        }
      }
      if (!retry.empty()) usleep(50'000);
      todo = std::move(retry);
    }
  }
  connectSeconds_ = static_cast<double>(monotonicNs() - started) / 1e9;
  return true;
}

void LoadGenerator::watchWrites(Agent& agent, bool on) {
  if (agent.writeWatched == on || agent.fd < 0) return;
  epoll_event event{};
  event.events = on ? EPOLLIN | EPOLLOUT : EPOLLIN;
  event.data.u64 = static_cast<uint64_t>(&agent - agents_.data());
  epoll_ctl(epoll_, EPOLL_CTL_MOD, agent.fd, &event);
  agent.writeWatched = on;
}

void LoadGenerator::closeAgent(Agent& agent) {
  if (agent.fd < 0) return;
  epoll_ctl(epoll_, EPOLL_CTL_DEL, agent.fd, nullptr);
  close(agent.fd);
  agent.fd = -1;
  counters_.closedByCollector++;
  counters_.queuedBytes -= agent.queue.size() - agent.head;
  agent.queue.clear();
  agent.head = 0;
  agent.frameEnds.clear();
}

// Sends `frame_` on the agent's connection, or queues what the socket does not take.
void LoadGenerator::sendFrame(Agent& agent, uint32_t records) {
  size_t size = frame_.size();
  if (agent.fd < 0) {
    counters_.framesDropped++;
    counters_.recordsDropped += records;
    return;
  }
  size_t sent = 0;
  if (agent.head == agent.queue.size()) {
    ssize_t n = send(agent.fd, frame_.data(), size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      closeAgent(agent);
      counters_.framesDropped++;
      counters_.recordsDropped += records;
      return;
    }
    sent = n > 0 ? static_cast<size_t>(n) : 0;
    counters_.bytesSent += sent;
    if (sent == size) {
      counters_.framesSent++;
      counters_.recordsSent += records;
      return;
    }
    // The rest of a frame already begun must follow whatever the bound says, or the stream
    // would be corrupt.
  } else if (agent.queue.size() - agent.head + size > kMaxQueuedBytes) {
    counters_.framesDropped++;
    counters_.recordsDropped += records;
    return;
  }
  if (agent.head > 0 && agent.head * 2 >= agent.queue.size()) {
    agent.queue.erase(agent.queue.begin(),
                      agent.queue.begin() + static_cast<std::ptrdiff_t>(agent.head));
    agent.head = 0;
  }
  agent.queue.insert(agent.queue.end(), frame_.begin() + static_cast<std::ptrdiff_t>(sent),
                     frame_.end());
  agent.appended += size - sent;
  agent.frameEnds.emplace_back(agent.appended, records);
  counters_.queuedBytes += size - sent;
  counters_.maxQueuedBytes = std::max(counters_.maxQueuedBytes, counters_.queuedBytes);
  watchWrites(agent, true);
}

void LoadGenerator::flush(Agent& agent) {
  while (agent.fd >= 0 && agent.head < agent.queue.size()) {
    ssize_t n = send(agent.fd, agent.queue.data() + agent.head, agent.queue.size() - agent.head,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      closeAgent(agent);
      return;
    }
    size_t taken = static_cast<size_t>(n);
    agent.head += taken;
    agent.flushed += taken;
    counters_.bytesSent += taken;
    counters_.queuedBytes -= taken;
    while (!agent.frameEnds.empty() && agent.frameEnds.front().first <= agent.flushed) {
      counters_.framesSent++;
      counters_.recordsSent += agent.frameEnds.front().second;
      agent.frameEnds.pop_front();
    }
  }
  if (agent.head == agent.queue.size()) {
    agent.queue.clear();
    agent.head = 0;
    watchWrites(agent, false);
  }
}

// One poll interval of every agent: the calls it made since the last tick, in one frame.
void LoadGenerator::tick(int64_t now, uint64_t calls) {
  int64_t from = lastTickNs_;
  int64_t span = std::max<int64_t>(now - from, 1);
  lastTickNs_ = now;
  // Layer sizes of a tensor-parallel model's per-layer allreduces, and one data-parallel
  // gradient bucket: the same sequence on every rank.
  static constexpr uint64_t kTpCounts[] = {4u << 20, 4u << 20, 16u << 20, 1u << 20};
  constexpr uint64_t kWorldCount = 25u << 20;
  // Calls alternate tensor-parallel (even) and world (odd), the same on every agent.
  uint64_t worldBase = worldCalls_, tpBase = tpCalls_;
  uint64_t worldInTick = (callsMade_ + calls) / 2 - callsMade_ / 2;
  for (Agent& agent : agents_) {
    records_.clear();
    uint64_t worldDone = 0, tpDone = 0;
    // Ranks reach a collective a little apart.
    int64_t skew = (agent.rank % 64) * 1000;
    for (uint64_t k = 0; k < calls; ++k) {
      uint64_t call = callsMade_ + k;
      bool world = call % 2 == 1;
      CallRecord r{};
      r.op = OpKind::kAllReduce;
      r.dtype = kBfloat16;
      r.redop = kSum;
      r.rootOrPeer = -1;
      r.threadId = 100000 + agent.rank;
      r.state = trace::RecordState::kCompleted;
      r.slotVersion = 2;
      r.ringIndex = agent.ringIndex++;
      int64_t interval = span / static_cast<int64_t>(calls);
      r.issueNs = from + static_cast<int64_t>(k) * interval + std::min<int64_t>(skew, interval / 4);
      r.startNs = r.issueNs + std::min<int64_t>(5000, interval / 4);
      r.completeNs = std::min(r.issueNs + interval / 2, now - 1);
      if (world) {
        uint64_t ordinal = worldBase + worldDone++;
        r.commHash = worldHash_;
        r.seq = ordinal + 2;  // the split was the world's first sequenced operation
        r.ncclSeqNumber = ordinal;
        r.count = kWorldCount;
        r.stream = 0x5600000a0000ull + static_cast<uint64_t>(agent.rank % 8) * 0x100;
        r.callSite = 0x55555555a000ull;
        if (injectMismatch_ && agent.rank == culprit_ && worldDone == 1) r.count = kWorldCount / 2;
        r.fingerprint = trace::fingerprint({r.op, r.count, r.dtype, r.redop, r.rootOrPeer});
        agent.worldRolling = trace::rollingHash(agent.worldRolling, r.fingerprint);
        r.rollingHash = agent.worldRolling;
      } else {
        uint64_t ordinal = tpBase + tpDone++;
        r.commHash = agent.tpHash;
        r.seq = ordinal + 1;
        r.ncclSeqNumber = ordinal;
        r.count = kTpCounts[ordinal % 4];
        r.stream = 0x5600000b0000ull + static_cast<uint64_t>(agent.rank % 8) * 0x100;
        r.callSite = 0x555555559000ull + (ordinal % 4) * 0x40;
        r.fingerprint = trace::fingerprint({r.op, r.count, r.dtype, r.redop, r.rootOrPeer});
        agent.tpRolling = trace::rollingHash(agent.tpRolling, r.fingerprint);
        r.rollingHash = agent.tpRolling;
      }
      records_.push_back(r);
    }
    // A frame that would not fit the queue is not encoded at all (its records are lost, as a
    // real agent's would wait in its ring): the encoder's bases stay those the collector has.
    size_t bound = sizeof(wire::FrameHeader) + 8 + records_.size() * wire::kMaxRecordBytes;
    if (agent.fd < 0 || (agent.head < agent.queue.size() &&
                         agent.queue.size() - agent.head + bound > kMaxQueuedBytes)) {
      counters_.framesDropped++;
      counters_.recordsDropped += records_.size();
      counters_.calls += calls;
      continue;
    }
    frame_.clear();
    wire::encodeRecords(monotonicNs(), records_, agent.encoder, frame_);
    bool carriesMismatch = injectMismatch_ && agent.rank == culprit_ && worldDone > 0;
    bool wasQueued = agent.head < agent.queue.size();
    sendFrame(agent, static_cast<uint32_t>(records_.size()));
    if (carriesMismatch) {
      mismatchSentNs_ = monotonicNs();
      mismatchQueued_ = wasQueued;
      injectMismatch_ = false;
    }
    counters_.calls += calls;
  }
  callsMade_ += calls;
  worldCalls_ = worldBase + worldInTick;
  tpCalls_ = tpBase + (calls - worldInTick);
}

void LoadGenerator::handleLines(bool fromStdout, int64_t now) {
  std::vector<std::string> lines;
  LineReader& reader = fromStdout ? out_ : err_;
  if (!reader.open) return;
  reader.drain(&lines);
  for (const std::string& line : lines) {
    // Verdicts are printed on stderr (as for a launcher); the port line comes on stdout.
    bool verdictText =
        line.rfind("[ncclwatch] MISMATCH", 0) == 0 || line.find("(reported ") != std::string::npos;
    if (!fromStdout && !verdictText) {
      if (stderrText_.size() < kMaxStderrBytes) stderrText_ += line + "\n";
      continue;
    }
    if (mismatchSentNs_ > 0 && verdictNs_ == 0 && line.rfind("[ncclwatch] MISMATCH", 0) == 0) {
      verdictNs_ = now;
      verdictLine_ = line;
      continue;
    }
    if (verdictNs_ > 0 && collectorSaysMs_ < 0) {
      size_t at = line.find("(reported ");
      if (at != std::string::npos) collectorSaysMs_ = std::atol(line.c_str() + at + 10);
    }
    if (mismatchSentNs_ == 0 && isVerdictHeader(line)) earlyVerdicts_.push_back(line);
  }
}

// Handles sockets and the collector's output until `untilNs`.
void LoadGenerator::pump(int64_t untilNs) {
  epoll_event events[256];
  for (;;) {
    int64_t now = monotonicNs();
    int timeoutMs = now >= untilNs ? 0 : static_cast<int>((untilNs - now + 999'999) / 1'000'000);
    int ready = epoll_wait(epoll_, events, 256, timeoutMs);
    now = monotonicNs();
    for (int e = 0; e < ready; ++e) {
      uint64_t tag = events[e].data.u64;
      if (tag == kEpollStdout || tag == kEpollStderr) {
        handleLines(tag == kEpollStdout, now);
        LineReader& reader = tag == kEpollStdout ? out_ : err_;
        if (!reader.open) epoll_ctl(epoll_, EPOLL_CTL_DEL, reader.fd, nullptr);
        continue;
      }
      Agent& agent = agents_[tag];
      if (agent.fd < 0) continue;
      if (events[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        // The collector's DUMP requests: a load generator has nothing to dump.
        char buffer[4096];
        for (;;) {
          ssize_t got = recv(agent.fd, buffer, sizeof buffer, MSG_DONTWAIT);
          if (got > 0) {
            counters_.bytesFromCollector += static_cast<uint64_t>(got);
            continue;
          }
          if (got < 0 && errno == EINTR) continue;
          if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) closeAgent(agent);
          break;
        }
      }
      if (agent.fd >= 0 && (events[e].events & EPOLLOUT)) flush(agent);
    }
    if (monotonicNs() >= untilNs || g_interrupted) return;
  }
}

Sample LoadGenerator::takeSample(int64_t steadyStart) const {
  Sample sample;
  sample.at = static_cast<double>(monotonicNs() - steadyStart) / 1e9;
  sample.collector = sampleProcess(child_);
  sample.ownCpu = ownCpuSeconds();
  sample.machine = machineCpu();
  sample.queuedBytes = counters_.queuedBytes;
  sample.unreadBytes = collectorUnreadBytes(port_);
  sample.counters = counters_;
  return sample;
}

void LoadGenerator::stopCollector() {
  if (child_ <= 0 || childExited_) return;
  kill(child_, SIGTERM);
  int64_t deadline = monotonicNs() + kStopDeadlineNs;
  bool killed = false;
  for (;;) {
    pid_t done = waitpid(child_, &childStatus_, WNOHANG);
    if (done == child_) {
      childExited_ = true;
      break;
    }
    if (!killed && monotonicNs() > deadline) {
      std::printf("collector still running %lld s after SIGTERM: SIGKILL\n",
                  static_cast<long long>(kStopDeadlineNs / 1'000'000'000));
      kill(child_, SIGKILL);
      killed = true;
    }
    pollfd fds[2] = {{out_.open ? out_.fd : -1, POLLIN, 0}, {err_.open ? err_.fd : -1, POLLIN, 0}};
    poll(fds, 2, 50);
    handleLines(true, monotonicNs());
    handleLines(false, monotonicNs());
  }
  // What it printed while stopping (its stats line).
  for (int i = 0; i < 20 && (out_.open || err_.open); ++i) {
    pollfd fds[2] = {{out_.open ? out_.fd : -1, POLLIN, 0}, {err_.open ? err_.fd : -1, POLLIN, 0}};
    poll(fds, 2, 50);
    handleLines(true, monotonicNs());
    handleLines(false, monotonicNs());
  }
}

std::string statusText(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

void LoadGenerator::printReport(const std::vector<Sample>& samples, int64_t steadyNs) const {
  if (samples.size() < 2) return;
  const Sample& first = samples.front();
  const Sample& last = samples.back();
  double wall = last.at - first.at;
  if (wall <= 0) wall = static_cast<double>(steadyNs) / 1e9;
  auto rate = [&](uint64_t Counters::*field) {
    return static_cast<double>(last.counters.*field - first.counters.*field) / wall;
  };
  double collectorCpu = last.collector.cpuSeconds - first.collector.cpuSeconds;
  double ownCpu = last.ownCpu - first.ownCpu;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);

  std::printf("\nsteady window (%.1f s), sampled:\n", wall);
  std::printf("  %6s  %15s  %9s  %15s  %16s  %11s  %s\n", "t (s)", "collector cores", "RSS MiB",
              "generator cores", "backlog MiB (*)", "frames lost", "records sent");
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    std::string collector = "-", own = "-";
    if (i > 0) {
      double dt = s.at - samples[i - 1].at;
      char text[32];
      std::snprintf(text, sizeof text, "%.2f",
                    (s.collector.cpuSeconds - samples[i - 1].collector.cpuSeconds) / dt);
      collector = text;
      std::snprintf(text, sizeof text, "%.2f", (s.ownCpu - samples[i - 1].ownCpu) / dt);
      own = text;
    }
    std::printf("  %6.1f  %15s  %9.1f  %15s  %7.1f + %6.1f  %11llu  %llu\n", s.at,
                collector.c_str(), static_cast<double>(s.collector.rssKiB) / 1024.0, own.c_str(),
                mib(static_cast<double>(s.queuedBytes)), mib(static_cast<double>(s.unreadBytes)),
                static_cast<unsigned long long>(s.counters.framesDropped),
                static_cast<unsigned long long>(s.counters.recordsSent));
  }
  std::printf(
      "  (*) queued in the generator + sent but not yet read by the collector (kernel buffers)\n");

  std::printf("\n%-28s %ld (comm size %ld: %ld tensor-parallel comms + 1 world comm)\n", "agents",
              args_.agents, args_.commSize, args_.agents / args_.commSize);
  std::printf("%-28s %.0f (%.0f per agent, frame every %ld ms)\n", "calls/s offered",
              rate(&Counters::calls), args_.rate, args_.tickMs);
  std::printf("%-28s %.0f\n", "records/s sent", rate(&Counters::recordsSent));
  std::printf("%-28s %.0f (%.1f MiB/s)\n", "frames/s sent", rate(&Counters::framesSent),
              mib(rate(&Counters::bytesSent)));
  double records = rate(&Counters::recordsSent);
  std::printf("%-28s %.1f (frame headers included; a CallRecord is %zu)\n", "wire bytes per record",
              records > 0 ? rate(&Counters::bytesSent) / records : 0.0, sizeof(CallRecord));
  std::printf("%-28s %.2f (%.1f s CPU over %.1f s)\n", "collector CPU, cores", collectorCpu / wall,
              collectorCpu, wall);
  std::string rssText;
  for (const Sample& s : samples) {
    char text[48];
    std::snprintf(text, sizeof text, "%s%.0f MiB @%.0fs", rssText.empty() ? "" : ", ",
                  static_cast<double>(s.collector.rssKiB) / 1024.0, s.at);
    rssText += text;
  }
  std::printf("%-28s %s\n", "collector RSS", rssText.c_str());
  std::printf("%-28s %.0f MiB (VmHWM, whole run)\n", "collector peak RSS",
              static_cast<double>(finalHwmKiB_) / 1024.0);
  std::printf("%-28s %.2f cores of %ld (ticks up to %.1f ms late)\n", "generator CPU",
              ownCpu / wall, cores, static_cast<double>(counters_.maxTickLateNs) / 1e6);
  uint64_t ticks = last.counters.ticks - first.counters.ticks;
  if (ticks > 0) {
    std::printf("%-28s %.1f ms on average, %.1f ms at most, to send all agents' frames of a tick\n",
                "",
                static_cast<double>(last.counters.tickNs - first.counters.tickNs) / 1e6 /
                    static_cast<double>(ticks),
                static_cast<double>(counters_.maxTickNs) / 1e6);
  }
  double busy = last.machine.busy - first.machine.busy;
  std::printf("%-28s %.2f of %ld cores busy (of which softirq %.2f, niced processes %.2f)\n",
              "machine CPU", busy / wall, cores,
              (last.machine.softirq - first.machine.softirq) / wall,
              (last.machine.niced - first.machine.niced) / wall);
  uint64_t lateTicks = last.counters.lateTicks - first.counters.lateTicks;
  if (lateTicks > 0) {
    std::printf("%-28s generator lagged: %llu ticks began over a tick late (machine saturated?)\n",
                "", static_cast<unsigned long long>(lateTicks));
  }
  uint64_t backlogStart = first.queuedBytes + first.unreadBytes;
  uint64_t backlogEnd = last.queuedBytes + last.unreadBytes;
  std::printf(
      "%-28s %.1f MiB at start, %.1f MiB at end, %.1f MiB queued at most, %llu frames "
      "dropped\n",
      "backlog", mib(static_cast<double>(backlogStart)), mib(static_cast<double>(backlogEnd)),
      mib(static_cast<double>(last.counters.maxQueuedBytes)),
      static_cast<unsigned long long>(last.counters.framesDropped - first.counters.framesDropped));
  // More than a tick of traffic left over and growing: the collector does not keep up.
  double bytesPerTick = rate(&Counters::bytesSent) * static_cast<double>(args_.tickMs) / 1000.0;
  if (last.counters.framesDropped > first.counters.framesDropped ||
      (backlogEnd > backlogStart && static_cast<double>(backlogEnd) > 2 * bytesPerTick)) {
    std::printf("%-28s collector fell behind\n", "");
  }
  if (counters_.bytesFromCollector > 0) {
    std::printf("%-28s %llu bytes of DUMP/ABORT requests from the collector\n", "",
                static_cast<unsigned long long>(counters_.bytesFromCollector));
  }
  if (counters_.closedByCollector > 0) {
    std::printf("%-28s %llu connections closed by the collector\n", "",
                static_cast<unsigned long long>(counters_.closedByCollector));
  }
  std::printf("%-28s %zu%s\n", "verdicts before mismatch", earlyVerdicts_.size(),
              earlyVerdicts_.empty() ? "" : " (false positives; first below)");
  for (size_t i = 0; i < earlyVerdicts_.size() && i < 5; ++i) {
    std::printf("%-28s %s\n", "", earlyVerdicts_[i].c_str());
  }
  if (mismatchSentNs_ == 0) {
    std::printf("%-28s not injected\n", "mismatch verdict latency");
  } else if (verdictNs_ > 0) {
    std::printf("%-28s %.0f ms after sending rank %d's frame%s", "mismatch verdict latency",
                static_cast<double>(verdictNs_ - mismatchSentNs_) / 1e6, culprit_,
                mismatchQueued_ ? " (it waited in the generator's queue)" : "");
    if (collectorSaysMs_ >= 0) {
      std::printf("; collector: %ld ms after the call", collectorSaysMs_);
    }
    std::printf("\n%-28s %s\n", "", verdictLine_.c_str());
  } else {
    std::printf("%-28s no verdict within %.0f s\n", "mismatch verdict latency", args_.verdictWait);
  }
}

int LoadGenerator::run() {
  std::string error;
  // One descriptor per agent on both sides; the collector inherits the raised limit.
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < static_cast<rlim_t>(args_.agents) + 64) {
    std::fprintf(stderr, "collector_load: RLIMIT_NOFILE %llu is too low for %ld agents\n",
                 static_cast<unsigned long long>(limit.rlim_cur), args_.agents);
    return 2;
  }
  uint8_t uniqueId[128];
  for (size_t i = 0; i < sizeof uniqueId; ++i) uniqueId[i] = static_cast<uint8_t>(i * 37 + 11);
  worldHash_ = trace::rootCommHash(uniqueId, sizeof uniqueId);
  if (args_.agents <= culprit_) culprit_ = static_cast<int>(args_.agents) - 1;

  if (!startCollector(&error)) {
    std::fprintf(stderr, "collector_load: %s\n", error.c_str());
    return 2;
  }
  std::printf("collector pid %d listening on port %d; %ld agents, %.0f calls/s each\n", child_,
              port_, args_.agents, args_.rate);
  std::fflush(stdout);
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  for (auto [reader, tag] : {std::pair{&out_, kEpollStdout}, std::pair{&err_, kEpollStderr}}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = tag;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, reader->fd, &event);
  }
  agents_.resize(static_cast<size_t>(args_.agents));
  for (size_t i = 0; i < agents_.size(); ++i) {
    agents_[i].rank = static_cast<int>(i);
    int color = static_cast<int>(i / static_cast<size_t>(args_.commSize));
    agents_[i].tpHash = trace::splitCommHash(worldHash_, 1, color);
  }
  if (!connectAgents(&error)) {
    std::fprintf(stderr, "collector_load: %s\n", error.c_str());
    return 2;
  }
  std::printf("connected %ld agents in %.2f s; warm-up %.0f s, steady %.0f s\n", args_.agents,
              connectSeconds_, args_.warmup, args_.seconds);
  std::fflush(stdout);

  // Ticks on an absolute schedule; a late tick carries the calls of the time it covers, so the
  // offered load stays what was asked whatever the generator's hiccups.
  const int64_t tickNs = args_.tickMs * 1'000'000;
  int64_t begin = monotonicNs();
  lastTickNs_ = begin;
  const int64_t steadyStart = begin + static_cast<int64_t>(args_.warmup * 1e9);
  const int64_t steadyEnd = steadyStart + static_cast<int64_t>(args_.seconds * 1e9);
  const int64_t verdictWaitNs = static_cast<int64_t>(args_.verdictWait * 1e9);
  // Six samples over the window (one a second at most), the last on its end: enough to see
  // whether RSS stays flat.
  const double sampleEvery = std::max(1.0, args_.seconds / 5);
  std::vector<int64_t> sampleTimes;
  for (double t = 0; t < args_.seconds - 0.05; t += sampleEvery) {
    sampleTimes.push_back(steadyStart + static_cast<int64_t>(t * 1e9));
  }
  sampleTimes.push_back(steadyEnd);
  std::vector<Sample> samples;
  uint64_t tickCount = 0;
  int64_t nextTick = begin + tickNs;
  auto callsDue = [&](uint64_t ticks) {
    return static_cast<uint64_t>(args_.rate * static_cast<double>(args_.tickMs) *
                                 static_cast<double>(ticks) / 1000.0);
  };
  enum class Phase { kWarmup, kSteady, kMismatch, kDone } phase = Phase::kWarmup;
  int64_t mismatchDeadline = 0;
  int64_t mismatchPhaseStart = 0;
  while (phase != Phase::kDone && !g_interrupted) {
    int64_t now = monotonicNs();
    if (phase == Phase::kWarmup && now >= steadyStart) phase = Phase::kSteady;
    if (phase == Phase::kSteady && samples.size() < sampleTimes.size() &&
        now >= sampleTimes[samples.size()]) {
      samples.push_back(takeSample(steadyStart));
    }
    if (phase == Phase::kSteady && samples.size() == sampleTimes.size()) {
      phase = Phase::kMismatch;
      injectMismatch_ = true;
      mismatchPhaseStart = now;
      std::printf("steady window done; rank %d now issues a mismatched world allreduce\n",
                  culprit_);
      std::fflush(stdout);
    }
    if (phase == Phase::kMismatch) {
      if (mismatchSentNs_ > 0 && mismatchDeadline == 0) {
        mismatchDeadline = mismatchSentNs_ + verdictWaitNs;
      }
      // Bounded even if no tick ever carries a world call (a very low --rate).
      if (verdictNs_ > 0 || (mismatchDeadline > 0 && now >= mismatchDeadline) ||
          now - mismatchPhaseStart > verdictWaitNs + 60'000'000'000) {
        phase = Phase::kDone;
        break;
      }
    }
    if (!out_.open) {  // the collector's stdout ended: it died
      collectorDiedEarly_ = true;
      break;
    }
    if (now >= nextTick) {
      // Behind schedule, ticks follow each other at once; sampling, phases and the sockets'
      // events still get their turn in between.
      counters_.maxTickLateNs = std::max(counters_.maxTickLateNs, now - nextTick);
      if (now - nextTick > tickNs) counters_.lateTicks++;
      ++tickCount;
      tick(now, callsDue(tickCount) - callsDue(tickCount - 1));
      int64_t took = monotonicNs() - now;
      counters_.ticks++;
      counters_.tickNs += static_cast<uint64_t>(took);
      counters_.maxTickNs = std::max(counters_.maxTickNs, took);
      nextTick += tickNs;
      pump(0);
      continue;
    }
    int64_t until = nextTick;
    if (phase == Phase::kSteady) until = std::min(until, sampleTimes[samples.size()]);
    if (phase == Phase::kWarmup) until = std::min(until, steadyStart);
    pump(until);
  }
  ProcSample final = sampleProcess(child_);
  finalHwmKiB_ = final.ok ? final.hwmKiB : (samples.empty() ? 0 : samples.back().collector.hwmKiB);
  if (collectorDiedEarly_) {
    waitpid(child_, &childStatus_, 0);
    childExited_ = true;
  }
  stopCollector();
  printReport(samples, static_cast<int64_t>(args_.seconds * 1e9));

  // The collector's own account of what it received.
  std::printf("%-28s %s\n", "collector ended with",
              childExited_ ? statusText(childStatus_).c_str() : "?");
  const std::string stats = "records=";
  size_t at = stderrText_.find("collector stats:");
  if (at != std::string::npos && stderrText_.find(stats, at) != std::string::npos) {
    unsigned long long received = std::strtoull(
        stderrText_.c_str() + stderrText_.find(stats, at) + stats.size(), nullptr, 10);
    unsigned long long sent = counters_.recordsSent;
    std::printf("%-28s collector received %llu of %llu records sent (%.2f%%)\n", "records",
                received, sent,
                sent > 0 ? 100.0 * static_cast<double>(received) / static_cast<double>(sent) : 0);
  } else {
    std::printf("%-28s %llu sent; the collector printed no stats line\n", "records",
                static_cast<unsigned long long>(counters_.recordsSent));
  }
  std::string tail = stderrText_;
  std::vector<std::string> lines;
  std::istringstream split(tail);
  for (std::string line; std::getline(split, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  std::printf("collector stderr (%zu lines%s):\n", lines.size(),
              lines.size() > 20 ? ", last 20" : "");
  for (size_t i = lines.size() > 20 ? lines.size() - 20 : 0; i < lines.size(); ++i) {
    std::printf("  %s\n", lines[i].c_str());
  }
  if (collectorDiedEarly_) {
    std::fprintf(stderr, "collector_load: the collector died during the run (%s)\n",
                 statusText(childStatus_).c_str());
    return 1;
  }
  return g_interrupted ? 130 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  std::string error;
  if (!parseArgs(argc, argv, &args, &error)) {
    if (error.empty()) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "collector_load: %s (--help for usage)\n", error.c_str());
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  struct sigaction interrupt {};
  interrupt.sa_handler = [](int) { g_interrupted = 1; };
  sigaction(SIGINT, &interrupt, nullptr);
  sigaction(SIGTERM, &interrupt, nullptr);
  LoadGenerator generator(args);
  return generator.run();
}
