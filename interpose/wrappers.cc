// The NCCL 2.28 API wrappers of libncclwatch.so, expanded from interpose/nccl_api.def. Each one
// forwards to NCCL's own pnccl<Name> and records the outermost calls. The wrappers are defined
// under nccl.h's own prototypes, so a parameter list that drifts from the header fails to
// compile, and the real function's type is decltype(&::pncclX).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "interpose/wrapper_macros.h"

// ncclResetDebugInit is deprecated in nccl.h, yet still exported: it is wrapped like the rest.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include "interpose/nccl_api.def"
