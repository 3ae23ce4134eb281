// The storage rows of docs/reliability.md's fault matrix. Each runs the sim's train_loop under
// the preload with a log folder that cannot keep the trace (a 1 MiB tmpfs, a file truncated
// under the running ranks, a folder without permission, read-only, a file, a name too long) and
// asserts what a user checks: every rank exits as it does without ncclwatch (no SIGBUS), each
// rank says once, on one line, which folder failed and why, and only the file is lost (the
// watchdog's stderr dumps and the live verdict still name the culprit).
//
// Rows that mount a tmpfs run with --private-mounts: the test process enters a mount namespace
// of its own (as root, or inside an unprivileged user namespace) before any thread starts.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "child.h"
#include "command.h"
#include "job.h"
#include "traces.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testsupport::Job;
using testsupport::JobSpec;
using testsupport::readFile;

bool g_privateMounts = false;  // the process has a mount namespace of its own
std::string g_mountsUnavailable = "not asked for (run with --private-mounts)";

bool writeText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out.flush());
}

// Before any thread exists (a user namespace demands it).
void enterMountNamespace() {
  if (geteuid() == 0) {
    if (unshare(CLONE_NEWNS) != 0) {
      g_mountsUnavailable = std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
      return;
    }
  } else {
    uid_t uid = getuid();
    gid_t gid = getgid();
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      g_mountsUnavailable = std::string("unshare(CLONE_NEWUSER|CLONE_NEWNS): ") +
                            std::strerror(errno) + " (unprivileged user namespaces off?)";
      return;
    }
    writeText("/proc/self/setgroups", "deny");
    if (!writeText("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
        !writeText("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1")) {
      g_mountsUnavailable = "cannot write the user namespace's id maps";
      return;
    }
  }
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    g_mountsUnavailable = std::string("cannot make mounts private: ") + std::strerror(errno);
    return;
  }
  g_privateMounts = true;
}

// A tmpfs of `kib` KiB at `directory` (created), read-only if asked; "" or why not.
std::string mountTmpfs(const std::string& directory, int kib, bool readOnly) {
  if (!g_privateMounts) return "no private mount namespace: " + g_mountsUnavailable;
  std::filesystem::create_directories(directory);
  std::string options = "size=" + std::to_string(kib) + "k,mode=0777";
  if (mount("tmpfs", directory.c_str(), "tmpfs", readOnly ? MS_RDONLY : 0, options.c_str()) != 0) {
    return std::string("mount -t tmpfs: ") + std::strerror(errno);
  }
  return "";
}

std::string trainLoop() {
  return testsupport::buildDir() + "/examples/train_loop";
}

JobSpec trainJob(int ranks, std::vector<std::string> args) {
  JobSpec spec;
  spec.program = trainLoop();
  spec.args = std::move(args);
  spec.ranks = ranks;
  return spec;
}

void watch(JobSpec& spec, const std::string& logs) {
  spec.env.push_back({"LD_PRELOAD", testsupport::buildDir() + "/lib/libncclwatch.so"});
  spec.env.push_back({"NCCLWATCH_DIR", logs});
}

std::vector<int> runToEnd(const JobSpec& spec, std::vector<std::string>* outputs = nullptr) {
  Job job(spec);
  EXPECT_TRUE(job.waitExit(120s)) << "the job did not end in 120 s";
  std::vector<int> codes;
  for (int rank = 0; rank < job.ranks(); ++rank) {
    codes.push_back(job.exitStatus(rank));
    if (outputs) outputs->push_back(job.output(rank));
  }
  return codes;
}

// Exit codes of the same job without ncclwatch, run once per job.
std::vector<int> withoutNcclwatch(const JobSpec& spec) {
  static std::map<std::string, std::vector<int>> known;
  std::string key = spec.program + " " + std::to_string(spec.ranks);
  for (const auto& arg : spec.args) key += " " + arg;
  auto found = known.find(key);
  if (found != known.end()) return found->second;
  std::vector<int> codes = runToEnd(spec);
  known[key] = codes;
  return codes;
}

size_t countOf(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

std::vector<std::string> linesWith(const std::string& text, const std::string& needle) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) != std::string::npos) lines.push_back(line);
  }
  return lines;
}

size_t traceFilesIn(const std::string& directory) {
  size_t count = 0;
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator(directory, ignored)) {
    count += entry.path().extension() == ".ncclwatch";
  }
  return count;
}

// Every rank: the exit code of the run without ncclwatch, no fatal signal, and exactly one line
// that says the folder failed and why.
void expectMemoryOnly(const std::vector<int>& codes, const std::vector<std::string>& outputs,
                      const std::vector<int>& baseline, const std::string& folder,
                      const std::string& reason) {
  ASSERT_EQ(codes.size(), baseline.size());
  for (size_t rank = 0; rank < codes.size(); ++rank) {
    const std::string& out = outputs[rank];
    EXPECT_EQ(codes[rank], baseline[rank]) << "rank " << rank << "\n" << out;
    EXPECT_EQ(out.find("signal"), std::string::npos) << out;
    std::vector<std::string> said = linesWith(out, "[ncclwatch] log folder");
    ASSERT_EQ(said.size(), 1u) << out;
    EXPECT_EQ(said[0].rfind("[ncclwatch] log folder " + folder + " unusable (", 0), 0u) << said[0];
    EXPECT_NE(said[0].find(reason), std::string::npos) << said[0];
    EXPECT_NE(said[0].find("recording in memory only"), std::string::npos) << said[0];
    EXPECT_EQ(out.find("recording off"), std::string::npos) << out;
  }
}

// ---- A full disk ----

TEST(FullDisk, TrainLoopCompletes) {
  std::string logs = testsupport::freshDirectory("storage-full", false);
  std::string why = mountTmpfs(logs, 1024, false);
  if (!why.empty()) GTEST_SKIP() << "needs a 1 MiB tmpfs: " << why;
  JobSpec spec = trainJob(4, {"--steps", "300", "--quiet"});
  std::vector<int> baseline = withoutNcclwatch(spec);
  watch(spec, logs);
  std::vector<std::string> outputs;
  std::vector<int> codes = runToEnd(spec, &outputs);
  EXPECT_EQ(baseline, std::vector<int>(4, 0));
  expectMemoryOnly(codes, outputs, baseline, logs, "No space left on device");
  // What is lost: the trace file, and nothing half-written is left to mislead a reader.
  EXPECT_EQ(traceFilesIn(logs), 0u);
  umount2(logs.c_str(), MNT_DETACH);
}

TEST(FullDisk, ContinuousModeCountsWhatItCouldNotWrite) {
  // The ring (1024 records, 144 KiB) fits; the whole-run segments of 2 ranks do not.
  std::string logs = testsupport::freshDirectory("storage-full-continuous", false);
  std::string why = mountTmpfs(logs, 1024, false);
  if (!why.empty()) GTEST_SKIP() << "needs a 1 MiB tmpfs: " << why;
  JobSpec spec = trainJob(2, {"--steps", "300", "--quiet"});
  std::vector<int> baseline = withoutNcclwatch(spec);
  watch(spec, logs);
  spec.env.push_back({"NCCLWATCH_TRACE", "full"});
  spec.env.push_back({"NCCLWATCH_RING_RECORDS", "1024"});
  std::vector<std::string> outputs;
  std::vector<int> codes = runToEnd(spec, &outputs);
  EXPECT_EQ(codes, baseline);
  uint64_t failedInFiles = 0;
  for (const auto& file : testsupport::readTraceFiles(logs)) {
    EXPECT_TRUE(file.usable) << file.path;
    failedInFiles += file.header.failedSegmentWrites;
    if (file.header.failedSegmentWrites == 0) continue;
    // What a user reading the file is told.
    std::string shown;
    if (FILE* pipe = popen((std::string(NCCLWATCH_BINARY) + " show " + file.path).c_str(), "r")) {
      char buffer[4096];
      while (size_t got = fread(buffer, 1, sizeof buffer, pipe)) shown.append(buffer, got);
      pclose(pipe);
    }
    EXPECT_NE(shown.find("segment writes failed"), std::string::npos) << shown;
  }
  EXPECT_GT(failedInFiles, 0u) << "the disk should have filled up";
  size_t saidAtExit = 0;
  for (const std::string& out : outputs) {
    EXPECT_EQ(out.find("signal"), std::string::npos) << out;
    saidAtExit += linesWith(out, "segment writes (").size();
  }
  EXPECT_GE(saidAtExit, 1u) << outputs[0] << outputs[1];
  umount2(logs.c_str(), MNT_DETACH);
}

// `ncclwatch launch` in the background with rank 0's sidecar collector; every rank's output in
// one file.
class Launch : public testsupport::Child {
 public:
  Launch(const std::string& logs, const std::string& output, std::vector<std::string> program)
      : output_(output) {
    pid_ = fork();
    if (pid_ == 0) {
      int out = open(output_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(out, STDOUT_FILENO);
      dup2(out, STDERR_FILENO);
      setpgid(0, 0);
      for (const char* name : {"NCCLWATCH_COLLECTOR", "NCCLWATCH_SECRET", "NCCLWATCH_JOB",
                               "NCCLWATCH_COLLECTOR_PORT", "NCCLWATCH_CLI"}) {
        unsetenv(name);
      }
      const char* path = std::getenv("LD_LIBRARY_PATH");
      setenv("LD_LIBRARY_PATH",
             (testsupport::simLibDir() + (path ? std::string(":") + path : "")).c_str(), 1);
      setenv("LD_PRELOAD", (testsupport::buildDir() + "/lib/libncclwatch.so").c_str(), 1);
      setenv("NCCLWATCH_DIR", logs.c_str(), 1);
      // A port free a moment ago: launch's MASTER_PORT + offset may be one that other jobs on
      // this machine hold (that fault is a collector row, not this one).
      setenv("NCCLWATCH_COLLECTOR_PORT", std::to_string(testsupport::freeLoopbackPort()).c_str(),
             1);
      setenv("NCCLWATCH_HANG_MS", "1500", 1);
      setenv("NCCLWATCH_POLL_MS", "50", 1);
      setenv("NCCLWATCH_ON_HANG", "dump", 1);
      std::vector<std::string> words = {NCCLWATCH_BINARY, "launch",  "-n", "4",
                                        "--no-prefix",    "--grace", "3",  "--"};
      words.insert(words.end(), program.begin(), program.end());
      std::vector<char*> argv;
      for (std::string& word : words) argv.push_back(word.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Launch() {
    if (running()) {
      kill(-pid_, SIGKILL);
      waitExit(10s);
    }
  }
  std::string output() const { return readFile(output_); }
  bool waitForOutput(const std::regex& pattern, std::chrono::seconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (!std::regex_search(output(), pattern)) {
      if (Clock::now() >= deadline || !running()) return std::regex_search(output(), pattern);
      std::this_thread::sleep_for(100ms);
    }
    return true;
  }

 private:
  std::string output_;
};

TEST(FullDisk, SkipBugStillNamesRank3) {
  std::string logs = testsupport::freshDirectory("storage-full-skip", false);
  std::string why = mountTmpfs(logs, 1024, false);
  if (!why.empty()) GTEST_SKIP() << "needs a 1 MiB tmpfs: " << why;
  std::string output = testsupport::freshDirectory("storage-full-skip-out", true) + "/job.out";
  std::string out;
  {
    Launch job(
        logs, output,
        {trainLoop(), "--steps", "8", "--tp", "1", "--bug", "skip:rank=3,step=5", "--quiet"});
    // The live verdict, from rank 0's collector, and rank 3's own dump on stderr.
    bool verdict = job.waitForOutput(std::regex(R"(\[ncclwatch\] MISMATCH[^\n]*)"), 60s);
    bool dump = job.waitForOutput(std::regex(R"(\[ncclwatch\] rank 3 \(pid \d+\): dump)"), 30s);
    out = job.output();
    EXPECT_TRUE(verdict) << out;
    EXPECT_TRUE(dump) << out;
    EXPECT_TRUE(job.running()) << "the job should still hang: nothing aborts it\n" << out;
    job.signal(SIGTERM);
    EXPECT_TRUE(job.waitExit(30s));
    out = job.output();
  }
  EXPECT_NE(out.find("culprit 3"), std::string::npos) << out;
  EXPECT_NE(out.find("kept on stderr only (no trace file)"), std::string::npos) << out;
  EXPECT_EQ(linesWith(out, "[ncclwatch] log folder " + logs + " unusable (").size(), 4u) << out;
  EXPECT_EQ(countOf(out, "No space left on device"), 4u) << out;
  EXPECT_EQ(out.find("SIGBUS"), std::string::npos) << out;
  umount2(logs.c_str(), MNT_DETACH);
}

// ---- A trace file truncated under running ranks ----

// Cuts both ranks' files to nothing once they exist and `settle` has passed; then every rank
// must end as without ncclwatch, say so once, and count the faulted pages at exit.
void truncateUnderRunningRanks(const JobSpec& plain, std::chrono::milliseconds settle) {
  std::string logs = testsupport::freshDirectory("storage-truncated", true);
  std::vector<int> baseline = withoutNcclwatch(plain);
  JobSpec spec = plain;
  watch(spec, logs);
  spec.env.push_back({"NCCLWATCH_POLL_MS", "50"});
  Job job(spec);
  auto deadline = Clock::now() + 30s;
  while (traceFilesIn(logs) < 2 && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  ASSERT_EQ(traceFilesIn(logs), 2u);
  std::this_thread::sleep_for(settle);
  for (const auto& entry : std::filesystem::directory_iterator(logs)) {
    ASSERT_EQ(truncate(entry.path().c_str(), 0), 0) << entry.path();
  }
  ASSERT_TRUE(job.waitExit(60s)) << job.output(0) << job.output(1);
  for (int rank = 0; rank < 2; ++rank) {
    std::string out = job.output(rank);
    EXPECT_EQ(job.exitStatus(rank), baseline[rank]) << out;
    EXPECT_EQ(out.find("signal"), std::string::npos) << out;
    EXPECT_EQ(linesWith(out, "lost its storage under the job").size(), 1u) << out;
    // At exit, what the file missed: the pages that faulted.
    std::vector<std::string> atExit = linesWith(out, "pages faulted; recorded in memory only");
    ASSERT_EQ(atExit.size(), 1u) << out;
    EXPECT_EQ(atExit[0].find(" 0 pages faulted"), std::string::npos) << atExit[0];
  }
}

TEST(Truncated, RanksGoOnInMemory) {
  // The application threads are the first to store into the cut pages.
  truncateUnderRunningRanks(trainJob(2, {"--steps", "300", "--step-ms", "10", "--quiet"}), 500ms);
}

TEST(Truncated, WatchdogThreadTakesTheFault) {
  // Rank 0 pauses 2 s on the host and rank 1 waits for it inside NCCL: during the pause only
  // the watchdog threads read the rings, so one of them meets the cut page first (with fault
  // signals blocked there, as they were, the kernel killed the rank).
  truncateUnderRunningRanks(
      trainJob(2, {"--steps", "10", "--bug", "pause:rank=0,step=3,ms=2000", "--quiet"}), 700ms);
}

// ---- Log folders that cannot be used ----

// As root, permission bits bind nobody with CAP_DAC_OVERRIDE: the ranks run as root without
// capabilities (an empty bounding set), through setpriv.
JobSpec withoutCapabilities(JobSpec spec) {
  if (geteuid() != 0) return spec;
  std::vector<std::string> args = {"--bounding-set=-all", "--inh-caps=-all", "--", spec.program};
  args.insert(args.end(), spec.args.begin(), spec.args.end());
  spec.program = "/usr/bin/setpriv";
  spec.args = args;
  return spec;
}

TEST(UnusableFolder, NoPermission) {
  if (geteuid() == 0 && access("/usr/bin/setpriv", X_OK) != 0) {
    GTEST_SKIP() << "root without setpriv: permission bits cannot be tested";
  }
  std::string parent = testsupport::freshDirectory("storage-no-permission", true);
  std::string logs = parent + "/locked";
  std::filesystem::create_directories(logs);
  chmod(logs.c_str(), 0555);
  JobSpec spec = withoutCapabilities(trainJob(2, {"--steps", "20", "--quiet"}));
  std::vector<int> baseline = withoutNcclwatch(spec);
  watch(spec, logs);
  std::vector<std::string> outputs;
  std::vector<int> codes = runToEnd(spec, &outputs);
  expectMemoryOnly(codes, outputs, baseline, logs, "Permission denied");
}

TEST(UnusableFolder, FileWhereTheFolderShouldBe) {
  std::string parent = testsupport::freshDirectory("storage-file", true);
  std::string logs = parent + "/logs";
  ASSERT_TRUE(writeText(logs, "not a folder\n"));
  JobSpec spec = trainJob(2, {"--steps", "20", "--quiet"});
  std::vector<int> baseline = withoutNcclwatch(spec);
  watch(spec, logs);
  std::vector<std::string> outputs;
  std::vector<int> codes = runToEnd(spec, &outputs);
  expectMemoryOnly(codes, outputs, baseline, logs, "Not a directory");
  EXPECT_EQ(readFile(logs), "not a folder\n");
}

TEST(UnusableFolder, PathTooLong) {
  std::string parent = testsupport::freshDirectory("storage-long", true);
  std::string logs = parent + "/" + std::string(300, 'x');
  JobSpec spec = trainJob(2, {"--steps", "20", "--quiet"});
  std::vector<int> baseline = withoutNcclwatch(spec);
  watch(spec, logs);
  std::vector<std::string> outputs;
  std::vector<int> codes = runToEnd(spec, &outputs);
  expectMemoryOnly(codes, outputs, baseline, logs, "File name too long");
}

TEST(ReadOnlyFolder, ReadOnlyFileSystem) {
  std::string logs = testsupport::freshDirectory("storage-read-only", false);
  std::string why = mountTmpfs(logs, 1024, true);
  if (!why.empty()) GTEST_SKIP() << "needs a read-only tmpfs: " << why;
  JobSpec spec = trainJob(2, {"--steps", "20", "--quiet"});
  std::vector<int> baseline = withoutNcclwatch(spec);
  watch(spec, logs);
  std::vector<std::string> outputs;
  std::vector<int> codes = runToEnd(spec, &outputs);
  expectMemoryOnly(codes, outputs, baseline, logs, "Read-only file system");
  umount2(logs.c_str(), MNT_DETACH);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--private-mounts") == 0) {
      enterMountNamespace();
    } else {
      rest.push_back(argv[i]);
    }
  }
  int count = static_cast<int>(rest.size());
  testing::InitGoogleTest(&count, rest.data());
  return RUN_ALL_TESTS();
}
