// The job's secret derived from the commHash of the first communicator a rank initialises:
// shared by the agents (which present it in HELLO) and a sidecar collector (which recognises
// its job's trace files by it when no agent reached it: docs/protocol.md).
#pragma once
#include <cstddef>
#include <cstdint>

namespace ncclwatch::trace {

inline constexpr size_t kDerivedSecretDigits = 32;
using DerivedSecretText = char[kDerivedSecretDigits + 1];

// 32 lowercase hex digits: two independent 64-bit hashes of the bytes, keyed with constants of
// our own, so that the secret is not the commHash itself. Derived from the commHash of the
// first communicator the process initialises, which both doors know without talking: the
// interposer computes it from the unique id, the profiler plugin receives it in init. Anyone who
// can read a trace file or watch the connection could compute it (the HELLO itself travels in
// clear), so it keeps out strangers, not eavesdroppers; NCCLWATCH_SECRET is for the rest.
// No allocation: the agent derives it on its watchdog thread.
void deriveSecret(const void* bytes, size_t size, DerivedSecretText& text);
// The same for a commHash.
inline void deriveSecretFromCommHash(uint64_t commHash, DerivedSecretText& text) {
  deriveSecret(&commHash, sizeof commHash, text);
}

}  // namespace ncclwatch::trace
