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
inline std::atomic<int> g_abortedCommCount{0};  // remembered handles; 0 on every healthy call
}  // namespace detail

// How many aborted handles are remembered at once; the oldest makes room for a newer one.
constexpr size_t kAbortedCommSlots = 64;

// Before ncclwatch's own ncclCommAbort of `comm`: from then on its calls are answered here.
void rememberAbortedByUs(ncclComm_t comm);
// NCCL made a new communicator at `comm`'s address: it is live again.
void forgetAbortedByUs(ncclComm_t comm);
bool abortedByUs(ncclComm_t comm);

// Whether any argument of a call is a communicator ncclwatch aborted (one relaxed load when
// none was: the wrappers' hot path).
template <typename... Args>
bool callsAnAbortedComm(const Args&... args) {
  if (detail::g_abortedCommCount.load(std::memory_order_relaxed) == 0) return false;
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
