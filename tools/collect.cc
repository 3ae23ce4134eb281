#include "collect.h"

#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "collect_connections.h"
#include "collect_triage.h"
#include "load.h"

namespace ncclwatch::collect {
namespace wire = trace::wire;

// The collector's thread: the connections' readers (collect_connections.h) decode the agents'
// frames, which this thread hands to the triage (collect_triage.h), which decides what to
// analyse and say.
struct Collector::State {
  Options options;
  Counters counters;
  std::unique_ptr<Triage> triage;
  std::unique_ptr<Connections> connections;
  std::thread thread;
  std::atomic<bool> stopping{false};

  void run();
  void drainAndFinish();
};

void Collector::State::run() {
  pthread_setname_np(pthread_self(), "nw-triage");
  while (!stopping.load()) {
    int ready = connections->poll(options.analyzeEveryMs);
    triage->housekeeping(steadyNs());
    ready += connections->poll(0);
    triage->maybeAnalyze(steadyNs());
    if (ready > 0 && ready < kFewReady && !stopping.load()) connections->linger(kLingerMs);
  }
  drainAndFinish();
}

// At the end: the frames agents sent before their connections closed (a job that just ended
// is still in the socket buffers), then, when every rank ended normally, one last pass that
// says whatever it finds (Triage::finish).
void Collector::State::drainAndFinish() {
  int64_t deadline = steadyNs() + 2000 * kMs, lastNews = steadyNs();
  for (;;) {
    // Connections still in the listen queue, agents still sending, or closed ones whose last
    // frames are unread: until none is left, or agents still connected stay silent for 200 ms
    // (a collector stopped while its job runs), or the bound. Each look waits for every reader
    // to find nothing more to read, handing over what they decode meanwhile.
    uint64_t asked = connections->askToCatchUp();
    bool news = false;
    while (!connections->caughtUp(asked) && steadyNs() < deadline) {
      news |= connections->poll(0) > 0;
      std::this_thread::yield();
    }
    news |= connections->poll(0) > 0;
    bool open = connections->anyOpen();
    int64_t now = steadyNs();
    if (news) lastNews = now;
    if ((!news && !open) || now - lastNews >= 200 * kMs || now >= deadline) break;
    if (!news) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  triage->finish();
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
  State& state = *state_;
  state.options = options;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  int64_t startedRealtimeNs = int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
  state.triage = std::make_unique<Triage>(state.options, state.counters, out, startedRealtimeNs);
  state.connections = std::make_unique<Connections>(state.counters, *state.triage, out);
  state.triage->setConnections(state.connections.get());
  if (!state.connections->listen(options.listen, options.listenWaitMs, options.maxAgents,
                                 options.readerThreads, error)) {
    return false;
  }
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
  state.thread = std::thread([&state] { state.run(); });
  return true;
}

int Collector::port() const {
  return state_->connections ? state_->connections->port() : 0;
}

void Collector::stop() {
  if (!state_->thread.joinable()) return;
  state_->stopping.store(true);
  state_->connections->wake();
  state_->thread.join();
  state_->connections->closeAll();
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
  // A sidecar prints on rank 0's stdout and stderr, which may be closed pipes by the time it
  // starts or says its last verdict (a job over before it listened): its verdicts still go to
  // verdicts.jsonl. Ignored before the first line, or that line's SIGPIPE would end it.
  signal(SIGPIPE, SIG_IGN);
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
  const Counters& counters = collector.counters();
  auto started = std::chrono::steady_clock::now(), lastConnected = started;
  auto parentGoneAt = started;
  // A sidecar is rank 0's child: once rank 0 is gone and nothing of the job came, it waits no
  // longer than the files of a job that ended before it listened take to be read.
  const pid_t parent = getppid();
  bool parentGone = false;
  uint64_t orphansSeen = 0;
  while (!g_stopCollect.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto now = std::chrono::steady_clock::now();
    if (counters.connected.load() > 0) lastConnected = now;
    if (!options.untilIdle) continue;
    if (counters.orphansAdopted.load() != orphansSeen) {  // files of ended ranks keep coming
      orphansSeen = counters.orphansAdopted.load();
      lastConnected = now;
    }
    if (!parentGone && getppid() != parent) {
      parentGone = true;
      parentGoneAt = now;
    }
    if (counters.newerJobKnocks.load() > 0 && counters.connected.load() == 0) {
      // A lingering sidecar of a failed attempt: the new attempt's sidecar waits for this port.
      err << "[ncclwatch] collector on port " << collector.port()
          << ": agents of a newer job knock with another secret and none of this job's is "
             "connected; leaving the port to the newer job's collector\n";
      break;
    }
    // A job that ended before this sidecar listened came through its files: it ends as one
    // whose agents all left.
    bool came = counters.agents.load() > 0 || counters.orphansAdopted.load() > 0;
    if ((came && now - lastConnected >= std::chrono::seconds(1)) ||
        (!came && now - started >= std::chrono::seconds(60)) ||
        (!came && parentGone && now - parentGoneAt >= std::chrono::seconds(3))) {
      break;
    }
  }
  collector.stop();
  err << "[ncclwatch] collector stats: agents=" << counters.agents.load()
      << " relay_links=" << counters.relayLinks.load() << " rejected=" << counters.rejected.load()
      << " frames=" << counters.frames.load() << " reads=" << counters.reads.load()
      << " records=" << counters.records.load() << " folded=" << counters.foldedCalls.load()
      << " verdicts=" << counters.verdicts.load() << " analyses=" << counters.analyses.load()
      << " partial=" << counters.partialAnalyses.load()
      << " hang_partial=" << counters.hangAnalyses.load() << " full_because=" <<
      [&] {
        std::string reasons;
        for (size_t i = 0; i < std::size(Counters::kFullReasons); ++i) {
          if (counters.fullBecause[i].load() == 0) continue;
          if (!reasons.empty()) reasons += ",";
          reasons += std::string(Counters::kFullReasons[i]) + ":" +
                     std::to_string(counters.fullBecause[i].load());
        }
        return reasons.empty() ? std::string("-") : reasons;
      }()
      << " analysis_ms=" << counters.analysisNs.load() / 1'000'000
      << " analysis_cpu_ms=" << counters.analysisCpuNs.load() / 1'000'000
      << " divergence_passes=" << counters.divergencePasses.load()
      << " divergence_ms=" << counters.divergencePassNs.load() / 1'000'000
      << " trims=" << counters.progressTrims.load() << "/" << counters.progressTrimRebuilds.load()
      << " holds=" << counters.windowHolds.load() << "/" << counters.windowHoldsBroken.load()
      << " holds_over_budget=" << counters.windowHoldsOverBudget.load() << " held_peak_mib="
      << counters.heldRecordsPeak.load() * sizeof(trace::CallRecord) / (1 << 20) << "\n";
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
  collectorOptions.silentRankAbortMs = options.silentRankAbortMs;
  collectorOptions.colour = cli::useColour(-1, STDERR_FILENO);
  Collector collector;
  std::string error;
  if (!collector.start(collectorOptions, err, &error)) {
    err << "ncclwatch run: " << error << "\n";
    return 2;
  }
  if (options.pluginOnly && options.abortOnVerdict) {
    err << "[ncclwatch] --abort with --plugin-only: verdicts are said and the ranks dump, but no "
           "communicator can be aborted (NCCL hands a profiler plugin no communicator)\n";
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
  uint64_t said = collector.counters().verdicts.load();
  uint64_t afterAbort = collector.counters().verdictsAfterAbort.load();
  uint64_t withdrawn = collector.counters().verdictsWithdrawn.load();
  uint64_t verdicts = said - std::min(said, withdrawn);
  out << "[ncclwatch] " << verdicts << (verdicts == 1 ? " verdict" : " verdicts");
  if (withdrawn > 0) {
    out << " (and " << withdrawn << " withdrawn: a rank alive but silent issued calls again)";
  }
  if (afterAbort > 0) out << " (" << afterAbort << " of them what the abort set off)";
  if (said > 0) out << " (" << directory << "/verdicts.jsonl)";
  out << "; run `ncclwatch inspect " << directory << "` for the whole picture\n" << std::flush;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  // An aborted collective returns without its result: a job that does not look at its
  // communicators' errors (or ends before it would) goes on with wrong data and exits 0. Under
  // --abort the job failed, whatever its own status says.
  uint64_t aborts = collector.counters().abortsSent.load();
  if (WEXITSTATUS(status) == 0 && aborts > 0 && !options.pluginOnly) {
    // Whether an abort took effect (a job that destroyed its communicator first has nothing
    // left to abort: its ranks say so) does not change it: the verdict's calls are wrong.
    err << "[ncclwatch] the job exited 0, but after a verdict --abort asked its ranks to abort "
        << aborts << (aborts == 1 ? " communicator" : " communicators")
        << " (what the job computed from the verdict's call on is not to be trusted): exit "
           "status "
        << kAbortedJobStatus << "\n"
        << std::flush;
    return kAbortedJobStatus;
  }
  return WEXITSTATUS(status);
}

}  // namespace ncclwatch::collect
