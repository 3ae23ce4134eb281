#include "demo.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <thread>
#include <vector>

#include "collect.h"
#include "inspect.h"
#include "load.h"
#include "stacks.h"
#include "stragglers.h"
#include "timeline.h"
#include "trace/ring_reader.h"

namespace ncclwatch::demo {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_interrupted = 0;

void onInterrupt(int) {
  g_interrupted = 1;
}

std::string selfPath() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : self.string();
}

std::string bugKind(const std::string& bug) {
  return bug.substr(0, bug.find(':'));
}

// The value of key=N in a bug spec, -1 when absent.
int bugValue(const std::string& bug, const std::string& key) {
  size_t colon = bug.find(':');
  if (colon == std::string::npos) return -1;
  std::string rest = "," + bug.substr(colon + 1);
  size_t at = rest.find("," + key + "=");
  if (at == std::string::npos) return -1;
  return std::atoi(rest.c_str() + at + key.size() + 2);
}

std::string describeBug(const std::string& bug) {
  std::string kind = bugKind(bug);
  std::string rank = "rank " + std::to_string(bugValue(bug, "rank"));
  std::string step = " at step " + std::to_string(std::max(0, bugValue(bug, "step")));
  if (kind == "skip") return rank + " skips one data-parallel allreduce" + step;
  if (kind == "op") return rank + " calls another collective" + step;
  if (kind == "count") return rank + " passes a different element count" + step;
  if (kind == "dtype") return rank + " passes a different data type" + step;
  if (kind == "root") return rank + " broadcasts from a different root" + step;
  if (kind == "extra") return rank + " issues one allreduce too many" + step;
  if (kind == "peer") return rank + " sends to the wrong peer" + step;
  if (kind == "color") return rank + " splits with a different colour";
  if (kind == "order") return rank + " issues two collectives in another order" + step;
  if (kind == "exit") return rank + " exits early" + step;
  if (kind == "crash") return rank + " crashes" + step;
  if (kind == "slow") {
    int ms = bugValue(bug, "ms");
    return rank + " sleeps " + std::to_string(ms < 0 ? 100 : ms) + " ms before every NCCL call";
  }
  return "bug " + bug;
}

// How many ranks have dumped on a hang, and how many trace files there are.
std::pair<int, int> countHangDumps(const std::string& directory) {
  int files = 0, dumped = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    if (entry.path().extension() != ".ncclwatch") continue;
    ++files;
    trace::TraceFile file = trace::readTraceFile(entry.path().string());
    for (const trace::Dump& dump : file.dumps) {
      if (dump.trigger == "hang") {
        ++dumped;
        break;
      }
    }
  }
  return {files, dumped};
}

pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, bool quiet) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  for (const std::string& assignment : env) putenv(const_cast<char*>(assignment.c_str()));
  if (quiet) {
    int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
  }
  std::vector<char*> args;
  for (const std::string& word : argv) args.push_back(const_cast<char*>(word.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  std::fprintf(stderr, "ncclwatch demo: cannot run %s: %s\n", args[0], strerror(errno));
  _exit(127);
}

int waitFor(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

std::string completeBug(const std::string& bug, int ranks, int steps) {
  if (bug.find(':') != std::string::npos) return bug;
  std::string rank = "rank=" + std::to_string(std::min(3, ranks - 1));
  if (bug == "slow") return "slow:" + rank + ",step=0,ms=20";
  if (bug == "color") return "color:" + rank;
  return bug + ":" + rank + ",step=" + std::to_string(std::min(5, std::max(0, steps - 2)));
}

int run(const Options& options, std::ostream& out, std::ostream& err) {
  std::string self = selfPath();
  fs::path build = fs::path(self).parent_path().parent_path();
  std::string preload = (build / "lib" / "libncclwatch.so").string();
  std::string simLib = (build / "sim" / "lib").string();
  std::string program = (build / "examples" / "train_loop").string();
  for (const std::string& needed : {preload, simLib + "/libnccl.so.2", program}) {
    if (access(needed.c_str(), R_OK) != 0) {
      err << "ncclwatch demo: " << needed
          << " is missing; the demo runs from a build folder (build all, or scripts/demo.sh)\n";
      return 2;
    }
  }
  std::string bug = completeBug(options.bug, options.ranks, options.steps);
  int bugRank = bugValue(bug, "rank");
  if (bugRank >= options.ranks) {
    err << "ncclwatch demo: --bug " << bug << " names rank " << bugRank << " of a job of "
        << options.ranks << " ranks\n";
    return 2;
  }
  std::string directory = options.directory;
  if (directory.empty()) {
    char stamp[64];
    std::time_t now = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    directory = "ncclwatch-demo/" + std::string(stamp) + "-" + std::to_string(getpid());
  }
  std::error_code ec;
  fs::create_directories(directory, ec);
  if (ec || !fs::is_directory(directory)) {
    err << "ncclwatch demo: cannot create " << directory << ": " << ec.message() << "\n";
    return 2;
  }
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    if (entry.path().extension() == ".ncclwatch") {
      err << "ncclwatch demo: " << directory
          << " already holds traces; give --dir a new or empty folder\n";
      return 2;
    }
  }
  directory = fs::absolute(directory).lexically_normal().string();

  // Tensor-parallel pairs once the data-parallel groups still have 3 ranks or more, so that the
  // odd rank out of a group is plain to see.
  int tp = options.ranks >= 6 && options.ranks % 2 == 0 ? 2 : 1;
  bool colour = cli::useColour(options.colour, STDOUT_FILENO);
  const char* bold = colour ? "\033[1;36m" : "";
  const char* reset = colour ? "\033[0m" : "";
  auto say = [&](const std::string& line) {
    out << bold << "[ncclwatch demo] " << reset << line << "\n" << std::flush;
  };
  say(std::to_string(options.ranks) + " ranks of examples/train_loop on the GPU-less sim, " +
      std::to_string(options.steps) + " steps, tensor-parallel " + std::to_string(tp) +
      " x data-parallel " + std::to_string(options.ranks / tp) +
      "; injected bug: " + describeBug(bug) + " (--bug " + bug + ")");
  say("traces go to " + directory +
      "; the collector prints live verdicts, the watchdogs declare a hang after 1 s and dump");

  // The collector, as `ncclwatch run` hosts it: the live cross-rank verdict appears below as
  // soon as the ranks' calls show it.
  collect::Options collectorOptions;
  collectorOptions.secret = collect::makeSecret();
  collectorOptions.directory = directory;
  collectorOptions.colour = colour;
  collect::Collector collector;
  std::string collectorError;
  bool live = collector.start(collectorOptions, out, &collectorError);
  if (!live) say("no live verdicts: " + collectorError);

  const char* oldPath = std::getenv("LD_LIBRARY_PATH");
  std::vector<std::string> env = {
      "LD_PRELOAD=" + preload,
      "LD_LIBRARY_PATH=" + simLib + (oldPath && *oldPath ? ":" + std::string(oldPath) : ""),
      "NCCLWATCH_DIR=" + directory,
      "NCCLWATCH_JOB=demo-" + std::to_string(getpid()),
      "NCCLWATCH_ON_HANG=dump",
      "NCCLWATCH_HANG_MS=1000",
      "NCCLWATCH_WARN_MS=500",
      "NCCLWATCH_POLL_MS=10",
      "NCCLWATCH_DUMP_WAIT_MS=1500",
      "NCCLWATCH_RING_RECORDS=8192"};
  if (live) {
    env.push_back("NCCLWATCH_COLLECTOR=127.0.0.1:" + std::to_string(collector.port()));
    env.push_back("NCCLWATCH_SECRET=" + collectorOptions.secret);
  }
  std::vector<std::string> argv = {
      self,   "launch",          "-n",      std::to_string(options.ranks), "--grace", "2",
      "--",   program,           "--steps", std::to_string(options.steps), "--bug",   bug,
      "--tp", std::to_string(tp)};

  struct sigaction interrupt {
  }, oldInt{}, oldTerm{};
  interrupt.sa_handler = onInterrupt;
  sigemptyset(&interrupt.sa_mask);
  sigaction(SIGINT, &interrupt, &oldInt);
  sigaction(SIGTERM, &interrupt, &oldTerm);
  g_interrupted = 0;

  auto started = Clock::now();
  pid_t job = spawn(argv, env, false);
  if (job < 0) {
    err << "ncclwatch demo: fork: " << strerror(errno) << "\n";
    return 2;
  }
  auto deadline =
      started + std::chrono::milliseconds(static_cast<long>(options.timeoutSeconds * 1000));
  Clock::time_point firstDump{};
  int jobStatus = -1;
  bool stopped = false;
  for (;;) {
    int status = 0;
    pid_t done = waitpid(job, &status, WNOHANG);
    if (done == job) {
      jobStatus = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (stopped) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    std::string why;
    auto [files, dumped] = countHangDumps(directory);
    auto now = Clock::now();
    if (dumped > 0 && firstDump == Clock::time_point{}) firstDump = now;
    if (files >= options.ranks && dumped >= options.ranks) {
      why = "every rank dumped its stacks";
    } else if (dumped > 0 && now - firstDump > std::chrono::seconds(5)) {
      why = std::to_string(dumped) + " of " + std::to_string(options.ranks) +
            " ranks dumped their stacks";
    } else if (now > deadline) {
      why = "the job still runs after " + std::to_string(static_cast<int>(options.timeoutSeconds)) +
            " s";
    } else if (g_interrupted) {
      why = "interrupted";
    }
    if (!why.empty()) {
      say(why + ": stopping the job");
      kill(job, SIGINT);  // launch forwards it to every rank
      stopped = true;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  sigaction(SIGINT, &oldInt, nullptr);
  sigaction(SIGTERM, &oldTerm, nullptr);
  collector.stop();
  double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  char took[64];
  std::snprintf(took, sizeof took, "%.1f s", seconds);
  say(std::string("the job ended after ") + took +
      (jobStatus == 0 ? " (every rank exited cleanly)" : ""));
  out << "\n" << std::flush;

  inspect::Options inspectOptions;
  inspectOptions.directory = directory;
  inspectOptions.colour = options.colour;
  int code = inspect::run(inspectOptions, out, err);
  out << std::flush;
  if (code == 2) return 2;
  if (bugKind(bug) == "slow") {
    stragglers::Options stragglerOptions;
    stragglerOptions.directory = directory;
    stragglerOptions.top = 3;
    stragglerOptions.colour = options.colour;
    out << "\n";
    stragglers::run(stragglerOptions, out, err);
  }
  out << "\n";

  // Where every rank was: the merged stack tree of their dumps.
  stacks::Options stackOptions;
  stackOptions.directory = directory;
  stacks::run(stackOptions, out, err);
  out << "\n";

  timeline::Options timelineOptions;
  timelineOptions.directory = directory;
  timelineOptions.output = directory + "/timeline.json";
  std::ostringstream timelineOut;
  bool haveTimeline = timeline::run(timelineOptions, timelineOut, err) == 0;

  std::string reportPath = directory + "/report.html";
  bool reportExists = waitFor(spawn({self, "report", "--help"}, {}, true)) == 0;
  bool haveReport =
      reportExists && waitFor(spawn({self, "report", directory, "-o", reportPath}, {}, false)) == 0;
  say("traces:   " + directory);
  say(haveTimeline ? "timeline: " + timelineOptions.output + " (open it in https://ui.perfetto.dev)"
                   : std::string("timeline: could not be written"));
  say(haveReport ? "report:   " + reportPath + " (open it in a browser)"
      : reportExists
          ? std::string("report:   could not be written (see above)")
          : std::string("report:   not available in this build (no `ncclwatch report`)"));
  say("more:     ncclwatch stacks " + directory + " --all-threads   ncclwatch stragglers " +
      directory);
  return code;
}

}  // namespace ncclwatch::demo
