#include "interpose/aborted_comms.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

namespace ncclwatch::interpose {
namespace {

std::atomic<ncclComm_t> g_slots[kAbortedCommSlots];
std::atomic<size_t> g_nextSlot{0};

// The application's own teardown of a communicator NCCL already freed: nothing is left to do.
bool isTeardown(const char* function) {
  static constexpr const char*
      kTeardown[] = {"ncclCommAbort",        "ncclCommDestroy",    "ncclCommFinalize",
                     "ncclCommRevoke",       "ncclCommDeregister", "ncclCommWindowDeregister",
                     "ncclCommGetAsyncError"};  // its answer is the async error it fills in
  for (const char* name : kTeardown) {
    if (std::strcmp(function, name) == 0) return true;
  }
  return false;
}

}  // namespace

void rememberAbortedByUs(ncclComm_t comm) {
  if (comm == nullptr || abortedByUs(comm)) return;
  size_t slot = g_nextSlot.fetch_add(1, std::memory_order_relaxed) % kAbortedCommSlots;
  g_slots[slot].store(comm, std::memory_order_seq_cst);
  detail::g_abortsEver.fetch_add(1, std::memory_order_seq_cst);
}

bool waitUntilNoneInside(const std::atomic<int>& inside, int boundMs) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(boundMs);
  while (inside.load(std::memory_order_seq_cst) > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

bool waitForColdCallsToLeave(int boundMs) {
  return waitUntilNoneInside(detail::g_coldCallsInside, boundMs);
}

void forgetAbortedByUs(ncclComm_t comm) {
  if (comm == nullptr || detail::g_abortsEver.load(std::memory_order_seq_cst) == 0) return;
  for (std::atomic<ncclComm_t>& slot : g_slots) {
    ncclComm_t expected = comm;
    slot.compare_exchange_strong(expected, nullptr, std::memory_order_seq_cst);
  }
}

bool abortedByUs(ncclComm_t comm) {
  if (comm == nullptr) return false;
  for (const std::atomic<ncclComm_t>& slot : g_slots) {
    if (slot.load(std::memory_order_seq_cst) == comm) return true;
  }
  return false;
}

ncclResult_t answerOnAbortedComm(const char* function) {
  if (isTeardown(function)) return ncclSuccess;
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    std::fprintf(stderr,
                 "[ncclwatch] %s on a communicator that ncclwatch aborted: answered "
                 "ncclRemoteError without calling NCCL, which freed it (later calls the same)\n",
                 function);
  }
  return ncclRemoteError;
}

void fillAsyncErrorOnAbortedComm(ncclResult_t* asyncError) {
  if (asyncError != nullptr) *asyncError = ncclRemoteError;
}

const char* lastErrorOnAbortedComm() {
  return "ncclwatch aborted this communicator: a collective on it hung (see the ncclwatch "
         "verdict on stderr)";
}

}  // namespace ncclwatch::interpose
