// Sorting vectors of large structs (processes, communicator summaries) through an index
// permutation: each element moves once, where a sort moves it many times (at 32,768 ranks the
// sort of the processes by rank was 11% of a divergence's pass); an already sorted vector costs
// one check. Stable: equal elements keep their order.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace ncclwatch::analysis {

template <typename T, typename Less>
void sortByIndex(std::vector<T>& items, Less less) {
  if (std::is_sorted(items.begin(), items.end(), less)) return;
  std::vector<uint32_t> order(items.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return less(items[a], items[b]); });
  std::vector<T> sorted;
  sorted.reserve(items.size());
  for (uint32_t i : order) sorted.push_back(std::move(items[i]));
  items.swap(sorted);
}

}  // namespace ncclwatch::analysis
