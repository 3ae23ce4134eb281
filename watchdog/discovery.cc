#include "watchdog/discovery.h"

#include <strings.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "trace/fingerprint.h"
#include "trace/job_secret.h"
#include "trace/wire.h"

namespace ncclwatch::watchdog {
namespace {

enum SecretState : int { kNoSecret = 0, kWritingSecret = 1, kSecretReady = 2 };
std::atomic<int> g_secretState{kNoSecret};
DerivedSecretText g_secret;

bool parsePort(const char* text, int* port) {
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || value < 1 || value > 65535) return false;
  *port = static_cast<int>(value);
  return true;
}

bool isOff(const char* text) {
  for (const char* off : {"off", "0", "no", "false", "none"}) {
    if (strcasecmp(text, off) == 0) return true;
  }
  return false;
}

std::string withoutBrackets(const std::string& host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace

int defaultCollectorPort(int masterPort) {
  int port = masterPort + kCollectorPortOffset;
  return port <= 65535 ? port : masterPort - kCollectorPortOffset;
}

bool collectorFromLookup(const EnvironmentLookup& lookup, CollectorAddress* address,
                         std::string* note) {
  auto get = [&lookup](const char* name) -> const char* {
    const char* value = lookup(name);
    return value != nullptr && *value != '\0' ? value : nullptr;
  };
  *address = CollectorAddress{};
  RelayMode relay = RelayMode::kAuto;
  if (const char* text = get("NCCLWATCH_RELAY")) {
    if (isOff(text)) {
      relay = RelayMode::kOff;
    } else if (std::strcmp(text, "on") == 0 || std::strcmp(text, "1") == 0 ||
               std::strcmp(text, "yes") == 0 || std::strcmp(text, "true") == 0) {
      relay = RelayMode::kOn;
    } else if (std::strcmp(text, "auto") != 0) {
      *note = std::string("NCCLWATCH_RELAY=") + text + " is not on, off or auto; using auto";
    }
  }
  address->relay = relay;
  const char* target = get("NCCLWATCH_COLLECTOR");
  if (target != nullptr && isOff(target)) return false;
  const char* secret = get("NCCLWATCH_SECRET");
  if (secret != nullptr && std::strlen(secret) >= trace::wire::kSecretBytes) {
    *note = "no collector: NCCLWATCH_SECRET is longer than " +
            std::to_string(trace::wire::kSecretBytes - 1) + " characters";
    return false;
  }
  if (target != nullptr) {
    std::string text = target;
    size_t colon = text.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 || !parsePort(text.c_str() + colon + 1, &port)) {
      *note = "no collector: NCCLWATCH_COLLECTOR=" + text + " is not host:port or off";
      return false;
    }
    // An explicit collector was set up by whoever started the job, secret included: guessing
    // one here would only let the agent knock on a door it cannot open.
    if (secret == nullptr) {
      *note = "no collector: NCCLWATCH_COLLECTOR is set but NCCLWATCH_SECRET is not";
      return false;
    }
    address->host = withoutBrackets(text.substr(0, colon));
    address->port = port;
    address->secret = secret;
    address->relay = relay;
    return true;
  }
  const char* masterAddr = get("MASTER_ADDR");
  const char* masterPortText = get("MASTER_PORT");
  if (masterAddr == nullptr || masterPortText == nullptr) return false;
  int masterPort = 0;
  if (!parsePort(masterPortText, &masterPort)) {
    *note = std::string("no collector: MASTER_PORT=") + masterPortText + " is not a port";
    return false;
  }
  int port = defaultCollectorPort(masterPort);
  if (const char* text = get("NCCLWATCH_COLLECTOR_PORT")) {
    int chosen = 0;
    if (parsePort(text, &chosen)) {
      port = chosen;
    } else {
      *note = std::string("NCCLWATCH_COLLECTOR_PORT=") + text +
              " is not a port in [1, 65535]; using " + std::to_string(port);
    }
  }
  address->host = withoutBrackets(masterAddr);
  address->port = port;
  address->fromMasterAddr = true;
  address->relay = relay;
  if (secret != nullptr) {
    address->secret = secret;
  } else {
    address->secretFromUniqueId = true;
  }
  return true;
}

bool collectorFromEnvironment(CollectorAddress* address, std::string* note) {
  return collectorFromLookup([](const char* name) { return std::getenv(name); }, address, note);
}

void offerCommHashForSecret(uint64_t commHash) {
  // Cheap test first: every communicator init after the first one stops here.
  if (g_secretState.load(std::memory_order_relaxed) != kNoSecret) return;
  int expected = kNoSecret;
  if (!g_secretState.compare_exchange_strong(expected, kWritingSecret, std::memory_order_acquire)) {
    return;
  }
  trace::deriveSecretFromCommHash(commHash, g_secret);
  g_secretState.store(kSecretReady, std::memory_order_release);
}

bool derivedSecret(DerivedSecretText& text) {
  if (g_secretState.load(std::memory_order_acquire) != kSecretReady) return false;
  std::memcpy(text, g_secret, sizeof text);
  return true;
}

void forgetUnfinishedSecretAfterFork() {
  int expected = kWritingSecret;
  g_secretState.compare_exchange_strong(expected, kNoSecret);
}

}  // namespace ncclwatch::watchdog
