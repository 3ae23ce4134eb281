// Communicator identity: NCCL's own commHash (shared/reference/nccl-profiler.md §6.4), so the
// interposer, the profiler plugin and every rank agree on a communicator's id without talking.
// sim/nccl implements the same algorithm independently; tests compare the two.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ncclwatch::trace {

// NCCL's two-word hash state: absorb byte strings, then digest.
class CommHashState {
 public:
  void absorb(const void* data, size_t length);
  uint64_t digest() const;

 private:
  uint64_t a_ = 1;
  uint64_t b_ = 1;
};

// A root communicator (InitRank, InitRankConfig, InitAll; InitRankScalable uses commIds[0]):
// the hash of the 128 bytes of its ncclUniqueId.
uint64_t rootCommHash(const void* uniqueId, size_t length = 128);

// A split child: parent hash, the parent's split counter after this split (every ncclCommSplit
// on the parent counts, NCCL_SPLIT_NOCOLOR included) and the colour.
uint64_t splitCommHash(uint64_t parentHash, int splitCount, int color);

// A shrink child: NCCL hashes (parent, 0, 0), so two shrinks of one parent collide. ncclwatch
// keeps its own per-parent shrink counter beside it to tell them apart (CommInfo::shrinkIndex).
uint64_t shrinkCommHash(uint64_t parentHash);

// NCCL 2.29+'s hashCombine: the state absorbs `base` and then `value`, 8 bytes each.
uint64_t combineHash(uint64_t base, uint64_t value);

// The bootstrap magic NCCL keeps per communicator, which a grown communicator's hash derives
// from (NCCL 2.30's bootstrap.cc and init.cc): a root communicator's is the first 8 bytes of
// its (first) ncclUniqueId; a split or shrink child's is its own commHash; a grown one's is the
// magic its hash was made from.
uint64_t uniqueIdMagic(const void* uniqueId);
// The magic every existing rank derives for the communicator that its ncclCommGrow makes:
// combineHash(parent's magic, the parent's child counter after this grow), the same value that
// ncclCommGetUniqueId put in the new ranks' id. A new rank reads it from the id instead.
uint64_t growMagic(uint64_t parentMagic, int childCount);
// A grown communicator: combineHash(its magic, its new rank count).
uint64_t growCommHash(uint64_t magic, int nranks);

}  // namespace ncclwatch::trace
