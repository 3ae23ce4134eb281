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
    size_t position;
    return pop(value, &position);
  }
  // The same, saying where the value stood: the count of values popped before it.
  bool pop(T* value, size_t* taken) {
    size_t position = head_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& cell = cells_[position & (Capacity - 1)];
      size_t sequence = cell.sequence.load(std::memory_order_acquire);
      auto difference = static_cast<intptr_t>(sequence) - static_cast<intptr_t>(position + 1);
      if (difference == 0) {
        if (head_.compare_exchange_weak(position, position + 1, std::memory_order_relaxed)) {
          *value = cell.value;
          cell.sequence.store(position + Capacity, std::memory_order_release);
          *taken = position;
          return true;
        }
      } else if (difference < 0) {
        return false;
      } else {
        position = head_.load(std::memory_order_relaxed);
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
