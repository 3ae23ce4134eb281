#include "launch_env.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

extern const char* __progname;

namespace examples {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kRendezvousTimeout = std::chrono::seconds(60);
constexpr char kMagic[8] = {'N', 'W', 'R', 'D', 'Z', 'V', '0', '1'};
constexpr size_t kJobKeyBytes = 64;

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

int envInt(const char* name, int fallback) {
  const char* text = env(name);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 0 || value > 1 << 24) {
    std::fprintf(stderr, "%s: %s=%s is not a non-negative integer\n", __progname, name, text);
    std::exit(2);
  }
  return static_cast<int>(value);
}

bool sendAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool receiveAll(int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

void setTimeouts(int fd, int seconds) {
  timeval timeout{seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
}

std::array<char, kJobKeyBytes> paddedKey(const std::string& key) {
  std::array<char, kJobKeyBytes> padded{};
  std::memcpy(padded.data(), key.data(), std::min(key.size(), kJobKeyBytes));
  return padded;
}

int rendezvousPort(const LaunchEnv& launch) {
  if (env("NCCL_UNIQUEID_PORT")) return envInt("NCCL_UNIQUEID_PORT", 0);
  if (!env("MASTER_PORT")) die(launch, "rendezvous", "MASTER_ADDR is set but MASTER_PORT is not");
  return envInt("MASTER_PORT", 0) + 1;
}

// Rank 0 answers the other ranks in the background so that it can go on into
// ncclCommInitRank, which itself waits for all of them.
void serveId(const LaunchEnv& launch, const ncclUniqueId& id) {
  int port = rendezvousPort(launch);
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int yes = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      listen(listener, 1024) != 0) {
    die(launch, "rendezvous on port " + std::to_string(port), std::strerror(errno));
  }
  auto key = paddedKey(launch.jobKey);
  std::thread([listener, id, key, clients = launch.world - 1] {
    int served = 0;
    while (served < clients) {
      int client = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) {
        if (errno == EINTR) continue;
        break;
      }
      setTimeouts(client, 10);
      char magic[8];
      std::array<char, kJobKeyBytes> theirKey{};
      // A stray connection (another job, a port scanner) gets nothing and is not counted.
      if (receiveAll(client, magic, sizeof magic) && std::memcmp(magic, kMagic, 8) == 0 &&
          receiveAll(client, theirKey.data(), theirKey.size()) && theirKey == key &&
          sendAll(client, kMagic, sizeof kMagic) && sendAll(client, &id, sizeof id)) {
        ++served;
      }
      close(client);
    }
    close(listener);
  }).detach();
}

ncclUniqueId fetchIdOverTcp(const LaunchEnv& launch) {
  const char* host = env("MASTER_ADDR");
  std::string port = std::to_string(rendezvousPort(launch));
  auto key = paddedKey(launch.jobKey);
  auto deadline = Clock::now() + kRendezvousTimeout;
  auto backoff = std::chrono::milliseconds(20);
  std::string lastError = "no answer";
  while (Clock::now() < deadline) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    int lookup = getaddrinfo(host, port.c_str(), &hints, &found);
    if (lookup != 0)
      die(launch, std::string("resolving MASTER_ADDR=") + host, gai_strerror(lookup));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setTimeouts(fd, 10);
    ncclUniqueId id;
    char magic[8];
    bool ok = connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
              sendAll(fd, kMagic, sizeof kMagic) && sendAll(fd, key.data(), key.size()) &&
              receiveAll(fd, magic, sizeof magic) && std::memcmp(magic, kMagic, 8) == 0 &&
              receiveAll(fd, &id, sizeof id);
    if (!ok) lastError = std::strerror(errno);
    close(fd);
    freeaddrinfo(found);
    if (ok) return id;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  die(launch, "fetching the NCCL unique id from " + std::string(host) + ":" + port, lastError);
}

std::string idFilePath(const LaunchEnv& launch) {
  const char* dir = env("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/nccl-example-" + launch.jobKey + ".id";
}

ncclUniqueId shareIdThroughFile(const LaunchEnv& launch, const ncclUniqueId* created) {
  std::string path = idFilePath(launch);
  if (created != nullptr) {
    std::string temporary = path + ".tmp" + std::to_string(getpid());
    std::ofstream(temporary, std::ios::binary)
        .write(reinterpret_cast<const char*>(created), sizeof *created);
    if (std::rename(temporary.c_str(), path.c_str()) != 0) {
      die(launch, "writing " + path, std::strerror(errno));
    }
    return *created;
  }
  auto deadline = Clock::now() + kRendezvousTimeout;
  while (Clock::now() < deadline) {
    std::ifstream file(path, std::ios::binary);
    ncclUniqueId id;
    if (file.read(reinterpret_cast<char*>(&id), sizeof id)) return id;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  die(launch, "reading " + path, "rank 0 did not write it within 60 s");
}

}  // namespace

void die(const LaunchEnv& launch, const std::string& what, const std::string& why) {
  std::fprintf(stderr, "%s: rank %d: %s failed: %s\n", __progname, launch.rank, what.c_str(),
               why.c_str());
  std::fflush(stderr);
  std::exit(2);
}

LaunchEnv readLaunchEnv() {
  LaunchEnv launch;
  if (env("RANK") || env("WORLD_SIZE")) {
    launch.launcher = "torchrun";
    launch.rank = envInt("RANK", 0);
    launch.world = envInt("WORLD_SIZE", 1);
    launch.localRank = envInt("LOCAL_RANK", launch.rank);
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    launch.launcher = "openmpi";
    launch.rank = envInt("OMPI_COMM_WORLD_RANK", 0);
    launch.world = envInt("OMPI_COMM_WORLD_SIZE", 1);
    launch.localRank = envInt("OMPI_COMM_WORLD_LOCAL_RANK", launch.rank);
  } else if (env("SLURM_PROCID")) {
    launch.launcher = "slurm";
    launch.rank = envInt("SLURM_PROCID", 0);
    launch.world = envInt("SLURM_NTASKS", 1);
    launch.localRank = envInt("SLURM_LOCALID", launch.rank);
  } else {
    launch.launcher = "none";
  }
  if (launch.world < 1 || launch.rank >= launch.world) {
    die(launch, "reading the launcher's variables",
        "rank " + std::to_string(launch.rank) + " is not below world size " +
            std::to_string(launch.world));
  }
  for (const char* name : {"NCCLWATCH_JOB", "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid"}) {
    const char* value = env(name);
    // torchrun's static rendezvous names every run "none"; MASTER_PORT below tells jobs apart.
    if (value != nullptr && std::strcmp(name, "TORCHELASTIC_RUN_ID") == 0 &&
        std::strcmp(value, "none") == 0) {
      continue;
    }
    if (value != nullptr) {
      launch.jobKey = value;
      break;
    }
  }
  if (launch.jobKey.empty() && env("SLURM_JOB_ID")) {
    launch.jobKey = std::string(env("SLURM_JOB_ID")) + "." +
                    (env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : "0");
  }
  if (launch.jobKey.empty() && env("MASTER_PORT"))
    launch.jobKey = std::string("port") + env("MASTER_PORT");
  if (launch.jobKey.empty()) launch.jobKey = "single";
  for (char& c : launch.jobKey) {
    if (c == '/' || c == ' ') c = '_';  // it becomes part of a file name
  }
  return launch;
}

ncclUniqueId shareUniqueId(const LaunchEnv& launch) {
  ncclUniqueId id;
  if (launch.rank == 0) {
    ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) die(launch, "ncclGetUniqueId", ncclGetErrorString(result));
  }
  if (launch.world == 1) return id;
  if (env("MASTER_ADDR")) {
    if (launch.rank == 0) {
      serveId(launch, id);
      return id;
    }
    return fetchIdOverTcp(launch);
  }
  return shareIdThroughFile(launch, launch.rank == 0 ? &id : nullptr);
}

}  // namespace examples
