// A rank's calls in ring-index order, as a TraceFile holds them: a vector whose front can be
// dropped without moving what stays. The collector keeps each rank's newest calls and drops the
// oldest ones every half window; as a std::vector each drop moved the whole window (16 KB a rank
// at 128 records), twice a record's size for every record received (docs/scale.md, session 19).
// Here the records live in a ring: the front moves, nothing else does. Offline readers fill it
// with push_back or assign a vector, and index it as before.
#pragma once
#include <algorithm>
#include <compare>
#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "trace/record.h"

namespace ncclwatch::trace {

// The slot of element `i` of a ring of `capacity` slots whose oldest element is in slot `head`
// (head, i < capacity): one compare, no division.
constexpr size_t ringSlot(size_t head, size_t i, size_t capacity) {
  size_t at = head + i;
  return at >= capacity ? at - capacity : at;
}

// A random-access position in a ring of records: element i is buf[(head + i) mod capacity].
template <typename Record>
class RingIterator {
 public:
  using iterator_category = std::random_access_iterator_tag;
  using iterator_concept = std::random_access_iterator_tag;
  using value_type = std::remove_const_t<Record>;
  using difference_type = std::ptrdiff_t;
  using pointer = Record*;
  using reference = Record&;

  RingIterator() = default;
  RingIterator(Record* buf, size_t capacity, size_t head, size_t index)
      : buf_(buf), capacity_(capacity), head_(head), index_(index) {}
  // A mutable position converts to a read-only one.
  template <typename Other>
  requires(std::is_const_v<Record>&& std::is_same_v<const Other, Record>)
      RingIterator(const RingIterator<Other>& other)  // NOLINT: implicit, as a pointer's
      : buf_(other.buf_), capacity_(other.capacity_), head_(other.head_), index_(other.index_) {}

  reference operator*() const { return buf_[slot(index_)]; }
  pointer operator->() const { return &buf_[slot(index_)]; }
  reference operator[](difference_type n) const {
    return buf_[slot(index_ + static_cast<size_t>(n))];
  }
  RingIterator& operator++() { return ++index_, *this; }
  RingIterator operator++(int) { return {buf_, capacity_, head_, index_++}; }
  RingIterator& operator--() { return --index_, *this; }
  RingIterator operator--(int) { return {buf_, capacity_, head_, index_--}; }
  RingIterator& operator+=(difference_type n) { return index_ += static_cast<size_t>(n), *this; }
  RingIterator& operator-=(difference_type n) { return index_ -= static_cast<size_t>(n), *this; }
  friend RingIterator operator+(RingIterator it, difference_type n) { return it += n; }
  friend RingIterator operator+(difference_type n, RingIterator it) { return it += n; }
  friend RingIterator operator-(RingIterator it, difference_type n) { return it -= n; }
  friend difference_type operator-(const RingIterator& a, const RingIterator& b) {
    return static_cast<difference_type>(a.index_) - static_cast<difference_type>(b.index_);
  }
  friend bool operator==(const RingIterator& a, const RingIterator& b) {
    return a.index_ == b.index_;
  }
  friend auto operator<=>(const RingIterator& a, const RingIterator& b) {
    return a.index_ <=> b.index_;
  }
  // The position's index from the start of its window or range.
  size_t index() const { return index_; }

 private:
  template <typename>
  friend class RingIterator;
  size_t slot(size_t i) const { return ringSlot(head_, i, capacity_); }
  Record* buf_ = nullptr;
  size_t capacity_ = 0;
  size_t head_ = 0;
  size_t index_ = 0;
};

// A read-only run of consecutive records of a window (or of any contiguous records): what the
// analysis reads where it took a std::span of a window's records.
class RecordRange {
 public:
  using value_type = CallRecord;
  using const_iterator = RingIterator<const CallRecord>;
  using iterator = const_iterator;

  RecordRange() = default;
  RecordRange(const CallRecord* buf, size_t capacity, size_t head, size_t size)
      : buf_(buf), capacity_(capacity), head_(head), size_(size) {}
  RecordRange(std::span<const CallRecord> records)  // NOLINT: implicit, as a span's
      : buf_(records.data()), capacity_(records.size()), head_(0), size_(records.size()) {}
  RecordRange(const std::vector<CallRecord>& records)  // NOLINT: implicit, as a span's
      : RecordRange(std::span<const CallRecord>(records)) {}

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const CallRecord& operator[](size_t i) const { return buf_[slot(i)]; }
  const CallRecord& front() const { return (*this)[0]; }
  const CallRecord& back() const { return (*this)[size_ - 1]; }
  const_iterator begin() const { return {buf_, capacity_, head_, 0}; }
  const_iterator end() const { return {buf_, capacity_, head_, size_}; }
  // The first `count` records, and those from `offset` on (count, offset <= size()).
  RecordRange first(size_t count) const { return {buf_, capacity_, head_, count}; }
  RecordRange subspan(size_t offset) const {
    return {buf_, capacity_, slot(offset), size_ - offset};
  }

 private:
  size_t slot(size_t i) const { return ringSlot(head_, i, capacity_); }
  const CallRecord* buf_ = nullptr;
  size_t capacity_ = 0;
  size_t head_ = 0;
  size_t size_ = 0;
};

class RecordWindow {
 public:
  using value_type = CallRecord;
  using iterator = RingIterator<CallRecord>;
  using const_iterator = RingIterator<const CallRecord>;

  RecordWindow() = default;
  RecordWindow(std::initializer_list<CallRecord> records) {
    assign(records.begin(), records.end());
  }
  explicit RecordWindow(const std::vector<CallRecord>& records) {
    assign(records.begin(), records.end());
  }
  RecordWindow(const RecordWindow& other) { assign(other.begin(), other.end()); }
  RecordWindow(RecordWindow&& other) noexcept { swap(other); }
  RecordWindow& operator=(const RecordWindow& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  RecordWindow& operator=(RecordWindow&& other) noexcept {
    RecordWindow taken(std::move(other));
    swap(taken);
    return *this;
  }
  RecordWindow& operator=(const std::vector<CallRecord>& records) {
    assign(records.begin(), records.end());
    return *this;
  }
  RecordWindow& operator=(std::initializer_list<CallRecord> records) {
    assign(records.begin(), records.end());
    return *this;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Records it holds without allocating (the ring's slots).
  size_t capacity() const { return capacity_; }

  CallRecord& operator[](size_t i) { return ring_[slot(i)]; }
  const CallRecord& operator[](size_t i) const { return ring_[slot(i)]; }
  CallRecord& at(size_t i) { return i < size_ ? (*this)[i] : outOfRange(); }
  const CallRecord& at(size_t i) const { return i < size_ ? (*this)[i] : outOfRange(); }
  CallRecord& front() { return (*this)[0]; }
  const CallRecord& front() const { return (*this)[0]; }
  CallRecord& back() { return (*this)[size_ - 1]; }
  const CallRecord& back() const { return (*this)[size_ - 1]; }

  iterator begin() { return {ring_.get(), capacity_, head_, 0}; }
  iterator end() { return {ring_.get(), capacity_, head_, size_}; }
  const_iterator begin() const { return {ring_.get(), capacity_, head_, 0}; }
  const_iterator end() const { return {ring_.get(), capacity_, head_, size_}; }
  RecordRange range() const { return {ring_.get(), capacity_, head_, size_}; }
  operator RecordRange() const { return range(); }  // NOLINT: implicit, as a vector to a span

  void push_back(const CallRecord& record) {
    if (size_ == capacity_) grow(std::max<size_t>(2 * capacity_, 16));
    ring_[slot(size_)] = record;
    ++size_;
  }
  void pop_back() { --size_; }
  // Drops the oldest `count` records (count <= size()): the others stay where they are.
  void dropFront(size_t count) {
    head_ = slot(count);
    size_ -= count;
    if (size_ == 0) head_ = 0;
  }
  void clear() {
    head_ = 0;
    size_ = 0;
  }
  // Room for `count` records: exactly that many slots (as std::vector::reserve, never less than
  // what it holds). The slots are not written until used: a window's pages are touched as its
  // calls arrive, as a vector's reserve left them.
  void reserve(size_t count) {
    if (count > capacity_) grow(count);
  }
  // Exactly max(count, size()) slots: what a window that grew goes back to.
  void setCapacity(size_t count) { grow(std::max(count, size_)); }
  // Keeps the first `count` records, or appends value-initialised ones up to it.
  void resize(size_t count) {
    if (count > capacity_) grow(count);
    for (size_t i = size_; i < count; ++i) ring_[slot(i)] = CallRecord{};
    size_ = count;
  }
  template <typename Iterator>
  void assign(Iterator first, Iterator last) {
    size_t count = static_cast<size_t>(std::distance(first, last));
    std::unique_ptr<CallRecord[]> fresh = std::make_unique_for_overwrite<CallRecord[]>(count);
    std::copy(first, last, fresh.get());
    ring_ = std::move(fresh);
    capacity_ = size_ = count;
    head_ = 0;
  }
  // Inserts before `position`, moving the later records up one (a record arriving late).
  iterator insert(const_iterator position, const CallRecord& record) {
    size_t at = position.index();
    if (size_ == capacity_) grow(std::max<size_t>(2 * capacity_, 16));
    for (size_t i = size_; i > at; --i) (*this)[i] = (*this)[i - 1];
    ++size_;
    (*this)[at] = record;
    return begin() + static_cast<std::ptrdiff_t>(at);
  }
  // Erases [first, last): the front alone costs nothing; elsewhere the later records move down.
  iterator erase(const_iterator first, const_iterator last) {
    size_t from = first.index(), to = last.index();
    if (from == 0) {
      dropFront(to);
      return begin();
    }
    for (size_t i = to; i < size_; ++i) (*this)[from + i - to] = (*this)[i];
    size_ -= to - from;
    return begin() + static_cast<std::ptrdiff_t>(from);
  }
  void swap(RecordWindow& other) noexcept {
    ring_.swap(other.ring_);
    std::swap(capacity_, other.capacity_);
    std::swap(head_, other.head_);
    std::swap(size_, other.size_);
  }
  // The records in order, as a vector.
  std::vector<CallRecord> toVector() const { return {begin(), end()}; }

 private:
  size_t slot(size_t i) const { return ringSlot(head_, i, capacity_); }
  // Moves the records, in order, to the front of a new ring of `slots` slots (slots >= size_).
  void grow(size_t slots) {
    std::unique_ptr<CallRecord[]> grown = std::make_unique_for_overwrite<CallRecord[]>(slots);
    std::copy(begin(), end(), grown.get());
    ring_ = std::move(grown);
    capacity_ = slots;
    head_ = 0;
  }
  [[noreturn]] static CallRecord& outOfRange() { throw std::out_of_range("RecordWindow::at"); }

  // Slots [0, capacity_); the records are slots head_, head_ + 1, ... (mod capacity_), size_ of
  // them. Slots past them are uninitialised (CallRecord is trivially copyable).
  std::unique_ptr<CallRecord[]> ring_;
  size_t capacity_ = 0;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace ncclwatch::trace
