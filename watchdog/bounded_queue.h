// A fixed-capacity multi-producer multi-consumer queue (Vyukov's sequence-numbered slots): no
// allocation after construction, no lock, and a full queue fails the push instead of waiting.
// The completion tracker uses it between application threads and the watchdog thread.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ncclwatch::watchdog {

template <typename T, size_t Capacity>
class BoundedQueue {
  static_assert(Capacity >= 2 && (Capacity & (Capacity - 1)) == 0, "a power of two");

 public:
  BoundedQueue() {
    for (size_t i = 0; i < Capacity; ++i) cells_[i].sequence.store(i, std::memory_order_relaxed);
  }
  BoundedQueue(const BoundedQueue&) = delete;
  BoundedQueue& operator=(const BoundedQueue&) = delete;

  // False when full.
  bool push(const T& value) {
    size_t position = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& cell = cells_[position & (Capacity - 1)];
      size_t sequence = cell.sequence.load(std::memory_order_acquire);
      auto difference = static_cast<intptr_t>(sequence) - static_cast<intptr_t>(position);
      if (difference == 0) {
        if (tail_.compare_exchange_weak(position, position + 1, std::memory_order_relaxed)) {
          cell.value = value;
          cell.sequence.store(position + 1, std::memory_order_release);
          return true;
        }
      } else if (difference < 0) {
        return false;
      } else {
        position = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  // False when empty.
  bool pop(T* value) {
    size_t position = head_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& cell = cells_[position & (Capacity - 1)];
      size_t sequence = cell.sequence.load(std::memory_order_acquire);
      auto difference = static_cast<intptr_t>(sequence) - static_cast<intptr_t>(position + 1);
      if (difference == 0) {
        if (head_.compare_exchange_weak(position, position + 1, std::memory_order_relaxed)) {
          *value = cell.value;
          cell.sequence.store(position + Capacity, std::memory_order_release);
          return true;
        }
      } else if (difference < 0) {
        return false;
      } else {
        position = head_.load(std::memory_order_relaxed);
      }
    }
  }

  // Pops up to `max` values that stand ready at the head with one compare-exchange (a consumer
  // taking values in chunks pays one locked instruction per chunk); returns how many (0: empty).
  size_t popMany(T* values, size_t max) {
    size_t position = head_.load(std::memory_order_relaxed);
    for (;;) {
      // Counts the cells ready at the head (each one's acquire pairs with its producer's
      // release). Their values are read only once the head is claimed: before that another
      // consumer may take them and a producer refill them, and reading a value being written
      // is a data race even when the read is then thrown away (thread sanitizer saw it).
      size_t ready = 0;
      for (; ready < max; ++ready) {
        const Cell& cell = cells_[(position + ready) & (Capacity - 1)];
        if (cell.sequence.load(std::memory_order_acquire) != position + ready + 1) break;
      }
      if (ready == 0) {
        const Cell& cell = cells_[position & (Capacity - 1)];
        auto difference = static_cast<intptr_t>(cell.sequence.load(std::memory_order_acquire)) -
                          static_cast<intptr_t>(position + 1);
        if (difference < 0) return 0;
        position = head_.load(std::memory_order_relaxed);
        continue;
      }
      if (head_.compare_exchange_weak(position, position + ready, std::memory_order_relaxed)) {
        // Ours now: no consumer takes a cell behind the head, and no producer refills one
        // before its release here.
        for (size_t i = 0; i < ready; ++i) {
          Cell& cell = cells_[(position + i) & (Capacity - 1)];
          values[i] = cell.value;
          cell.sequence.store(position + i + Capacity, std::memory_order_release);
        }
        return ready;
      }
    }
  }

  // Approximate (exact when no push or pop is under way).
  size_t size() const {
    size_t tail = tail_.load(std::memory_order_relaxed);
    size_t head = head_.load(std::memory_order_relaxed);
    return tail >= head ? tail - head : 0;
  }

 private:
  struct Cell {
    std::atomic<size_t> sequence;
    T value;
  };
  alignas(64) std::atomic<size_t> head_{0};
  alignas(64) std::atomic<size_t> tail_{0};
  alignas(64) Cell cells_[Capacity];
};

}  // namespace ncclwatch::watchdog
