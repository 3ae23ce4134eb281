#include "watchdog/relay_host.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "trace/abstract_socket.h"
#include "watchdog/sidecar.h"
#include "watchdog/spawn_process.h"

namespace ncclwatch::watchdog {
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

void RelayHost::step(const char* secret) {
  if (state_ == State::kWaiting && secret != nullptr && *secret != '\0') start(secret);
  if (state_ == State::kRunning) reap();
}

void RelayHost::start(const char* secret) {
  state_ = State::kFailed;  // one attempt only, whatever happens below
  std::string name = relaySocketName(secret, options_.collectorHost, options_.collectorPort);
  int fd = trace::listenOnAbstractName(name);
  if (fd < 0) {
    // EADDRINUSE: another rank of this host relays already (no LOCAL_RANK: the first one won).
    state_ = errno == EADDRINUSE ? State::kOtherRank : State::kFailed;
    return;
  }
  // The relay finds its socket at descriptor 3; keep ours clear of the ones the child sets up.
  if (fd <= 3) {
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    close(fd);
    if (moved < 0) return;
    fd = moved;
  }
  std::string cli = helperProgram(options_.cli);
  if (cli.empty()) {
    std::fprintf(stderr,
                 "[ncclwatch] no relay on this host: cannot tell where libncclwatch.so was "
                 "loaded from (set NCCLWATCH_CLI); its agents connect to the collector "
                 "directly\n");
    close(fd);
    return;
  }
  bool ipv6 = options_.collectorHost.find(':') != std::string::npos;
  std::string collector = (ipv6 ? "[" + options_.collectorHost + "]" : options_.collectorHost) +
                          ":" + std::to_string(options_.collectorPort);
  std::vector<std::string> arguments = {cli, "relay", "--collector", collector, "--listen-fd", "3"};
  // The parent's environment less our preload (the relay must not record itself) and the
  // secret (the relay authenticates nobody: each agent's HELLO carries it).
  std::vector<std::string> environment = helperEnvironment(options_.environment);
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
