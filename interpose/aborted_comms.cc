#include "interpose/aborted_comms.h"

#include <cstdio>
#include <cstring>

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
  ncclComm_t previous = g_slots[slot].exchange(comm, std::memory_order_acq_rel);
  if (previous == nullptr) detail::g_abortedCommCount.fetch_add(1, std::memory_order_release);
}

void forgetAbortedByUs(ncclComm_t comm) {
  if (comm == nullptr || detail::g_abortedCommCount.load(std::memory_order_acquire) == 0) return;
  for (std::atomic<ncclComm_t>& slot : g_slots) {
    ncclComm_t expected = comm;
    if (slot.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel)) {
      detail::g_abortedCommCount.fetch_sub(1, std::memory_order_release);
    }
  }
}

bool abortedByUs(ncclComm_t comm) {
  if (comm == nullptr) return false;
  for (const std::atomic<ncclComm_t>& slot : g_slots) {
    if (slot.load(std::memory_order_acquire) == comm) return true;
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
