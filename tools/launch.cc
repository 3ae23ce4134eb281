#include "launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <utility>

#include "trace/wire.h"

namespace ncclwatch::launch {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_forwardSignal = 0;

void rememberSignal(int signal) {
  g_forwardSignal = signal;
}

struct Rank {
  int index = 0;
  pid_t pid = -1;
  int outFd = -1;  // read ends of the rank's stdout and stderr pipes
  int errFd = -1;
  std::string outPending, errPending;
  bool running = false;
};

bool portFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return free;
}

std::string newJobId() {
  std::random_device device;
  char text[32];
  std::snprintf(text, sizeof text, "launch-%d-%08x", static_cast<int>(getpid()), device());
  return text;
}

const char* signalName(int signal) {
  const char* abbreviation = sigabbrev_np(signal);
  return abbreviation != nullptr ? abbreviation : "?";
}

pid_t startRank(const Options& options, int index, int masterPort, const std::string& jobId,
                int outPipe[2], int errPipe[2]) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  setpgid(0, 0);  // its own process group: signals reach the rank and its children
  dup2(outPipe[1], STDOUT_FILENO);
  dup2(errPipe[1], STDERR_FILENO);
  close(outPipe[0]);
  close(errPipe[0]);
  std::string rank = std::to_string(index), world = std::to_string(options.ranks);
  setenv("RANK", rank.c_str(), 1);
  setenv("LOCAL_RANK", rank.c_str(), 1);
  setenv("WORLD_SIZE", world.c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", world.c_str(), 1);
  setenv("GROUP_RANK", "0", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(masterPort).c_str(), 1);
  setenv("NCCLWATCH_JOB", jobId.c_str(), 1);
  std::vector<char*> argv;
  for (const std::string& word : options.command) argv.push_back(const_cast<char*>(word.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "ncclwatch launch: cannot run %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

void signalAll(const std::vector<Rank>& ranks, int signal) {
  for (const Rank& rank : ranks) {
    if (rank.running) kill(-rank.pid, signal);
  }
}

// Moves whatever a rank wrote to our stdout/stderr, line by line with its prefix.
void drain(int& fd, std::string& pending, const std::string& prefix, FILE* out, bool atEnd) {
  char buffer[65536];
  for (;;) {
    ssize_t n = read(fd, buffer, sizeof buffer);
    if (n > 0) {
      pending.append(buffer, static_cast<size_t>(n));
      std::string lines = takeCompleteLines(pending, prefix);
      std::fwrite(lines.data(), 1, lines.size(), out);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if ((n == 0 || atEnd) && !pending.empty()) {  // the rank's last line had no newline
      pending.push_back('\n');
      std::string lines = takeCompleteLines(pending, prefix);
      std::fwrite(lines.data(), 1, lines.size(), out);
    }
    if (n == 0 || (n < 0 && errno != EAGAIN)) {  // end of output, or a broken pipe
      close(fd);
      fd = -1;
    }
    break;
  }
  std::fflush(out);
}

}  // namespace

int jobExitCode(const std::vector<RankExit>& exitsInOrder) {
  for (const RankExit& exit : exitsInOrder) {
    if (exit.status != 0) return exit.status;
  }
  return 0;
}

std::string describeExit(const RankExit& exit) {
  std::string text = "rank " + std::to_string(exit.rank);
  if (exit.bySignal) {
    int signal = exit.status - 128;
    return text + " was killed by SIG" + signalName(signal) + " (exit code " +
           std::to_string(exit.status) + ")";
  }
  return text + " exited with code " + std::to_string(exit.status);
}

// The ports the kernel hands out to outgoing connections (net.ipv4.ip_local_port_range): a port
// from there that is free now can be taken by any connect() before the job binds it, which a
// busy machine (a collector's thousands of agents, other jobs) does often enough to matter.
std::pair<int, int> ephemeralPorts() {
  std::pair<int, int> range{32768, 60999};  // Linux's default
  if (FILE* file = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "re")) {
    int low = 0, high = 0;
    if (std::fscanf(file, "%d %d", &low, &high) == 2 && low > 0 && low <= high) range = {low, high};
    std::fclose(file);
  }
  return range;
}

int findFreePortPair() {
  std::random_device device;
  // Outside the ephemeral range when it leaves room (below it by default: 10000-32767),
  // anywhere in 10000-60000 otherwise.
  auto [low, high] = ephemeralPorts();
  constexpr int kFirst = 10000, kSpan = trace::wire::kCollectorPortOffset + 1;
  int below = low - kSpan - kFirst, above = 65535 - kSpan - high;
  for (int attempt = 0; attempt < 200; ++attempt) {
    int port = 0;
    if (below >= 1000) {
      port = kFirst + static_cast<int>(device() % static_cast<unsigned>(below));
    } else if (above >= 1000) {
      port = high + 1 + static_cast<int>(device() % static_cast<unsigned>(above));
    } else {
      port = kFirst + static_cast<int>(device() % 50000);
    }
    // MASTER_PORT, the unique-id port beside it, and the default collector's port, which the
    // rank-0 sidecar binds later: a taken one made the sidecar fail with "Address already in
    // use" and the job go without live verdicts (scenarios_repeat).
    if (portFree(port) && portFree(port + 1) &&
        portFree(port + trace::wire::kCollectorPortOffset)) {
      return port;
    }
  }
  return 0;
}

std::string takeCompleteLines(std::string& pending, const std::string& prefix) {
  std::string out;
  size_t start = 0;
  for (size_t newline; (newline = pending.find('\n', start)) != std::string::npos;
       start = newline + 1) {
    out += prefix;
    out.append(pending, start, newline + 1 - start);
  }
  pending.erase(0, start);
  return out;
}

int run(const Options& options) {
  int masterPort = findFreePortPair();
  if (masterPort == 0) {
    std::fprintf(stderr, "ncclwatch launch: no free TCP port pair on 127.0.0.1\n");
    return 2;
  }
  const char* existingJob = std::getenv("NCCLWATCH_JOB");
  std::string jobId = existingJob != nullptr && *existingJob ? existingJob : newJobId();

  struct sigaction forward {};
  forward.sa_handler = rememberSignal;
  sigemptyset(&forward.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal, &forward, nullptr);

  std::vector<Rank> ranks(options.ranks);
  for (int i = 0; i < options.ranks; ++i) {
    int outPipe[2], errPipe[2];
    if (pipe2(outPipe, O_CLOEXEC) != 0 || pipe2(errPipe, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "ncclwatch launch: pipe: %s\n", strerror(errno));
      signalAll(ranks, SIGKILL);
      return 2;
    }
    ranks[i].index = i;
    ranks[i].pid = startRank(options, i, masterPort, jobId, outPipe, errPipe);
    ranks[i].running = ranks[i].pid > 0;
    close(outPipe[1]);
    close(errPipe[1]);
    ranks[i].outFd = outPipe[0];
    ranks[i].errFd = errPipe[0];
    fcntl(ranks[i].outFd, F_SETFL, O_NONBLOCK);
    fcntl(ranks[i].errFd, F_SETFL, O_NONBLOCK);
  }

  std::vector<RankExit> exits;
  int running = options.ranks;
  bool stopping = false;
  Clock::time_point killAt{};
  while (running > 0) {
    if (g_forwardSignal != 0) {
      int signal = g_forwardSignal;
      g_forwardSignal = 0;
      signalAll(ranks, signal);
      if (!stopping) {
        stopping = true;
        killAt = Clock::now() + options.grace;
      }
    }
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, bool>> owners;  // (rank, is stderr)
    for (Rank& rank : ranks) {
      if (rank.outFd >= 0) {
        fds.push_back({rank.outFd, POLLIN, 0});
        owners.push_back({&rank, false});
      }
      if (rank.errFd >= 0) {
        fds.push_back({rank.errFd, POLLIN, 0});
        owners.push_back({&rank, true});
      }
    }
    poll(fds.data(), fds.size(), 50);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Rank& rank = *owners[i].first;
      std::string prefix = options.prefix ? "[rank " + std::to_string(rank.index) + "] " : "";
      if (owners[i].second) {
        drain(rank.errFd, rank.errPending, prefix, stderr, false);
      } else {
        drain(rank.outFd, rank.outPending, prefix, stdout, false);
      }
    }
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (Rank& rank : ranks) {
        if (rank.pid != pid || !rank.running) continue;
        rank.running = false;
        --running;
        RankExit exit{rank.index, 0, false};
        if (WIFSIGNALED(status)) {
          exit.status = 128 + WTERMSIG(status);
          exit.bySignal = true;
        } else {
          exit.status = WEXITSTATUS(status);
        }
        exits.push_back(exit);
        if (exit.status != 0 && !stopping && options.keepGoing) {
          std::fprintf(stderr, "[ncclwatch] %s; the other ranks keep running (--keep-going)\n",
                       describeExit(exit).c_str());
        } else if (exit.status != 0 && !stopping) {
          std::fprintf(stderr, "[ncclwatch] %s; stopping the other ranks\n",
                       describeExit(exit).c_str());
          stopping = true;
          signalAll(ranks, SIGTERM);
          killAt = Clock::now() + options.grace;
        } else if (exit.status != 0) {
          std::fprintf(stderr, "[ncclwatch] %s\n", describeExit(exit).c_str());
        }
      }
    }
    if (stopping && Clock::now() >= killAt) signalAll(ranks, SIGKILL);
  }
  for (Rank& rank : ranks) {
    std::string prefix = options.prefix ? "[rank " + std::to_string(rank.index) + "] " : "";
    if (rank.outFd >= 0) drain(rank.outFd, rank.outPending, prefix, stdout, true);
    if (rank.errFd >= 0) drain(rank.errFd, rank.errPending, prefix, stderr, true);
  }
  return jobExitCode(exits);
}

}  // namespace ncclwatch::launch
