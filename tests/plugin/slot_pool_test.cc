// The plugin's slot pools: a claim finds any free slot, and a full pool answers null, counted.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "plugin/slots.h"

namespace ncclwatch::plugin {
namespace {

struct TestSlot {
  std::atomic<uint32_t> live{0};
  std::atomic<uint32_t> generation{0};
};

// A pool's slots are never freed (NCCL's handles may outlive every communicator), so each pool
// here lives as long as the process, as the plugin's own do (static storage).
template <size_t Capacity>
SlotPool<TestSlot, Capacity>& processPool() {
  static SlotPool<TestSlot, Capacity>* pool = new SlotPool<TestSlot, Capacity>();
  pool->allocate();
  return *pool;
}

TEST(SlotPool, AClaimFindsAFreeSlotFarFromTheCursor) {
  SlotPool<TestSlot, 1024>& pool = processPool<1024>();
  std::vector<TestSlot*> claimed;
  for (size_t i = 0; i < 1024; ++i) {
    TestSlot* slot = pool.claim();
    ASSERT_NE(slot, nullptr) << "claim " << i;
    claimed.push_back(slot);
  }
  // Thousands of operations in flight, one given back half the pool away from where the next
  // claim starts looking: the call must still be recorded.
  pool.release(claimed[700]);
  TestSlot* again = pool.claim();
  EXPECT_EQ(again, claimed[700]);
  EXPECT_EQ(pool.dropped(), 0u);
}

TEST(SlotPool, AFullPoolAnswersNullAndCountsTheDrop) {
  SlotPool<TestSlot, 128>& pool = processPool<128>();
  for (size_t i = 0; i < 128; ++i) ASSERT_NE(pool.claim(), nullptr);
  EXPECT_EQ(pool.claim(), nullptr);
  EXPECT_EQ(pool.claim(), nullptr);
  EXPECT_EQ(pool.dropped(), 2u);
}

TEST(SlotPool, ThreadsClaimingAndReleasingNeverShareASlot) {
  SlotPool<TestSlot, 256>& pool = processPool<256>();
  std::atomic<int> doubleOwned{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::vector<TestSlot*> held;
      for (int round = 0; round < 2000; ++round) {
        if (TestSlot* slot = pool.claim()) {
          if (slot->generation.fetch_add(1) % 2 != 0) doubleOwned.fetch_add(1);
          held.push_back(slot);
        }
        if (held.size() > 40 || (round % 3 == 0 && !held.empty())) {
          TestSlot* slot = held.back();
          held.pop_back();
          pool.release(slot);  // bumps the generation back to even before it is free
        }
      }
      for (TestSlot* slot : held) pool.release(slot);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(doubleOwned.load(), 0);
  EXPECT_EQ(pool.dropped(), 0u);  // 4 threads hold at most 164 of 256
  for (size_t i = 0; i < 256; ++i) EXPECT_NE(pool.claim(), nullptr) << "slot " << i;
}

}  // namespace
}  // namespace ncclwatch::plugin
