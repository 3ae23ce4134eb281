// The last two keys looked up and what they found, the latest first. Records of a rank alternate
// between a few communicators (tensor-parallel and data-parallel calls in turn), which a
// one-entry cache misses every time; two entries hit nearly always, at the cost of two compares.
// Used where a communicator's hash is looked up per record: alignment (align.cc), the progress
// kept on arrival (comm_progress.cc) and the live triage (live_triage.cc).
#pragma once
#include <cstdint>
#include <utility>

namespace ncclwatch::analysis {

template <typename Value>
class RecentTwo {
 public:
  // What was remembered for `key`, or nullptr.
  const Value* find(uint64_t key) {
    if (held_[0] && keys_[0] == key) return &values_[0];
    if (held_[1] && keys_[1] == key) {
      std::swap(keys_[0], keys_[1]);
      std::swap(values_[0], values_[1]);
      return &values_[0];
    }
    return nullptr;
  }
  // `key` found `value`: the latest, the older of the two goes.
  void remember(uint64_t key, Value value) {
    keys_[1] = keys_[0];
    values_[1] = std::move(values_[0]);
    held_[1] = held_[0];
    keys_[0] = key;
    values_[0] = std::move(value);
    held_[0] = true;
  }
  void clear() { held_[0] = held_[1] = false; }

 private:
  uint64_t keys_[2] = {0, 0};
  Value values_[2] = {};
  bool held_[2] = {false, false};
};

}  // namespace ncclwatch::analysis
