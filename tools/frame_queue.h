// A bounded single-producer, single-consumer queue of decoded frames: from one reader thread of
// the collector's connections to the thread that owns the triage (collect_connections.h). Its
// slots are reused in place, so a frame's vectors keep their room and a collector that keeps up
// allocates nothing per frame.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "trace/wire.h"

namespace ncclwatch::collect {

// What a reader hands over, in the order its connections produced it.
struct QueuedFrame {
  enum class Kind : uint8_t {
    kFrame,    // a decoded frame of `endpoint` (its first one is its HELLO)
    kClosed,   // `endpoint` ended: its frames before this were all handed over
    kRefused,  // an agent of protocol version frame.version was refused (the one stderr line)
  };
  Kind kind = Kind::kFrame;
  uint64_t endpoint = 0;
  trace::wire::Frame frame;
};

class FrameQueue {
 public:
  explicit FrameQueue(size_t capacity)
      : slots_(std::make_unique<QueuedFrame[]>(capacity)), capacity_(capacity) {}

  // The producer's side: the next free slot, or nullptr when the queue is full. Fill it, then
  // publish() it.
  QueuedFrame* claim() {
    uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail - headSeen_ >= capacity_) {
      headSeen_ = head_.load(std::memory_order_acquire);
      if (tail - headSeen_ >= capacity_) return nullptr;
    }
    return &slots_[tail % capacity_];
  }
  void publish() {
    tail_.store(tail_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // The consumer's side: the oldest published slot, or nullptr; pop() it once used.
  QueuedFrame* front() {
    uint64_t head = head_.load(std::memory_order_relaxed);
    if (head == tailSeen_) {
      tailSeen_ = tail_.load(std::memory_order_acquire);
      if (head == tailSeen_) return nullptr;
    }
    return &slots_[head % capacity_];
  }
  void pop() { head_.store(head_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

  // Either side, or a third thread: whether nothing is published and not yet popped.
  bool empty() const {
    return head_.load(std::memory_order_acquire) == tail_.load(std::memory_order_acquire);
  }

 private:
  std::unique_ptr<QueuedFrame[]> slots_;
  size_t capacity_;
  // Each index on its own cache line, with the copy of the other one its owner last read: the
  // two threads then share a line only when one must look at the other's progress.
  alignas(64) std::atomic<uint64_t> head_{0};
  uint64_t tailSeen_ = 0;  // the consumer's
  alignas(64) std::atomic<uint64_t> tail_{0};
  uint64_t headSeen_ = 0;  // the producer's
};

}  // namespace ncclwatch::collect
