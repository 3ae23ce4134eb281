// Splitting a pass's per-process and per-member loops over threads (Options::threads). Every
// caller merges the chunks' results in chunk order, so that verdicts do not depend on the
// thread count.
#pragma once
#include <cstddef>
#include <functional>

namespace ncclwatch::analysis::internal {

// Fewer items than this run on the calling thread alone: a thread's start costs more than the
// work it would take over (tens of microseconds against ~50 ns an item).
inline constexpr size_t kParallelMinItems = 512;

// How many chunks parallelChunks cuts `count` items into with `threads` threads (1 when the
// work is too small to share): callers size their per-chunk state with it.
size_t chunkCount(size_t count, int threads);

// Calls work(chunk, begin, end) for chunkCount(count, threads) contiguous chunks of [0, count),
// the first on the calling thread and each other on a thread of its own; returns once all have.
void parallelChunks(size_t count, int threads,
                    const std::function<void(size_t chunk, size_t begin, size_t end)>& work);

}  // namespace ncclwatch::analysis::internal
