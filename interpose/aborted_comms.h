// Communicators ncclwatch aborted behind the application's back (`ncclwatch run --abort`,
// NCCLWATCH_ON_HANG=abort). NCCL frees a communicator inside ncclCommAbort, yet the application
// still holds its handle: PyTorch's watchdog keeps polling ncclCommGetAsyncError on it and later
// calls its own ncclCommAbort, a use after free in NCCL. The wrappers answer every call on such
// a handle themselves and never forward it: the application sees the communicator failed (a
// remote error, since a peer's hang caused it), and its own teardown (abort, destroy, finalize)
// succeeds with nothing left to free. A new communicator that NCCL places at a remembered
// address clears it.
#pragma once
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <type_traits>

namespace ncclwatch::interpose {

namespace detail {
// Handles ever remembered (never goes down): 0 in every healthy process, where the wrappers'
// check is this one load.
inline std::atomic<uint64_t> g_abortsEver{0};
// Threads inside a wrapper other than a collective's or a send's (ColdCallScope): the abort
// waits for them to leave NCCL before it frees the communicator.
inline std::atomic<int> g_coldCallsInside{0};
}  // namespace detail

// Around every wrapper but the collectives' and point-to-point ones (those are the hot path):
// PyTorch's watchdog thread polls ncclCommGetAsyncError on the communicator ncclwatch is about to
// abort, and a call already inside NCCL when NCCL frees it would read freed memory. The count
// goes up before the wrapper checks for an aborted handle, and the abort counts its handle in
// before it waits for the count to drain (both sequentially consistent: either the call sees
// the handle and never enters NCCL, or the abort sees the call and waits for it).
class ColdCallScope {
 public:
  ColdCallScope() { detail::g_coldCallsInside.fetch_add(1, std::memory_order_seq_cst); }
  ~ColdCallScope() { detail::g_coldCallsInside.fetch_sub(1, std::memory_order_release); }
  ColdCallScope(const ColdCallScope&) = delete;
  ColdCallScope& operator=(const ColdCallScope&) = delete;
};

// How many aborted handles are remembered at once; the oldest makes room for a newer one.
constexpr size_t kAbortedCommSlots = 64;

// Before ncclwatch's own ncclCommAbort of `comm`: from then on its calls are answered here.
void rememberAbortedByUs(ncclComm_t comm);
// After rememberAbortedByUs: waits (at most `boundMs`) until no thread is inside a cold wrapper
// (ColdCallScope), one of which may be in NCCL on the handle; false when the bound ran out (a
// thread blocked in another communicator's init or destroy).
bool waitForColdCallsToLeave(int boundMs);
// Waits (at most `boundMs`) until a count of threads inside something drops to zero; false when
// the bound ran out.
bool waitUntilNoneInside(const std::atomic<int>& inside, int boundMs);
// NCCL made a new communicator at `comm`'s address: it is live again.
void forgetAbortedByUs(ncclComm_t comm);
bool abortedByUs(ncclComm_t comm);

// Whether any argument of a call is a communicator ncclwatch aborted (one load when none ever
// was: the wrappers' hot path; a plain load on x86 even sequentially consistent).
template <typename... Args>
bool callsAnAbortedComm(const Args&... args) {
  if (detail::g_abortsEver.load(std::memory_order_seq_cst) == 0) return false;
  auto aborted = [](const auto& arg) {
    if constexpr (std::is_same_v<std::remove_cv_t<std::remove_reference_t<decltype(arg)>>,
                                 ncclComm_t>) {
      return abortedByUs(arg);
    } else {
      return false;
    }
  };
  return (false || ... || aborted(args));
}

// What a call on an aborted communicator returns instead of NCCL's answer (said once on
// stderr): teardown calls succeed, ncclCommGetAsyncError reports ncclRemoteError,
// ncclGetLastError says what happened, everything else fails with ncclRemoteError.
ncclResult_t answerOnAbortedComm(const char* function);
void fillAsyncErrorOnAbortedComm(ncclResult_t* asyncError);
const char* lastErrorOnAbortedComm();

template <typename Result, typename... Args>
Result answerForAbortedComm(const char* function, Args... args) {
  if constexpr (std::is_same_v<Result, ncclResult_t>) {
    auto fill = [](auto arg) {
      if constexpr (std::is_same_v<decltype(arg), ncclResult_t*>) fillAsyncErrorOnAbortedComm(arg);
    };
    (fill(args), ...);
    return answerOnAbortedComm(function);
  } else {
    answerOnAbortedComm(function);
    return lastErrorOnAbortedComm();
  }
}

}  // namespace ncclwatch::interpose
