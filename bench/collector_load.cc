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
#include "bench/collector_load.h"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "trace/fingerprint.h"
#include "trace/identity.h"
#include "trace/wire.h"

namespace ncclwatch::bench::collector_load {

volatile sig_atomic_t g_interrupted = 0;

namespace {

const char* const kUsage =
    "usage: collector_load --cli PATH_TO_ncclwatch [--agents 4096] [--rate 100] [--seconds 20]\n"
    "                      [--tick-ms 100] [--comm-size 8] [--warmup 3] [--verdict-wait 30]\n"
    "                      [--hosts N (agents multiplexed per host, as through relays)]\n"
    "                      [--fold 1|0|2 (the relays fold host-local calls with their code;\n"
    "                       0: not; 2: their output made directly; default 1)]\n"
    "                      [--link-writes host|agent (a host's frames of a tick in one write,\n"
    "                       as relays gather them; agent: one write each; default host)]\n"
    "                      [--analysis-threads N (the collector's; default its own)]\n"
    "                      [--reader-threads N (the collector's; default its own)]\n";

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
    } else if (name == "--hosts") {
      if (!number(0, 100000, true)) return false;
      args->hosts = static_cast<long>(value);
    } else if (name == "--fold") {
      if (!number(0, 2, true)) return false;
      args->fold = static_cast<int>(value);
    } else if (name == "--link-writes") {
      if (std::strcmp(text, "host") != 0 && std::strcmp(text, "agent") != 0) {
        *error = std::string("--link-writes ") + text + ": give host or agent";
        return false;
      }
      args->writePerAgent = std::strcmp(text, "agent") == 0;
    } else if (name == "--analysis-threads") {
      if (!number(1, 64, true)) return false;
      args->analysisThreads = static_cast<long>(value);
    } else if (name == "--reader-threads") {
      if (!number(1, 64, true)) return false;
      args->readerThreads = static_cast<long>(value);
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
  if (args->hosts > 0 &&
      (args->agents % args->hosts != 0 ||
       args->agents / args->hosts > static_cast<long>(wire::kMaxChannelsPerLink))) {
    *error = "--hosts " + std::to_string(args->hosts) + " must divide --agents " +
             std::to_string(args->agents) + " into at most " +
             std::to_string(wire::kMaxChannelsPerLink) + " agents a host";
    return false;
  }
  if (args->rate * static_cast<double>(args->tickMs) / 1000.0 > wire::kMaxRecordsPerFrame) {
    *error = "--rate x --tick-ms is over " + std::to_string(wire::kMaxRecordsPerFrame) +
             " calls per frame";
    return false;
  }
  return true;
}

}  // namespace

int LoadGenerator::run() {
  std::string error;
  // One descriptor per connection (agent, or host through relays) on both sides; the collector
  // inherits the raised limit.
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  long connections = args_.hosts > 0 ? args_.hosts : args_.agents;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < static_cast<rlim_t>(connections) + 64) {
    std::fprintf(stderr, "collector_load: RLIMIT_NOFILE %llu is too low for %ld connections\n",
                 static_cast<unsigned long long>(limit.rlim_cur), connections);
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
  if (args_.hosts > 0) {
    std::printf("through relays: %ld hosts, %ld agents each, one connection a host%s\n",
                args_.hosts, args_.agents / args_.hosts,
                args_.fold == Args::kFoldRelayCode ? ", folding host-local calls"
                : args_.fold == Args::kFoldEmulated
                    ? ", folding host-local calls (the relays' output made directly)"
                    : "");
  }
  std::fflush(stdout);
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  for (auto [reader, tag] : {std::pair{&out_, kEpollStdout}, std::pair{&err_, kEpollStderr}}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = tag;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, reader->fd, &event);
  }
  agents_.resize(static_cast<size_t>(args_.agents));
  if (args_.hosts > 0) agentsPerLink_ = static_cast<size_t>(args_.agents / args_.hosts);
  maxQueued_ = kMaxQueuedBytes * agentsPerLink_;
  if (args_.hosts > 0 && args_.fold == Args::kFoldRelayCode) {
    for (long host = 0; host < args_.hosts; ++host) {
      folders_.push_back(std::make_unique<relay::Folder>());
    }
  }
  for (size_t i = 0; i < agents_.size(); ++i) {
    agents_[i].rank = static_cast<int>(i);
    agents_[i].link = args_.hosts > 0 ? i / agentsPerLink_ * agentsPerLink_ : i;
    agents_[i].channel = args_.hosts > 0 ? static_cast<uint32_t>(i % agentsPerLink_ + 1) : 0;
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

}  // namespace ncclwatch::bench::collector_load

int main(int argc, char** argv) {
  using namespace ncclwatch::bench::collector_load;
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
