// Would the real NCCL libraries' plugin loaders find a table in libncclwatch.so, and the one
// they prefer? A loader probes ncclProfiler_vN names it holds as strings, newest first; we must
// export the newest of them. Checked on the toolkit's NCCL 2.28.9 and on PyPI's 2.32.3.
#include <gtest/gtest.h>
#include <unistd.h>

#include <set>
#include <sstream>
#include <string>

#include "tests/support/command.h"

namespace {

// The N of every "ncclProfiler_vN" string in `path` (a library's probe names or exports).
std::set<int> profilerVersions(const std::string& listing) {
  std::set<int> versions;
  std::istringstream lines(listing);
  std::string line;
  const std::string prefix = "ncclProfiler_v";
  while (std::getline(lines, line)) {
    size_t at = line.find(prefix);
    if (at == std::string::npos) continue;
    std::string digits;
    for (size_t i = at + prefix.size(); i < line.size() && isdigit(line[i]); ++i) {
      digits += line[i];
    }
    if (!digits.empty() && at + prefix.size() + digits.size() == line.size()) {
      versions.insert(std::stoi(digits));
    }
  }
  return versions;
}

std::set<int> probedBy(const std::string& library) {
  return profilerVersions(testsupport::command("strings -a '" + library + "'").text);
}

std::set<int> exportedByUs() {
  return profilerVersions(
      testsupport::command("nm -D --defined-only '" NCCLWATCH_PRELOAD "' | awk '{print $3}'").text);
}

TEST(RealLoaders, OurExportsAreWhatWeClaim) {
  EXPECT_EQ(exportedByUs(), (std::set<int>{3, 4, 5, 6, 7}));
}

TEST(RealLoaders, ToolkitNccl228FindsItsNewestTable) {
  std::set<int> probed = probedBy(NCCLWATCH_TOOLKIT_NCCL);
  ASSERT_FALSE(probed.empty()) << "no ncclProfiler_v* strings in " NCCLWATCH_TOOLKIT_NCCL;
  EXPECT_EQ(*probed.rbegin(), 5) << "2.28.9 probes v5 first (reference §1.1)";
  EXPECT_TRUE(exportedByUs().count(*probed.rbegin()));
}

TEST(RealLoaders, PyPINccl232FindsItsNewestTable) {
  if (access(NCCLWATCH_WHEEL_NCCL, R_OK) != 0) {
    GTEST_SKIP() << NCCLWATCH_WHEEL_NCCL
                 << " is missing: scripts/nccl_wheel.sh could not fetch nvidia-nccl-cu13";
  }
  std::set<int> probed = probedBy(NCCLWATCH_WHEEL_NCCL);
  ASSERT_FALSE(probed.empty());
  EXPECT_EQ(*probed.rbegin(), 7);
  EXPECT_TRUE(exportedByUs().count(*probed.rbegin()));
}

}  // namespace
