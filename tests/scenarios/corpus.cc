#include "corpus.h"

#include "child.h"
#include "traces.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

namespace corpus {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// After a hung job's first live verdict, how long the collector may still add verdicts before
// the test reads them and stops the job: past the collector's quiet time (3 s), so that the
// verdicts that need a quiet job have had their chance too.
constexpr auto kLinger = 3800ms;
// A hung job must speak within this (the quiet time is 3 s, a start takes about 1 s).
constexpr auto kVerdictBound = 25s;
constexpr auto kEndBound = 60s;

using testsupport::readFile;  // a process's /proc files may vanish while they are read

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) parts.push_back(part);
  return parts;
}

struct VerdictLine {
  std::string kind;
  bool primary = true;
  std::vector<int> culprits;
  int64_t divergenceNs = 0;
  int64_t detectionNs = 0;
};

std::vector<VerdictLine> parseVerdicts(const std::string& text) {
  static const std::regex kind("\"kind\":\"([a-z_0-9]+)\"");
  static const std::regex primary("\"primary\":(true|false)");
  static const std::regex culprits("\"culprits\":\\[([0-9,]*)\\]");
  static const std::regex divergence("\"divergence_ns\":(-?[0-9]+)");
  static const std::regex detection("\"detection_ns\":(-?[0-9]+)");
  std::vector<VerdictLine> lines;
  for (const std::string& line : split(text, '\n')) {
    std::smatch m;
    if (!std::regex_search(line, m, kind)) continue;
    VerdictLine v;
    v.kind = m[1];
    if (std::regex_search(line, m, primary)) v.primary = m[1] == "true";
    if (std::regex_search(line, m, culprits)) {
      for (const std::string& rank : split(m[1], ',')) {
        if (!rank.empty()) v.culprits.push_back(std::stoi(rank));
      }
    }
    if (std::regex_search(line, m, divergence)) v.divergenceNs = std::stoll(m[1]);
    if (std::regex_search(line, m, detection)) v.detectionNs = std::stoll(m[1]);
    lines.push_back(v);
  }
  return lines;
}

Findings findingsOf(const std::vector<VerdictLine>& lines) {
  Findings f;
  for (const VerdictLine& v : lines) {
    if (!v.primary || v.kind == "straggler") continue;
    f.kinds.insert(v.kind);
    f.culprits.insert(v.culprits.begin(), v.culprits.end());
  }
  return f;
}

// Live `ncclwatch collect` processes (sidecars) whose command line names `directory`.
std::vector<pid_t> collectorsFor(const std::string& directory) {
  return testsupport::collectorsFor(directory, false);
}

// The job: `ncclwatch launch` (sidecar mode) or `ncclwatch run` around it, in a process group
// of its own, output in a file.
class Launched {
 public:
  Launched(const Expectation& row, Mode mode, const std::string& logs) : output_(logs + ".out") {
    std::string cli = NCCLWATCH_BINARY;
    std::vector<std::string> words;
    if (mode == Mode::kRun) words = {cli, "run", "--dir", logs, "--"};
    std::vector<std::string> launch = {
        cli,       "launch", "-n", std::to_string(row.ranks), "--keep-going",
        "--grace", "3",      "--", NCCL_SCENARIOS_BINARY,     row.name};
    words.insert(words.end(), launch.begin(), launch.end());
    // Everything the child needs is built here: between fork and exec a child of a threaded
    // process (runAll's workers) may only make async-signal-safe calls.
    std::vector<std::string> environment;
    static const char* const kDropped[] = {"NCCLWATCH_COLLECTOR",
                                           "NCCLWATCH_SECRET",
                                           "NCCLWATCH_JOB",
                                           "NCCLWATCH_COLLECTOR_PORT",
                                           "NCCLWATCH_CLI",
                                           "NCCLSIM_MISMATCH",
                                           "NCCLSIM_FAULT",
                                           "LD_PRELOAD",
                                           "NCCLWATCH_DIR",
                                           "LD_LIBRARY_PATH",
                                           "NCCLWATCH_INIT_PATIENCE_MS"};
    for (char** entry = environ; *entry != nullptr; ++entry) {
      std::string text = *entry;
      std::string name = text.substr(0, text.find('='));
      if (std::find(std::begin(kDropped), std::end(kDropped), name) == std::end(kDropped)) {
        environment.push_back(text);
      }
    }
    const char* path = std::getenv("LD_LIBRARY_PATH");
    environment.push_back("LD_LIBRARY_PATH=" + std::string(NCCLWATCH_SIM_LIB_DIR) +
                          (path ? std::string(":") + path : ""));
    environment.push_back("NCCLWATCH_DIR=" + logs);
    // init_rank_never_comes speaks within kVerdictBound (the default patience is 30 s).
    environment.push_back("NCCLWATCH_INIT_PATIENCE_MS=3000");
    if (mode == Mode::kSidecar)
      environment.push_back(std::string("LD_PRELOAD=") + NCCLWATCH_PRELOAD);
    std::vector<char*> argv, envp;
    for (std::string& word : words) argv.push_back(word.data());
    argv.push_back(nullptr);
    for (std::string& entry : environment) envp.push_back(entry.data());
    envp.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      int out = open(output_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      dup2(out, STDOUT_FILENO);
      dup2(out, STDERR_FILENO);
      setpgid(0, 0);
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
  }
  ~Launched() {
    if (running()) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool running() {
    if (status_ == -1 && pid_ > 0) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
      }
    }
    return status_ == -1 && pid_ > 0;
  }
  bool waitExit(std::chrono::milliseconds bound) {
    auto deadline = Clock::now() + bound;
    while (running() && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
    return !running();
  }
  // As a user would stop it: SIGTERM to the launcher (it forwards it), SIGKILL if that hangs.
  void stop() {
    if (!running()) return;
    kill(pid_, SIGTERM);
    if (!waitExit(15s)) {
      kill(-pid_, SIGKILL);
      waitExit(5s);
    }
  }
  int status() const { return status_; }
  std::string output() const { return readFile(output_); }

 private:
  std::string output_;
  pid_t pid_ = -1;
  int status_ = -1;
};

// The collector is gone once no `collect` names the folder (`run` hosts it in its own process).
void awaitCollectors(const std::string& logs) {
  auto deadline = Clock::now() + 10s;
  while (!collectorsFor(logs).empty() && Clock::now() < deadline) std::this_thread::sleep_for(50ms);
  for (pid_t pid : collectorsFor(logs)) kill(pid, SIGKILL);  // stuck: the test's own cleanup
}

std::string runInspect(const std::string& logs) {
  std::string command = std::string(NCCLWATCH_BINARY) + " inspect --json " + logs + " 2>&1";
  std::string text;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[4096];
    size_t got;
    while ((got = fread(buffer, 1, sizeof buffer, pipe)) > 0) text.append(buffer, got);
    pclose(pipe);
  }
  return text;
}

}  // namespace

std::string tablePath() {
  return NCCL_SCENARIOS_TABLE;
}

const char* modeName(Mode mode) {
  return mode == Mode::kSidecar ? "sidecar" : "run";
}

std::string Findings::text() const {
  if (kinds.empty() && culprits.empty()) return "none";
  std::string out;
  for (const std::string& kind : kinds) out += (out.empty() ? "" : ",") + kind;
  out += " ";
  std::string ranks;
  for (int rank : culprits) ranks += (ranks.empty() ? "" : ",") + std::to_string(rank);
  return out + (ranks.empty() ? "-" : ranks);
}

Findings expected(const Expectation& row) {
  return Findings{row.kinds, row.culprits};
}

bool readTable(const std::string& path, std::vector<Expectation>* rows, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = path + ": cannot read";
    return false;
  }
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#' || line.rfind("name\t", 0) == 0) continue;
    std::vector<std::string> cells = split(line, '\t');
    if (cells.size() != 6) {
      *error = path + ":" + std::to_string(number) + ": expected 6 tab-separated cells";
      return false;
    }
    Expectation row;
    row.name = cells[0];
    row.ranks = std::atoi(cells[1].c_str());
    if (row.ranks < 2 || (cells[2] != "ends" && cells[2] != "hangs")) {
      *error = path + ":" + std::to_string(number) + ": bad ranks or job column";
      return false;
    }
    row.hangs = cells[2] == "hangs";
    if (cells[3] != "none") {
      for (const std::string& kind : split(cells[3], ',')) row.kinds.insert(kind);
    }
    if (cells[4] != "-") {
      for (const std::string& rank : split(cells[4], ',')) row.culprits.insert(std::stoi(rank));
    }
    row.what = cells[5];
    rows->push_back(row);
  }
  return true;
}

Outcome runScenario(const Expectation& row, Mode mode, const std::string& directory) {
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  std::string logs = directory + "/logs";
  std::string verdictsPath = logs + "/verdicts.jsonl";
  Outcome outcome;
  auto started = Clock::now();
  std::string liveText;
  {
    Launched job(row, mode, logs);
    if (row.hangs) {
      auto deadline = started + kVerdictBound;
      // A straggler note can come first on a loaded machine: wait for the error verdict.
      while (testsupport::firstErrorVerdict(logs).empty() && job.running() &&
             Clock::now() < deadline) {
        std::this_thread::sleep_for(50ms);
      }
      if (!testsupport::firstErrorVerdict(logs).empty()) {
        outcome.toVerdictS = std::chrono::duration<double>(Clock::now() - started).count();
        std::this_thread::sleep_for(kLinger);
      } else {
        outcome.stuck = true;
      }
      liveText = readFile(verdictsPath);  // what was said while the job hung
      job.stop();
    } else if (!job.waitExit(kEndBound)) {
      outcome.stuck = true;
      job.stop();
    }
    outcome.exitStatus = job.status();
    awaitCollectors(logs);
    if (!row.hangs) {
      liveText = readFile(verdictsPath);  // the collector's last pass included
      if (!liveText.empty()) {
        outcome.toVerdictS = std::chrono::duration<double>(Clock::now() - started).count();
      }
    }
    outcome.diagnostics = "job output (" + std::string(modeName(mode)) + "):\n" + job.output();
  }
  std::vector<VerdictLine> live = parseVerdicts(liveText);
  outcome.live = findingsOf(live);
  if (!live.empty() && live.front().divergenceNs > 0) {
    outcome.latencyMs = (live.front().detectionNs - live.front().divergenceNs) / 1e6;
  }
  std::string offlineText = runInspect(logs);
  outcome.offline = findingsOf(parseVerdicts(offlineText));
  outcome.diagnostics += "\nlive verdicts:\n" + liveText + "\ninspect --json:\n" + offlineText;
  return outcome;
}

std::vector<Outcome> runAll(const std::vector<Expectation>& rows, const std::vector<Task>& tasks,
                            int jobs, const std::string& directory) {
  std::vector<Outcome> outcomes(tasks.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < tasks.size(); i = next++) {
      const Task& task = tasks[i];
      std::string folder = directory + "/" + rows[task.row].name + "-" + modeName(task.mode) + "-" +
                           std::to_string(task.repetition);
      outcomes[i] = runScenario(rows[task.row], task.mode, folder);
    }
  };
  std::vector<std::thread> workers;
  for (int j = 0; j < std::max(1, jobs); ++j) workers.emplace_back(worker);
  for (std::thread& t : workers) t.join();
  return outcomes;
}

}  // namespace corpus
