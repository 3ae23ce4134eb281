#include "watchdog/sidecar.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "watchdog/spawn_process.h"

extern char** environ;

namespace ncclwatch::watchdog {
namespace {

constexpr char kSecretVariable[] = "NCCLWATCH_SECRET";

bool startsWith(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

// The file mapped at `address`, from /proc/self/maps (always an absolute path).
std::string mappedFileAt(const void* address) {
  auto wanted = reinterpret_cast<uintptr_t>(address);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, device, inode, path;
    if (!(fields >> range >> perms >> offset >> device >> inode >> path)) continue;
    size_t dash = range.find('-');
    if (dash == std::string::npos || path.empty() || path.front() != '/') continue;
    uintptr_t low = std::strtoull(range.c_str(), nullptr, 16);
    uintptr_t high = std::strtoull(range.c_str() + dash + 1, nullptr, 16);
    if (wanted >= low && wanted < high) return path;
  }
  return "";
}

bool isLoopbackLiteral(const std::string& host) {
  if (strcasecmp(host.c_str(), "localhost") == 0) return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

bool isLoopback(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    return (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

bool sameHost(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

}  // namespace

SidecarOptions sidecarFromEnvironment(const CollectorAddress& address) {
  SidecarOptions options;
  options.masterAddr = address.host;
  options.port = address.port;
  const char* cli = std::getenv("NCCLWATCH_CLI");
  if (cli != nullptr && *cli != '\0') options.cli = cli;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    options.environment.emplace_back(*entry);
  }
  return options;
}

std::string withoutOurPreload(const std::string& list) {
  std::string kept;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find_first_of(": ", start);
    if (end == std::string::npos) end = list.size();
    std::string entry = list.substr(start, end - start);
    size_t slash = entry.rfind('/');
    std::string base = slash == std::string::npos ? entry : entry.substr(slash + 1);
    if (!entry.empty() && base.find("libncclwatch") == std::string::npos) {
      if (!kept.empty()) kept += ':';
      kept += entry;
    }
    start = end + 1;
  }
  return kept;
}

std::vector<std::string> helperEnvironment(const std::vector<std::string>& parent) {
  std::vector<std::string> child;
  for (const std::string& entry : parent) {
    if (startsWith(entry, "NCCLWATCH_SECRET=")) continue;
    if (startsWith(entry, "LD_PRELOAD=")) {
      std::string kept = withoutOurPreload(entry.substr(std::strlen("LD_PRELOAD=")));
      if (!kept.empty()) child.push_back("LD_PRELOAD=" + kept);
      continue;
    }
    child.push_back(entry);
  }
  return child;
}

std::vector<std::string> sidecarEnvironment(const std::vector<std::string>& parent,
                                            const std::string& secret) {
  std::vector<std::string> child = helperEnvironment(parent);
  child.push_back(std::string(kSecretVariable) + "=" + secret);
  return child;
}

std::string sidecarListenAddress(const std::string& masterAddr, int port) {
  std::string host;
  in6_addr v6{};
  bool ipv6Literal = inet_pton(AF_INET6, masterAddr.c_str(), &v6) == 1;
  if (isLoopbackLiteral(masterAddr)) {
    // A single-machine job: nobody beyond this host needs to reach the collector.
    host = ipv6Literal ? "[::1]" : "127.0.0.1";
  } else {
    // Agents resolve MASTER_ADDR to IPv4 first (exchange.cc), so IPv4 unless it is an IPv6
    // literal; the secret, not the address, keeps strangers out.
    host = ipv6Literal ? "[::]" : "0.0.0.0";
  }
  return host + ":" + std::to_string(port);
}

std::vector<std::string> sidecarArguments(const std::string& cli, const SidecarOptions& options) {
  std::vector<std::string> arguments = {cli,
                                        "collect",
                                        "--listen",
                                        sidecarListenAddress(options.masterAddr, options.port),
                                        "--secret-env",
                                        kSecretVariable};
  if (!options.directory.empty()) {
    arguments.push_back("--dir");
    arguments.push_back(options.directory);
  }
  arguments.push_back("--until-idle");
  // An elastic restart's new sidecar may find the failed attempt's still on the port for the
  // second it takes to notice its agents are gone.
  arguments.push_back("--listen-wait-ms");
  arguments.push_back("10000");
  return arguments;
}

std::string cliBesideLibrary(const std::string& libraryPath) {
  size_t slash = libraryPath.rfind('/');
  std::string directory = slash == std::string::npos ? "." : libraryPath.substr(0, slash);
  return directory + "/../bin/ncclwatch";
}

std::string ownLibraryPath() {
  const void* self = reinterpret_cast<const void*>(&ownLibraryPath);
  Dl_info info{};
  if (dladdr(self, &info) != 0 && info.dli_fname != nullptr && info.dli_fname[0] == '/') {
    return info.dli_fname;
  }
  // A relative LD_PRELOAD entry is relative to where the process started, which may no longer
  // be the working directory; the kernel's map of the process names the file absolutely.
  return mappedFileAt(self);
}

std::string helperProgram(const std::string& configured) {
  if (!configured.empty()) return configured;
  std::string library = ownLibraryPath();
  return library.empty() ? std::string() : cliBesideLibrary(library);
}

bool isLocalAddress(const std::string& host) {
  if (isLoopbackLiteral(host)) return true;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0 && strcasecmp(name, host.c_str()) == 0) return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) interfaces = nullptr;
  bool local = false;
  for (addrinfo* candidate = found; candidate != nullptr && !local;
       candidate = candidate->ai_next) {
    local = isLoopback(candidate->ai_addr);
    for (ifaddrs* interface = interfaces; interface != nullptr && !local;
         interface = interface->ifa_next) {
      local = interface->ifa_addr != nullptr && sameHost(interface->ifa_addr, candidate->ai_addr);
    }
  }
  if (interfaces != nullptr) freeifaddrs(interfaces);
  freeaddrinfo(found);
  return local;
}

void Sidecar::step(const char* secret) {
  if (state_ == State::kWaiting && secret != nullptr && *secret != '\0') spawn(secret);
  if (state_ == State::kRunning) reap();
}

void Sidecar::spawn(const char* secret) {
  state_ = State::kFailed;  // one attempt only, whatever happens below
  std::string cli = helperProgram(options_.cli);
  if (cli.empty()) {
    std::fprintf(stderr,
                 "[ncclwatch] no sidecar collector: cannot tell where libncclwatch.so was "
                 "loaded from (set NCCLWATCH_CLI); local detection only\n");
    return;
  }
  if (!isLocalAddress(options_.masterAddr)) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    std::fprintf(stderr,
                 "[ncclwatch] the sidecar collector listens here (%s, port %d) but MASTER_ADDR=%s "
                 "is not this host: the agents will look for it there\n",
                 host, options_.port, options_.masterAddr.c_str());
  }
  std::vector<std::string> arguments = sidecarArguments(cli, options_);
  std::vector<std::string> environment = sidecarEnvironment(options_.environment, secret);
  // It prints verdicts on its stderr, rank 0's, and reads nothing; a process group of its own,
  // so that a launcher killing rank 0's group (a crash, a timeout) leaves the collector to
  // report it (--until-idle ends it once the agents are gone).
  DetachedProcess collector{cli, std::move(arguments), std::move(environment)};
  pid_t pid = -1;
  int error = spawnDetached(collector, &pid);
  if (error != 0) {
    std::fprintf(stderr,
                 "[ncclwatch] no sidecar collector: cannot run %s: %s (NCCLWATCH_CLI names the "
                 "ncclwatch binary); local detection only\n",
                 cli.c_str(), std::strerror(error));
    return;
  }
  pid_ = pid;
  state_ = State::kRunning;
}

void Sidecar::reap() {
  int status = 0;
  pid_t done = waitpid(pid_, &status, WNOHANG);
  if (done == 0 || (done < 0 && errno == EINTR)) return;
  state_ = State::kExited;
  if (done != pid_) return;  // ECHILD: the host reaps every child itself, or ignores SIGCHLD
  exitStatus_ = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  // 0: no verdict, 1: verdicts were reported; anything else is worth a line.
  if (exitStatus_ > 1) {
    std::fprintf(stderr, "[ncclwatch] the sidecar collector (pid %d) ended with status %d\n",
                 static_cast<int>(pid_), exitStatus_);
  }
}

}  // namespace ncclwatch::watchdog
