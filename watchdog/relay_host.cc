#include "watchdog/relay_host.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "watchdog/sidecar.h"
#include "watchdog/spawn_process.h"

namespace ncclwatch::watchdog {
namespace {

socklen_t abstractAddress(const std::string& name, sockaddr_un* address) {
  *address = sockaddr_un{};
  address->sun_family = AF_UNIX;
  size_t length = std::min(name.size(), sizeof address->sun_path - 1);
  std::memcpy(address->sun_path + 1, name.data(), length);  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + length);
}

}  // namespace

bool relayWanted(RelayMode mode, int world) {
  if (mode == RelayMode::kOn) return true;
  if (mode == RelayMode::kOff) return false;
  return world >= kRelayAutoWorld;
}

std::string relaySocketName(const std::string& secret, const std::string& collectorHost,
                            int collectorPort) {
  // FNV-1a over what names the job's collector: another job (another secret) or another
  // collector of the same job never shares the name.
  std::string key = secret + "\n" + collectorHost + ":" + std::to_string(collectorPort);
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : key) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return std::string("ncclwatch-relay-") + hex;
}

int connectToAbstractName(const std::string& name) {
  sockaddr_un address;
  socklen_t length = abstractAddress(name, &address);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 && errno != EINPROGRESS) {
    int why = errno;
    close(fd);
    errno = why;
    return -1;
  }
  return fd;
}

void RelayHost::step(const char* secret) {
  if (state_ == State::kWaiting && secret != nullptr && *secret != '\0') start(secret);
  if (state_ == State::kRunning) reap();
}

void RelayHost::start(const char* secret) {
  state_ = State::kFailed;  // one attempt only, whatever happens below
  std::string name = relaySocketName(secret, options_.collectorHost, options_.collectorPort);
  sockaddr_un address;
  socklen_t length = abstractAddress(name, &address);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0) {
    // EADDRINUSE: another rank of this host relays already (no LOCAL_RANK: the first one won).
    state_ = errno == EADDRINUSE ? State::kOtherRank : State::kFailed;
    close(fd);
    return;
  }
  if (listen(fd, 1024) != 0) {
    close(fd);
    return;
  }
  // The relay finds its socket at descriptor 3; keep ours clear of the ones the child sets up.
  if (fd <= 3) {
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    close(fd);
    if (moved < 0) return;
    fd = moved;
  }
  std::string cli = options_.cli;
  if (cli.empty()) {
    std::string library = ownLibraryPath();
    if (library.empty()) {
      std::fprintf(stderr,
                   "[ncclwatch] no relay on this host: cannot tell where libncclwatch.so was "
                   "loaded from (set NCCLWATCH_CLI); its agents connect to the collector "
                   "directly\n");
      close(fd);
      return;
    }
    cli = cliBesideLibrary(library);
  }
  bool ipv6 = options_.collectorHost.find(':') != std::string::npos;
  std::string collector = (ipv6 ? "[" + options_.collectorHost + "]" : options_.collectorHost) +
                          ":" + std::to_string(options_.collectorPort);
  std::vector<std::string> arguments = {cli, "relay", "--collector", collector, "--listen-fd", "3"};
  // The parent's environment less our preload (the relay must not record itself) and the
  // secret (the relay authenticates nobody: each agent's HELLO carries it).
  std::vector<std::string> environment;
  for (const std::string& entry : options_.environment) {
    if (entry.rfind("NCCLWATCH_SECRET=", 0) == 0) continue;
    if (entry.rfind("LD_PRELOAD=", 0) == 0) {
      std::string kept = withoutOurPreload(entry.substr(std::strlen("LD_PRELOAD=")));
      if (!kept.empty()) environment.push_back("LD_PRELOAD=" + kept);
      continue;
    }
    environment.push_back(entry);
  }
  // As the sidecar (watchdog/spawn_process.h); the listening socket becomes its fd 3.
  DetachedProcess relay{cli, std::move(arguments), std::move(environment), fd, true};
  pid_t pid = -1;
  int error = spawnDetached(relay, &pid);
  close(fd);  // the relay holds the name now; if it could not start, the name is free again
  if (error != 0) {
    std::fprintf(stderr,
                 "[ncclwatch] no relay on this host: cannot run %s: %s (NCCLWATCH_CLI names the "
                 "ncclwatch binary); its agents connect to the collector directly\n",
                 cli.c_str(), std::strerror(error));
    return;
  }
  pid_ = pid;
  state_ = State::kRunning;
}

void RelayHost::reap() {
  int status = 0;
  pid_t done = waitpid(pid_, &status, WNOHANG);
  if (done == 0 || (done < 0 && errno == EINTR)) return;
  state_ = State::kExited;  // its agents said it; the status adds nothing they need
}

}  // namespace ncclwatch::watchdog
