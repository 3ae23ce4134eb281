// The macros that turn a line of interpose/nccl_api.def or nccl_api_newer.def into a wrapper.
// Included after the nccl.h whose prototypes the wrappers must meet: the toolkit's 2.28.9 in
// wrappers.cc, PyPI's 2.32.3 in wrappers_newer.cc.
#pragma once
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "interpose/aborted_comms.h"
#include "interpose/forward.h"
#include "interpose/lifecycle.h"
#include "interpose/recorder.h"

#define NCCLWATCH_EXPORT __attribute__((visibility("default")))
#define NCCLWATCH_UNPACK(...) __VA_ARGS__

namespace ni = ncclwatch::interpose;

// Declares `real`, NCCL's p<name>, resolved once; returns `missing` when there is no NCCL.
#define NCCLWATCH_RESOLVE(name, missing)                  \
  static std::atomic<void*> cached{nullptr};              \
  void* address = cached.load(std::memory_order_acquire); \
  if (address == nullptr) {                               \
    address = ni::resolveReal("p" #name);                 \
    cached.store(address, std::memory_order_release);     \
  }                                                       \
  if (address == nullptr) {                               \
    ni::reportMissingNccl(#name);                         \
    return missing;                                       \
  }                                                       \
  auto real = reinterpret_cast<decltype(&::p##name)>(address)

// A call on a communicator ncclwatch aborted never reaches NCCL, which freed it
// (interpose/aborted_comms.h); one load while no communicator was ever aborted. The cold
// wrappers (all but collectives and point-to-point) are counted in first (ColdCallScope).
#define NCCLWATCH_ANSWER_ABORTED(ret, name, args)                       \
  if (ni::callsAnAbortedComm args) [[unlikely]] {                       \
    return ni::answerForAbortedComm<ret>(#name, NCCLWATCH_UNPACK args); \
  }

#define NCCL_FORWARD(ret, name, params, args)                              \
  extern "C" NCCLWATCH_EXPORT ret name params {                            \
    NCCLWATCH_RESOLVE(name, ni::missingNcclResult<ret>());                 \
    ni::ColdCallScope cold;                                                \
    NCCLWATCH_ANSWER_ABORTED(ret, name, args);                             \
    ni::CallScope scope;                                                   \
    ret returned = real args;                                              \
    ni::afterForward(returned, !scope.outermost(), NCCLWATCH_UNPACK args); \
    return returned;                                                       \
  }

#define NCCL_FORWARD_VOID(name)             \
  extern "C" NCCLWATCH_EXPORT void name() { \
    NCCLWATCH_RESOLVE(name, );              \
    ni::CallScope scope;                    \
    real();                                 \
  }

#define NCCL_COLLECTIVE(name, op, params, args, count, dtype, redop, root, comm, stream)     \
  extern "C" NCCLWATCH_EXPORT ncclResult_t name params {                                     \
    NCCLWATCH_RESOLVE(name, ncclSystemError);                                                \
    NCCLWATCH_ANSWER_ABORTED(ncclResult_t, name, args);                                      \
    ni::CallScope scope;                                                                     \
    if (!scope.outermost()) return real args;                                                \
    ni::CallDescription call = ni::describeCall(                                             \
        ncclwatch::trace::OpKind::op, static_cast<uint64_t>(count), static_cast<int>(dtype), \
        static_cast<int>(redop), static_cast<int>(root), reinterpret_cast<uint64_t>(stream), \
        reinterpret_cast<uint64_t>(__builtin_return_address(0)));                            \
    return ni::recordAndCall(comm, call, [&] { return real args; });                         \
  }

#define NCCL_P2P(name, op, params, args, count, dtype, peer, comm, stream) \
  NCCL_COLLECTIVE(name, op, params, args, count, dtype, -1, peer, comm, stream)

// A one-sided operation (NCCL 2.29+): recorded with its peer, count, type and stream like a
// send, and tracked on its stream, but outside the communicator's sequence (no peer posts a
// matching call, so ranks' sequences must not shift by it).
#define NCCL_ONE_SIDED(name, op, params, args, count, dtype, peer, comm, stream)                 \
  extern "C" NCCLWATCH_EXPORT ncclResult_t name params {                                         \
    NCCLWATCH_RESOLVE(name, ncclSystemError);                                                    \
    NCCLWATCH_ANSWER_ABORTED(ncclResult_t, name, args);                                          \
    ni::CallScope scope;                                                                         \
    if (!scope.outermost()) return real args;                                                    \
    ni::CallDescription call = ni::describeCall(                                                 \
        ncclwatch::trace::OpKind::op, static_cast<uint64_t>(count), static_cast<int>(dtype), -1, \
        static_cast<int>(peer), reinterpret_cast<uint64_t>(stream),                              \
        reinterpret_cast<uint64_t>(__builtin_return_address(0)));                                \
    call.countsInSequence = false;                                                               \
    return ni::recordAndCall(comm, call, [&] { return real args; });                             \
  }

#define NCCL_LIFECYCLE(name, params, args)                                                 \
  extern "C" NCCLWATCH_EXPORT ncclResult_t name params {                                   \
    NCCLWATCH_RESOLVE(name, ncclSystemError);                                              \
    ni::ColdCallScope cold;                                                                \
    NCCLWATCH_ANSWER_ABORTED(ncclResult_t, name, args);                                    \
    ni::CallScope scope;                                                                   \
    if (!scope.outermost()) return real args;                                              \
    ni::noteLifecycleThroughWrappers();                                                    \
    ni::detail::t_lifecycleSite = reinterpret_cast<uint64_t>(__builtin_return_address(0)); \
    return ni::lifecycle_##name(real, NCCLWATCH_UNPACK args);                              \
  }

#define NCCL_GROUP(name, hook)                      \
  extern "C" NCCLWATCH_EXPORT ncclResult_t name() { \
    NCCLWATCH_RESOLVE(name, ncclSystemError);       \
    ni::CallScope scope;                            \
    if (!scope.outermost()) return real();          \
    return ni::hook(real);                          \
  }
