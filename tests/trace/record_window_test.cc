// RecordWindow: a rank's calls as a ring whose front drops without moving the rest, read as the
// vector it replaced (trace/record_window.h).
#include "trace/record_window.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

namespace {

using ncclwatch::trace::CallRecord;
using ncclwatch::trace::RecordRange;
using ncclwatch::trace::RecordWindow;

CallRecord call(uint64_t ringIndex) {
  CallRecord r{};
  r.ringIndex = ringIndex;
  r.seq = ringIndex + 1;
  return r;
}

std::vector<uint64_t> indices(const RecordWindow& window) {
  std::vector<uint64_t> out;
  for (const CallRecord& r : window) out.push_back(r.ringIndex);
  return out;
}

std::vector<uint64_t> indices(RecordRange range) {
  std::vector<uint64_t> out;
  for (const CallRecord& r : range) out.push_back(r.ringIndex);
  return out;
}

TEST(RecordWindow, DroppingTheFrontMovesNoRecord) {
  RecordWindow window;
  window.reserve(8);
  for (uint64_t i = 0; i < 8; ++i) window.push_back(call(i));
  const CallRecord* fifth = &window[4];
  window.dropFront(4);
  EXPECT_EQ(indices(window), (std::vector<uint64_t>{4, 5, 6, 7}));
  EXPECT_EQ(&window[0], fifth);  // the records that stay are where they were
  EXPECT_EQ(window.capacity(), 8u);
}

TEST(RecordWindow, AppendsAfterADropWrapAroundAndReadInOrder) {
  RecordWindow window;
  window.reserve(6);
  for (uint64_t i = 0; i < 6; ++i) window.push_back(call(i));
  window.dropFront(4);
  for (uint64_t i = 6; i < 10; ++i) window.push_back(call(i));  // into the freed slots
  EXPECT_EQ(window.capacity(), 6u);                             // no growth: it wrapped
  EXPECT_EQ(indices(window), (std::vector<uint64_t>{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(window.front().ringIndex, 4u);
  EXPECT_EQ(window.back().ringIndex, 9u);
  // A binary search and iterator arithmetic across the wrap, as the collector's store does.
  auto at =
      std::lower_bound(window.begin(), window.end(), 8u,
                       [](const CallRecord& r, uint64_t index) { return r.ringIndex < index; });
  EXPECT_EQ(at - window.begin(), 4);
  EXPECT_EQ(at->ringIndex, 8u);
  EXPECT_EQ((window.end() - 1)->ringIndex, 9u);
  EXPECT_THROW(window.at(6), std::out_of_range);
}

TEST(RecordWindow, GrowingAWrappedRingKeepsTheOrder) {
  RecordWindow window;
  window.reserve(4);
  for (uint64_t i = 0; i < 4; ++i) window.push_back(call(i));
  window.dropFront(3);
  for (uint64_t i = 4; i < 7; ++i) window.push_back(call(i));  // wrapped, full
  window.push_back(call(7));                                   // grows
  EXPECT_EQ(indices(window), (std::vector<uint64_t>{3, 4, 5, 6, 7}));
  window.setCapacity(5);  // back to exactly what it holds
  EXPECT_EQ(window.capacity(), 5u);
  EXPECT_EQ(indices(window), (std::vector<uint64_t>{3, 4, 5, 6, 7}));
  window.setCapacity(2);  // never below what it holds
  EXPECT_EQ(window.capacity(), 5u);
}

TEST(RecordWindow, InsertAndEraseInTheMiddleAcrossTheWrap) {
  RecordWindow window;
  window.reserve(8);
  for (uint64_t i = 0; i < 8; ++i) window.push_back(call(i * 10));
  window.dropFront(5);
  window.push_back(call(80));
  window.push_back(call(90));
  // 50 60 70 | 80 90 (wrapped): a late record between 60 and 70.
  window.insert(window.begin() + 2, call(65));
  EXPECT_EQ(indices(window), (std::vector<uint64_t>{50, 60, 65, 70, 80, 90}));
  window.erase(window.begin() + 1, window.begin() + 3);
  EXPECT_EQ(indices(window), (std::vector<uint64_t>{50, 70, 80, 90}));
  window.erase(window.begin(), window.begin() + 1);
  EXPECT_EQ(indices(window), (std::vector<uint64_t>{70, 80, 90}));
}

TEST(RecordWindow, RangesOfAWrappedWindowSplitWhereAskedAndAVectorIsARange) {
  RecordWindow window;
  window.reserve(5);
  for (uint64_t i = 0; i < 5; ++i) window.push_back(call(i));
  window.dropFront(3);
  for (uint64_t i = 5; i < 8; ++i) window.push_back(call(i));
  RecordRange all = window;
  EXPECT_EQ(indices(all), (std::vector<uint64_t>{3, 4, 5, 6, 7}));
  EXPECT_EQ(indices(all.first(3)), (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(indices(all.subspan(3)), (std::vector<uint64_t>{6, 7}));
  EXPECT_EQ(all.subspan(1)[2].ringIndex, 6u);
  std::vector<CallRecord> plain{call(1), call(2)};
  RecordRange fromVector = plain;
  EXPECT_EQ(indices(fromVector), (std::vector<uint64_t>{1, 2}));
  window = plain;  // a reader's vector becomes the window
  EXPECT_EQ(indices(window), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(window.toVector().size(), 2u);
}

TEST(RecordWindow, CopiesAreIndependentAndMovesLeaveAnEmptyWindow) {
  RecordWindow window;
  window.reserve(4);
  for (uint64_t i = 0; i < 4; ++i) window.push_back(call(i));
  window.dropFront(2);
  window.push_back(call(4));  // wrapped
  RecordWindow copy = window;
  copy[0].count = 99;
  EXPECT_EQ(window[0].count, 0u);
  EXPECT_EQ(indices(copy), (std::vector<uint64_t>{2, 3, 4}));
  RecordWindow moved = std::move(window);
  EXPECT_EQ(indices(moved), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_TRUE(window.empty());  // NOLINT(bugprone-use-after-move): what a move leaves
  window = copy;
  EXPECT_EQ(indices(window), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(window[0].count, 99u);
}

// Every operation against std::deque, in random order, through many wraps and growths.
TEST(RecordWindow, BehavesAsADequeUnderRandomOperations) {
  std::mt19937_64 random(19);
  RecordWindow window;
  std::deque<CallRecord> model;
  uint64_t next = 0;
  for (int step = 0; step < 20000; ++step) {
    switch (random() % 8) {
      case 0:
      case 1:
      case 2:
        window.push_back(call(next));
        model.push_back(call(next++));
        break;
      case 3: {
        size_t drop = model.empty() ? 0 : random() % (model.size() + 1);
        window.dropFront(drop);
        model.erase(model.begin(), model.begin() + static_cast<std::ptrdiff_t>(drop));
        break;
      }
      case 4: {
        size_t at = random() % (model.size() + 1);
        window.insert(window.begin() + static_cast<std::ptrdiff_t>(at), call(next));
        model.insert(model.begin() + static_cast<std::ptrdiff_t>(at), call(next++));
        break;
      }
      case 5:
        if (!model.empty()) {
          size_t from = random() % model.size();
          size_t to = from + random() % (model.size() - from + 1);
          window.erase(window.begin() + static_cast<std::ptrdiff_t>(from),
                       window.begin() + static_cast<std::ptrdiff_t>(to));
          model.erase(model.begin() + static_cast<std::ptrdiff_t>(from),
                      model.begin() + static_cast<std::ptrdiff_t>(to));
        }
        break;
      case 6:
        window.setCapacity(model.size() + random() % 4);
        break;
      case 7:
        if (!model.empty()) {
          size_t i = random() % model.size();
          window[i].count = next;
          model[i].count = next++;
        }
        break;
    }
    ASSERT_EQ(window.size(), model.size());
    ASSERT_GE(window.capacity(), window.size());
    for (size_t i = 0; i < model.size(); ++i) {
      ASSERT_EQ(window[i].ringIndex, model[i].ringIndex) << "step " << step << " at " << i;
      ASSERT_EQ(window[i].count, model[i].count) << "step " << step << " at " << i;
    }
  }
}

}  // namespace
