// Merges the dumps of 10k synthetic ranks into one stack tree (DESIGN.md budget: <= 1 s). Each
// rank has a main thread of ~30 frames (a few shapes, so that the tree branches and there are
// several classes) and three helper threads; prints ranks/s for the default merge, by module,
// and with --all-threads.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "analysis/stack_tree.h"

namespace {

using ncclwatch::trace::Dump;
using ncclwatch::trace::DumpFrame;
using ncclwatch::trace::DumpThread;

DumpFrame frame(std::string function, uint64_t offset) {
  DumpFrame f;
  f.function = std::move(function);
  f.module = "/opt/app/lib/libtrain.so";
  f.moduleOffset = offset;
  f.buildId = "0123456789abcdef";
  return f;
}

DumpThread thread(int tid, int shape, int depth) {
  DumpThread t;
  t.tid = tid;
  t.name = "t" + std::to_string(tid);
  t.answered = true;
  // Innermost first, as dumps hold them.
  t.frames.push_back(frame("pthread_cond_wait", 0x85f14));
  t.frames.push_back(frame("wait_shape_" + std::to_string(shape), 0x1000 + shape * 16));
  for (int d = depth; d > 0; --d) {
    t.frames.push_back(
        frame("layer_" + std::to_string(d) + "::forward(Tensor const&)", 0x2000 + d));
  }
  t.frames.push_back(frame("main", 0x400));
  t.frames.push_back(frame("__libc_start_main", 0x2724a));
  t.frames.push_back(frame("_start", 0x100));
  return t;
}

double mergeSeconds(const std::vector<ncclwatch::analysis::RankDump>& ranks,
                    const ncclwatch::analysis::StackOptions& options, size_t* classes) {
  auto start = std::chrono::steady_clock::now();
  auto report = ncclwatch::analysis::mergeStacks(ranks, options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *classes = report.classes.size();
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const int kRanks = argc > 1 ? std::stoi(argv[1]) : 10000;
  std::vector<Dump> dumps(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    int shape = r % 97 == 3 ? 1 : (r % 1000 == 7 ? 2 : 0);  // a few odd ranks
    dumps[r].trigger = "hang";
    dumps[r].threads.push_back(thread(1000 + r * 8, shape, 24));
    for (int h = 1; h <= 3; ++h) dumps[r].threads.push_back(thread(1000 + r * 8 + h, 10 + h, 6));
  }
  std::vector<ncclwatch::analysis::RankDump> ranks;
  for (int r = 0; r < kRanks; ++r) ranks.push_back({r, &dumps[r], 1000 + r * 8});
  std::printf("stack merge of %d ranks (30 frames main thread, 3 helper threads); budget 1 s\n",
              kRanks);
  struct Case {
    const char* name;
    ncclwatch::analysis::StackOptions options;
  } cases[] = {{"by function", {ncclwatch::analysis::FrameKey::kFunction, false}},
               {"by module", {ncclwatch::analysis::FrameKey::kModule, false}},
               {"by function, all threads", {ncclwatch::analysis::FrameKey::kFunction, true}}};
  bool withinBudget = true;
  for (const Case& c : cases) {
    double best = 1e9;
    size_t classes = 0;
    for (int i = 0; i < 3; ++i) best = std::min(best, mergeSeconds(ranks, c.options, &classes));
    std::printf("  %-26s %8.1f ms  %10.0f ranks/s  %zu classes\n", c.name, best * 1e3,
                kRanks / best, classes);
    withinBudget = withinBudget && best <= 1.0;
  }
  std::printf("%s\n", withinBudget ? "within budget" : "OVER BUDGET");
  return withinBudget ? 0 : 1;
}
