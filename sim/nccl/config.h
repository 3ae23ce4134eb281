// The sim's environment variables (docs/plan.md, docs/sim.md), parsed into plain values.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ncclsim {

// kPause: the operation at seq S alone waits `delayUs` and then goes on, as a network hiccup
// that recovers (kSlow delays every operation from S on; kStall never recovers).
enum class FaultKind { kSlow, kStall, kCrash, kNetError, kPause };

struct Fault {
  FaultKind kind = FaultKind::kSlow;
  int rank = 0;
  uint64_t seq = 1;          // 1-based operation index on the communicator
  int commIndex = 0;         // communicators in creation order within the process
  bool systemError = false;  // neterror: ncclSystemError instead of ncclRemoteError
  uint64_t delayUs = 1000;   // slow, pause
};

struct CollDescriptor;

struct SimConfig {
  // NCCLSIM_MISMATCH. Unset (`nccl`): what NCCL does: a collective whose ranks differ only in
  // element type (equal byte size) or reduction completes with wrong data, any other mismatch
  // hangs. `corrupt`: every mismatch of equal byte size completes; `hang`: every mismatch hangs.
  bool mismatchCorrupt = false;  // NCCLSIM_MISMATCH=corrupt
  bool mismatchHang = false;     // NCCLSIM_MISMATCH=hang
  bool instant = false;          // NCCLSIM_INSTANT=1
  bool debug = false;            // NCCLSIM_DEBUG=1
  int debugWaitMs = 2000;        // NCCLSIM_DEBUG_WAIT_MS
  std::vector<Fault> faults;     // NCCLSIM_FAULT
};

// Whether a collective on which two ranks posted different descriptors proceeds (silently
// corrupting its results) instead of hanging, under `config`'s mismatch mode.
bool mismatchProceeds(const SimConfig& config, const CollDescriptor& mine,
                      const CollDescriptor& theirs);

// Parses NCCLSIM_FAULT. On a malformed entry, returns false and says why in *error.
bool parseFaults(const std::string& text, std::vector<Fault>* faults, std::string* error);

// Builds the configuration from the given getenv-like lookup (tests pass their own).
SimConfig parseSimConfig(const char* (*lookup)(const char*));

}  // namespace ncclsim
