// Measuring for collector_load: the collector process (start, its output, stop), /proc and
// sock_diag samples, and the report.
#include "bench/collector_load.h"

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
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "trace/fingerprint.h"
#include "trace/identity.h"
#include "trace/wire.h"

namespace ncclwatch::bench::collector_load {

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

// A /proc stat file's command name and CPU seconds (utime + stime); false when unreadable.
bool readStat(const std::string& path, std::string* name, double* cpuSeconds) {
  std::ifstream stat(path);
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // The command name may hold spaces and parentheses: fields are counted after the last ')'.
  size_t open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return false;
  *name = text.substr(open + 1, close - open - 1);
  std::istringstream fields(text.substr(close + 1));
  std::vector<std::string> words;
  for (std::string word; fields >> word;) words.push_back(word);
  if (words.size() < 13) return false;  // words[0] is field 3 (state); utime is field 14
  double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  *cpuSeconds = (std::stod(words[11]) + std::stod(words[12])) / ticks;
  return true;
}

ProcSample sampleProcess(pid_t pid) {
  ProcSample sample;
  std::string name;
  std::string base = "/proc/" + std::to_string(pid);
  if (!readStat(base + "/stat", &name, &sample.cpuSeconds)) return sample;
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator(base + "/task", error)) {
    double seconds = 0;
    if (!readStat(task.path().string() + "/stat", &name, &seconds)) continue;
    if (name == "nw-triage") sample.triageSeconds += seconds;
    if (name.rfind("nw-reader", 0) == 0) sample.readerSeconds += seconds;
  }
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

bool isVerdictHeader(const std::string& line) {
  const std::string prefix = "[ncclwatch] ";
  if (line.rfind(prefix, 0) != 0) return false;
  size_t i = prefix.size();
  while (i < line.size() && ((line[i] >= 'A' && line[i] <= 'Z') || line[i] == '_')) ++i;
  return i > prefix.size() && (i == line.size() || line[i] == ' ');
}

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
  if (args_.analysisThreads > 0) {
    words.push_back("--analysis-threads");
    words.push_back(std::to_string(args_.analysisThreads));
  }
  if (args_.readerThreads > 0) {
    words.push_back("--reader-threads");
    words.push_back(std::to_string(args_.readerThreads));
  }
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
  if (counters_.recordsFolded > 0) {
    std::printf("%-28s %llu records (the relays' output made directly)\n", "relays folded",
                static_cast<unsigned long long>(counters_.recordsFolded));
  }
  if (!folders_.empty()) {
    relay::FoldStats total;
    for (const auto& folder : folders_) {
      total.recordsIn += folder->stats().recordsIn;
      total.recordsFolded += folder->stats().recordsFolded;
      total.recordsForwarded += folder->stats().recordsForwarded;
    }
    std::printf(
        "%-28s %llu of %llu records the agents sent (%.1f%%); %llu went to the collector "
        "(the whole run; the wire figures above count what the agents sent)\n",
        "relays folded", static_cast<unsigned long long>(total.recordsFolded),
        static_cast<unsigned long long>(total.recordsIn),
        total.recordsIn ? 100.0 * static_cast<double>(total.recordsFolded) /
                              static_cast<double>(total.recordsIn)
                        : 0.0,
        static_cast<unsigned long long>(total.recordsForwarded));
  }
  std::printf("%-28s %.2f (%.1f s CPU over %.1f s)\n", "collector CPU, cores", collectorCpu / wall,
              collectorCpu, wall);
  double triage = last.collector.triageSeconds - first.collector.triageSeconds;
  double readers = last.collector.readerSeconds - first.collector.readerSeconds;
  if (triage > 0 || readers > 0) {
    std::printf("%-28s triage thread %.2f, readers %.2f, the rest (analysis helpers, main) %.2f\n",
                "collector threads, cores", triage / wall, readers / wall,
                (collectorCpu - triage - readers) / wall);
  }
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

}  // namespace ncclwatch::bench::collector_load
