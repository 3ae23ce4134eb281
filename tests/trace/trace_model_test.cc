// The record model: communicator identity equals NCCL's commHash (vectors computed from the
// algorithm by an independent script, and cross-checked against the sim's own implementation),
// fingerprints separate exactly what a mismatch verdict must separate.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "comm_hash.h"  // sim/nccl's independent implementation
#include "trace/fingerprint.h"
#include "trace/identity.h"
#include "trace/record.h"

namespace {

using namespace ncclwatch::trace;

TEST(CommIdentity, RootHashMatchesHandComputedVectors) {
  unsigned char counting[128], zeros[128] = {};
  for (int i = 0; i < 128; ++i) counting[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(rootCommHash(counting), 0x6afe1cc17717e1f4ull);
  EXPECT_EQ(rootCommHash(zeros), 0xcc976ec6c24bb53cull);
}

TEST(CommIdentity, SplitAndShrinkChildrenMatchHandComputedVectors) {
  const uint64_t parent = 0x6afe1cc17717e1f4ull;
  EXPECT_EQ(splitCommHash(parent, 1, 0), 0x79030d073b3c579full);
  EXPECT_EQ(splitCommHash(parent, 2, -1), 0xac3e170ebbbab1a6ull);  // NOCOLOR still counts
  EXPECT_EQ(shrinkCommHash(parent), 0x3ab8d78e8fb6dbdaull);
  // Two shrinks of one parent collide in NCCL: ncclwatch must add its own counter.
  EXPECT_EQ(shrinkCommHash(parent), shrinkCommHash(parent));
}

// NCCL 2.29+'s grown communicators (vectors from the same independent script).
TEST(CommIdentity, GrownCommunicatorMatchesHandComputedVectors) {
  EXPECT_EQ(combineHash(1, 2), 0xf969483a83291cbfull);
  unsigned char counting[128];
  for (int i = 0; i < 128; ++i) counting[i] = static_cast<unsigned char>(i);
  // A root's magic is its id's first 8 bytes, read little-endian.
  const uint64_t rootMagic = uniqueIdMagic(counting);
  EXPECT_EQ(rootMagic, 0x0706050403020100ull);
  // Existing ranks: the root's first child (counter 1) grown to 4 ranks.
  const uint64_t magic = growMagic(rootMagic, 1);
  EXPECT_EQ(magic, 0x38503679d5396e63ull);
  EXPECT_EQ(growCommHash(magic, 4), 0xf1c65f34274afaccull);
  // A new rank reads the same magic from the grow id that ncclCommGetUniqueId made.
  unsigned char growId[128] = {};
  std::memcpy(growId, &magic, sizeof magic);
  EXPECT_EQ(growCommHash(uniqueIdMagic(growId), 4), growCommHash(magic, 4));
  // NCCL widens its int counter: -1 is all ones, not 2^32 - 1.
  EXPECT_EQ(growMagic(rootMagic, -1), 0xd34f6aa4c9680522ull);
}

TEST(CommIdentity, AgreesWithTheSimOnRandomIds) {
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    unsigned char id[128];
    for (auto& byte : id) byte = static_cast<unsigned char>(random());
    size_t length = trial % 2 ? 128 : random() % 128;  // odd lengths exercise the padding
    uint64_t root = rootCommHash(id, length);
    ASSERT_EQ(root, ncclsim::rootCommHash(id, length)) << "trial " << trial;
    int count = static_cast<int>(random() % 10), color = static_cast<int>(random() % 7) - 1;
    ASSERT_EQ(splitCommHash(root, count, color), ncclsim::childCommHash(root, count, color));
  }
}

TEST(Fingerprint, SeparatesEveryFieldThatMustMatch) {
  CallShape base{OpKind::kAllReduce, 4096, 7 /*float*/, 0 /*sum*/, -1};
  uint64_t f = fingerprint(base);
  auto differs = [&](CallShape changed) { return fingerprint(changed) != f; };
  CallShape other = base;
  other.op = OpKind::kBroadcast;
  EXPECT_TRUE(differs(other));
  other = base;
  other.count = 4095;
  EXPECT_TRUE(differs(other));
  other = base;
  other.dtype = 6;  // half
  EXPECT_TRUE(differs(other));
  other = base;
  other.redop = 2;  // max
  EXPECT_TRUE(differs(other));
  CallShape broadcast{OpKind::kBroadcast, 16, 7, 0, 0};
  CallShape wrongRoot = broadcast;
  wrongRoot.rootOrPeer = 1;
  EXPECT_NE(fingerprint(broadcast), fingerprint(wrongRoot));
}

TEST(Fingerprint, IgnoresArgumentsTheOpDoesNotUse) {
  CallShape gather{OpKind::kAllGather, 256, 7, 0, -1};
  CallShape sameWithRedop = gather;
  sameWithRedop.redop = 3;  // AllGather has no reduction: NCCL ignores it, so do we
  sameWithRedop.rootOrPeer = 5;
  EXPECT_EQ(fingerprint(gather), fingerprint(sameWithRedop));
  CallShape send{OpKind::kSend, 512, 7, 0, 1};
  CallShape sendElsewhere = send;
  sendElsewhere.rootOrPeer = 2;
  EXPECT_NE(fingerprint(send), fingerprint(sendElsewhere));
}

TEST(Fingerprint, RollingHashDetectsAShiftedSequence) {
  // Identical calls every step: a skipped call shifts the sequence without any fingerprint
  // differing at one position, but the rolling hashes of different-length prefixes differ.
  uint64_t step = fingerprint({OpKind::kAllReduce, 1024, 7, 0, -1});
  uint64_t a = kRollingSeed, b = kRollingSeed;
  for (int i = 0; i < 5; ++i) a = rollingHash(a, step);
  for (int i = 0; i < 4; ++i) b = rollingHash(b, step);
  EXPECT_NE(a, b);
  uint64_t c = kRollingSeed;
  for (int i = 0; i < 5; ++i) c = rollingHash(c, step);
  EXPECT_EQ(a, c);
}

TEST(Record, LayoutIsTheFileFormat) {
  EXPECT_EQ(sizeof(CallRecord), 128u);
  EXPECT_EQ(offsetof(CallRecord, commHash), 0u);
  EXPECT_EQ(offsetof(CallRecord, seq), 8u);
  EXPECT_EQ(offsetof(CallRecord, rootOrPeer), 96u);
  EXPECT_EQ(offsetof(CallRecord, op), 110u);
  EXPECT_EQ(offsetof(CallRecord, state), 113u);
  EXPECT_EQ(offsetof(CallRecord, slotVersion), 116u);
  EXPECT_EQ(offsetof(CallRecord, ringIndex), 120u);
  EXPECT_STREQ(opName(OpKind::kReduceScatter), "ReduceScatter");
  EXPECT_TRUE(isCollective(OpKind::kScatter));
  EXPECT_FALSE(isCollective(OpKind::kSend));
  EXPECT_TRUE(isPointToPoint(OpKind::kRecv));
  EXPECT_TRUE(isLifecycle(OpKind::kSplit));
  EXPECT_TRUE(isLifecycle(OpKind::kGrow));
  EXPECT_FALSE(isLifecycle(OpKind::kRegister));
  EXPECT_TRUE(isOneSided(OpKind::kPutSignal));
  EXPECT_TRUE(isOneSided(OpKind::kWaitSignal));
  EXPECT_FALSE(isOneSided(OpKind::kSend) || isOneSided(OpKind::kGrow));
  EXPECT_STREQ(opName(OpKind::kWaitSignal), "WaitSignal");
  // Appended values: files written before NCCL 2.29's ops keep theirs.
  EXPECT_EQ(static_cast<int>(OpKind::kDeregister), 21);
  EXPECT_EQ(static_cast<int>(OpKind::kGrow), 22);
  EXPECT_EQ(static_cast<int>(OpKind::kWaitSignal), 25);
  for (int op = 0; op < static_cast<int>(OpKind::kCount); ++op) {
    EXPECT_NE(opName(static_cast<OpKind>(op)), nullptr);
  }
}

}  // namespace
