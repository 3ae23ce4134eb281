// The rank-0 sidecar collector: its command line and environment, where it listens, what counts
// as this host, and a real spawn of a stand-in CLI from a thread that blocks every signal (as
// the watchdog thread does): the child gets an empty mask, its own process group, stdout on
// stderr, none of the host's other descriptors, and is reaped without blocking.
#include "watchdog/sidecar.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using ncclwatch::watchdog::Sidecar;
using ncclwatch::watchdog::SidecarOptions;

std::string freshDirectory() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/ncclwatch-sidecar-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return "/tmp";
  return pattern;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// "key=value" lines of the stand-in CLI's record.
std::map<std::string, std::string> fields(const std::string& text) {
  std::map<std::string, std::string> result;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    size_t equals = line.find('=');
    if (equals != std::string::npos) result[line.substr(0, equals)] = line.substr(equals + 1);
  }
  return result;
}

// Runs `body` on a thread with every signal blocked, like the watchdog thread, with its stderr
// (and so the spawned child's) going to `stderrPath`.
template <typename Body>
void onBlockedThreadWithStderrTo(const std::string& stderrPath, Body&& body) {
  int file = open(stderrPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  int saved = dup(STDERR_FILENO);
  dup2(file, STDERR_FILENO);
  close(file);
  std::thread thread([&] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, nullptr);
    body();
  });
  thread.join();
  dup2(saved, STDERR_FILENO);
  close(saved);
}

TEST(SidecarCommand, PreloadLosesOnlyOurLibrary) {
  using ncclwatch::watchdog::withoutOurPreload;
  EXPECT_EQ(withoutOurPreload("/opt/nw/lib/libncclwatch.so"), "");
  EXPECT_EQ(withoutOurPreload("/a/libfoo.so:/opt/nw/lib/libncclwatch.so /b/libbar.so"),
            "/a/libfoo.so:/b/libbar.so");
  EXPECT_EQ(withoutOurPreload("libncclwatch.so.0.1 libjemalloc.so"), "libjemalloc.so");
  // Only the file's own name counts, not a folder that happens to carry ours.
  EXPECT_EQ(withoutOurPreload("/opt/libncclwatch-tools/libfoo.so"),
            "/opt/libncclwatch-tools/libfoo.so");
  EXPECT_EQ(withoutOurPreload("::/a/libfoo.so  "), "/a/libfoo.so");
}

TEST(SidecarCommand, EnvironmentCarriesTheSecretAndNotOurPreload) {
  std::vector<std::string> child = ncclwatch::watchdog::sidecarEnvironment(
      {"PATH=/usr/bin", "LD_PRELOAD=/a/libfoo.so /x/libncclwatch.so", "NCCLWATCH_SECRET=stale",
       "RANK=0"},
      "0123abcd");
  EXPECT_EQ(child, (std::vector<std::string>{"PATH=/usr/bin", "LD_PRELOAD=/a/libfoo.so", "RANK=0",
                                             "NCCLWATCH_SECRET=0123abcd"}));
  child = ncclwatch::watchdog::sidecarEnvironment({"LD_PRELOAD=/x/libncclwatch.so"}, "s");
  EXPECT_EQ(child, (std::vector<std::string>{"NCCLWATCH_SECRET=s"}));
}

TEST(SidecarCommand, ListensWhereTheAgentsWillLook) {
  using ncclwatch::watchdog::sidecarListenAddress;
  EXPECT_EQ(sidecarListenAddress("127.0.0.1", 29517), "127.0.0.1:29517");
  EXPECT_EQ(sidecarListenAddress("localhost", 29517), "127.0.0.1:29517");
  EXPECT_EQ(sidecarListenAddress("::1", 29517), "[::1]:29517");
  EXPECT_EQ(sidecarListenAddress("10.0.0.1", 29517), "0.0.0.0:29517");
  EXPECT_EQ(sidecarListenAddress("node0.cluster", 29517), "0.0.0.0:29517");
  EXPECT_EQ(sidecarListenAddress("fd00::7", 29517), "[::]:29517");
}

TEST(SidecarCommand, ArgumentsNameTheSecretVariableNeverTheSecret) {
  SidecarOptions options;
  options.masterAddr = "10.0.0.1";
  options.port = 29517;
  options.directory = "/logs/job";
  EXPECT_EQ(ncclwatch::watchdog::sidecarArguments("/opt/nw/bin/ncclwatch", options),
            (std::vector<std::string>{"/opt/nw/bin/ncclwatch", "collect", "--listen",
                                      "0.0.0.0:29517", "--secret-env", "NCCLWATCH_SECRET", "--dir",
                                      "/logs/job", "--until-idle", "--listen-wait-ms", "10000"}));
  EXPECT_EQ(ncclwatch::watchdog::cliBesideLibrary("/opt/nw/lib/libncclwatch.so"),
            "/opt/nw/lib/../bin/ncclwatch");
}

TEST(SidecarCommand, OwnLibraryPathIsAbsolute) {
  // Linked into this test, "our library" is the test executable.
  std::string path = ncclwatch::watchdog::ownLibraryPath();
  ASSERT_FALSE(path.empty());
  EXPECT_EQ(path.front(), '/');
  EXPECT_TRUE(std::filesystem::equivalent(path, "/proc/self/exe")) << path;
}

TEST(LocalAddress, LoopbackHostNameAndInterfacesAreLocal) {
  using ncclwatch::watchdog::isLocalAddress;
  EXPECT_TRUE(isLocalAddress("127.0.0.1"));
  EXPECT_TRUE(isLocalAddress("127.4.5.6"));
  EXPECT_TRUE(isLocalAddress("localhost"));
  EXPECT_TRUE(isLocalAddress("::1"));
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  EXPECT_TRUE(isLocalAddress(host));
  ifaddrs* interfaces = nullptr;
  ASSERT_EQ(getifaddrs(&interfaces), 0);
  for (ifaddrs* interface = interfaces; interface != nullptr; interface = interface->ifa_next) {
    if (interface->ifa_addr == nullptr || interface->ifa_addr->sa_family != AF_INET) continue;
    char text[NI_MAXHOST];
    getnameinfo(interface->ifa_addr, sizeof(sockaddr_in), text, sizeof text, nullptr, 0,
                NI_NUMERICHOST);
    EXPECT_TRUE(isLocalAddress(text)) << text;
  }
  freeifaddrs(interfaces);
  // TEST-NET addresses (RFC 5737) belong to nobody.
  EXPECT_FALSE(isLocalAddress("192.0.2.1"));
  EXPECT_FALSE(isLocalAddress("203.0.113.5"));
}

class SidecarSpawn : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = freshDirectory();
    cli_ = directory_ + "/ncclwatch";
    record_ = directory_ + "/record";
    // Stands in for `ncclwatch collect`: writes down how it was started, says one line on
    // stdout and one on stderr, and ends with status 3.
    std::ofstream(cli_) << R"(#!/bin/sh
{
  echo "args=$*"
  echo "secret=$NCCLWATCH_SECRET"
  echo "preload=${LD_PRELOAD-unset}"
  echo "keep=$SIDECAR_TEST_KEEP"
  while read -r key value; do
    case "$key" in SigBlk:) echo "sigblk=$value" ;; SigIgn:) echo "sigign=$value" ;; esac
  done < /proc/$$/status
  read -r stat < /proc/$$/stat
  set -- $stat
  echo "pgid=$5"
  if [ -e /proc/$$/fd/57 ]; then echo "leaked=yes"; else echo "leaked=no"; fi
  if [ -t 0 ] || read -r anything; then echo "stdin=readable"; else echo "stdin=empty"; fi
} > "$RECORD.tmp"
echo "sidecar says on stdout"
echo "sidecar says on stderr" >&2
mv "$RECORD.tmp" "$RECORD"
exit 3
)";
    chmod(cli_.c_str(), 0700);
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }

  SidecarOptions options(const std::string& cli) {
    SidecarOptions options;
    options.masterAddr = "127.0.0.1";
    options.port = 29517;
    options.directory = directory_;
    options.cli = cli;
    options.environment = {"PATH=/usr/bin:/bin", "RECORD=" + record_,
                           "LD_PRELOAD=/a/libfoo.so /x/lib/libncclwatch.so",
                           "SIDECAR_TEST_KEEP=kept", "NCCLWATCH_SECRET=stale"};
    return options;
  }

  std::string directory_, cli_, record_;
};

TEST_F(SidecarSpawn, StartsOnceTheSecretIsKnownAndIsReapedWithoutBlocking) {
  // A descriptor the host left open across exec, and SIGINT ignored by the host.
  int leaked = open("/dev/null", O_RDONLY);
  ASSERT_EQ(dup2(leaked, 57), 57);
  close(leaked);
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGINT, &ignore, &previous);

  Sidecar sidecar(options(cli_));
  std::string stderrPath = directory_ + "/stderr";
  onBlockedThreadWithStderrTo(stderrPath, [&] {
    sidecar.step(nullptr);  // no secret yet: nothing starts
    EXPECT_EQ(sidecar.state(), Sidecar::State::kWaiting);
    sidecar.step("feedface");
    // The same step reaps without waiting, so a quick child may already be reaped here.
    EXPECT_TRUE(sidecar.state() == Sidecar::State::kRunning ||
                sidecar.state() == Sidecar::State::kExited);
    auto deadline = std::chrono::steady_clock::now() + 20s;
    while (sidecar.state() == Sidecar::State::kRunning &&
           std::chrono::steady_clock::now() < deadline) {
      auto before = std::chrono::steady_clock::now();
      sidecar.step("feedface");
      EXPECT_LT(std::chrono::steady_clock::now() - before, 100ms);  // WNOHANG: never waits
      std::this_thread::sleep_for(5ms);
    }
  });
  sigaction(SIGINT, &previous, nullptr);
  close(57);
  ASSERT_EQ(sidecar.state(), Sidecar::State::kExited);
  EXPECT_EQ(sidecar.exitStatus(), 3);
  EXPECT_GT(sidecar.pid(), 0);

  auto record = fields(readFile(record_));
  EXPECT_EQ(record["args"],
            "collect --listen 127.0.0.1:29517 --secret-env NCCLWATCH_SECRET --dir " + directory_ +
                " --until-idle --listen-wait-ms 10000");
  EXPECT_EQ(record["secret"], "feedface");
  EXPECT_EQ(record["preload"], "/a/libfoo.so");
  EXPECT_EQ(record["keep"], "kept");
  EXPECT_EQ(record["sigblk"], "0000000000000000");
  EXPECT_EQ(std::stoull(record["sigign"], nullptr, 16) & (1ull << (SIGINT - 1)), 0u);
  EXPECT_EQ(record["pgid"], std::to_string(sidecar.pid()));  // a process group of its own
  EXPECT_EQ(record["leaked"], "no");
  EXPECT_EQ(record["stdin"], "empty");
  std::string stderrText = readFile(stderrPath);
  EXPECT_NE(stderrText.find("sidecar says on stdout"), std::string::npos) << stderrText;
  EXPECT_NE(stderrText.find("sidecar says on stderr"), std::string::npos) << stderrText;
  EXPECT_NE(stderrText.find("ended with status 3"), std::string::npos) << stderrText;
}

TEST_F(SidecarSpawn, MissingCliSaysSoOnceAndNeverRetries) {
  Sidecar sidecar(options(directory_ + "/no-such-ncclwatch"));
  std::string stderrPath = directory_ + "/stderr";
  onBlockedThreadWithStderrTo(stderrPath, [&] {
    for (int i = 0; i < 3; ++i) sidecar.step("feedface");
  });
  EXPECT_EQ(sidecar.state(), Sidecar::State::kFailed);
  std::string stderrText = readFile(stderrPath);
  EXPECT_NE(stderrText.find("[ncclwatch] no sidecar collector: cannot run " + directory_ +
                            "/no-such-ncclwatch"),
            std::string::npos)
      << stderrText;
  EXPECT_EQ(stderrText.find("no sidecar collector"), stderrText.rfind("no sidecar collector"));
}

}  // namespace
