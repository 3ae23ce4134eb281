#include "config.h"

#include "shm.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace ncclsim {
namespace {

std::vector<std::string> splitOn(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream stream(text);
  while (std::getline(stream, part, separator)) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

bool parseUnsigned(const std::string& text, uint64_t* value) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long parsed = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || text[0] == '-') return false;
  *value = parsed;
  return true;
}

bool parseOneFault(const std::string& entry, Fault* fault, std::string* error) {
  const size_t colon = entry.find(':');
  const std::string kind = entry.substr(0, colon);
  if (kind == "slow")
    fault->kind = FaultKind::kSlow;
  else if (kind == "stall")
    fault->kind = FaultKind::kStall;
  else if (kind == "crash")
    fault->kind = FaultKind::kCrash;
  else if (kind == "neterror")
    fault->kind = FaultKind::kNetError;
  else if (kind == "pause")
    fault->kind = FaultKind::kPause;
  else {
    *error = "unknown fault kind '" + kind + "' (want slow, pause, stall, crash or neterror)";
    return false;
  }
  bool haveRank = false;
  const std::string fields = colon == std::string::npos ? "" : entry.substr(colon + 1);
  for (const std::string& field : splitOn(fields, ',')) {
    const size_t equals = field.find('=');
    const std::string key = field.substr(0, equals);
    const std::string text = equals == std::string::npos ? "" : field.substr(equals + 1);
    uint64_t number = 0;
    if (key == "error") {
      if (text == "remote")
        fault->systemError = false;
      else if (text == "system")
        fault->systemError = true;
      else {
        *error = "'" + entry + "': error must be remote or system";
        return false;
      }
      continue;
    }
    if (!parseUnsigned(text, &number)) {
      *error = "'" + entry + "': field '" + field + "' needs a non-negative integer";
      return false;
    }
    if (key == "rank") {
      fault->rank = static_cast<int>(number);
      haveRank = true;
    } else if (key == "seq") {
      if (number == 0) {
        *error = "'" + entry + "': seq is 1-based";
        return false;
      }
      fault->seq = number;
    } else if (key == "comm") {
      fault->commIndex = static_cast<int>(number);
    } else if (key == "us") {
      fault->delayUs = number;
    } else {
      *error = "'" + entry + "': unknown field '" + key + "'";
      return false;
    }
  }
  if (!haveRank) {
    *error = "'" + entry + "': rank=R is required";
    return false;
  }
  return true;
}

}  // namespace

bool parseFaults(const std::string& text, std::vector<Fault>* faults, std::string* error) {
  for (const std::string& entry : splitOn(text, ';')) {
    Fault fault;
    if (!parseOneFault(entry, &fault, error)) return false;
    faults->push_back(fault);
  }
  return true;
}

bool mismatchProceeds(const SimConfig& config, const CollDescriptor& mine,
                      const CollDescriptor& theirs) {
  if (config.mismatchHang || mine.bytes != theirs.bytes) return false;
  if (config.mismatchCorrupt) return true;
  // NCCL moves bytes: it notices neither another element type of the same size nor another
  // reduction. Another operation or root makes the ranks run different protocols: a hang.
  if (mine.kind != theirs.kind) return false;
  return !collKindHasRoot(static_cast<CollKind>(mine.kind)) || mine.root == theirs.root;
}

SimConfig parseSimConfig(const char* (*lookup)(const char*)) {
  SimConfig config;
  auto value = [&](const char* name) -> std::string {
    const char* text = lookup(name);
    return text ? text : "";
  };
  const std::string mismatch = value("NCCLSIM_MISMATCH");
  config.mismatchCorrupt = mismatch == "corrupt";
  config.mismatchHang = mismatch == "hang";
  if (!mismatch.empty() && mismatch != "corrupt" && mismatch != "hang" && mismatch != "nccl") {
    std::fprintf(stderr, "ncclsim: NCCLSIM_MISMATCH=%s is not nccl, hang or corrupt; using nccl\n",
                 mismatch.c_str());
  }
  config.instant = value("NCCLSIM_INSTANT") == "1";
  config.debug = value("NCCLSIM_DEBUG") == "1";
  uint64_t waitMs = 0;
  if (parseUnsigned(value("NCCLSIM_DEBUG_WAIT_MS"), &waitMs))
    config.debugWaitMs = static_cast<int>(waitMs);
  std::string error;
  if (!parseFaults(value("NCCLSIM_FAULT"), &config.faults, &error)) {
    // A typo in a fault spec must not silently run a clean job: say so loudly, inject nothing.
    std::fprintf(stderr, "ncclsim: ignoring NCCLSIM_FAULT: %s\n", error.c_str());
    config.faults.clear();
  }
  return config;
}

}  // namespace ncclsim
