// The Python line that issued each NCCL call, recorded without the GIL by the preloaded library
// and resolved by its watchdog: under every CPython this machine has (3.10-3.13), the trace's
// sites name the script's lines, innermost first; a verdict of a skipped collective says where
// each class issued its call; NCCLWATCH_PY_SITES=0 and non-Python programs keep native sites.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "command.h"
#include "job.h"
#include "trace/python_sites.h"
#include "traces.h"

namespace {

const std::string kScript = NCCLWATCH_PY_SITES_SCRIPT;

// The line of the script carrying "# SITE <name>" (or "# <name>").
int lineOf(const std::string& marker) {
  std::ifstream in(kScript);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find("# " + marker) != std::string::npos) return number;
  }
  return -1;
}

std::string frameAt(const std::string& marker, const std::string& function) {
  return kScript + ":" + std::to_string(lineOf("SITE " + marker)) + " " + function;
}

// The CPython interpreters to try: pyenv's, and whatever python3 is.
std::vector<std::string> interpreters() {
  std::vector<std::string> found;
  for (const char* version : {"3.10", "3.11", "3.12", "3.13"}) {
    std::string glob = testsupport::command(std::string("ls -d /root/.pyenv/versions/") + version +
                                            ".*/bin/python 2>/dev/null | head -1")
                           .text;
    while (!glob.empty() && glob.back() == '\n') glob.pop_back();
    if (!glob.empty()) found.push_back(glob);
  }
  if (found.empty()) found.push_back("python3");
  return found;
}

std::string preloaded(const std::string& logs) {
  return "LD_LIBRARY_PATH=" + testsupport::simLibDir() + " LD_PRELOAD=" + testsupport::buildDir() +
         "/lib/libncclwatch.so NCCLWATCH_DIR=" + logs + " NCCLWATCH_COLLECTOR=off ";
}

TEST(PythonSites, EveryInterpreterNamesTheLinesOfTheCalls) {
  for (const std::string& python : interpreters()) {
    SCOPED_TRACE(python);
    std::string logs = testsupport::freshDirectory("py-sites");
    testsupport::Output out =
        testsupport::command(preloaded(logs) + "timeout 60 " + python + " " + kScript);
    ASSERT_EQ(out.status, 0) << out.text;
    std::vector<ncclwatch::trace::TraceFile> files = testsupport::readTraceFiles(logs);
    ASSERT_EQ(files.size(), 1u);
    const auto& file = files[0];
    // The two calls in step(), each once, and the init (its record is made before NCCL runs,
    // with the application's line: an init that hangs says where it was called).
    ASSERT_EQ(file.pythonSites.size(), 3u) << out.text;
    int tagged = 0;
    for (const auto& record : file.records) {
      if (record.op == ncclwatch::trace::OpKind::kInit) {
        ASSERT_TRUE(ncclwatch::trace::isPythonSite(record.callSite));
        uint32_t number = ncclwatch::trace::pythonSiteNumber(record.callSite);
        for (const auto& known : file.pythonSites) {
          if (known.number == number) {
            EXPECT_EQ(known.frames.at(0), frameAt("init", "main"));
          }
        }
      }
      if (record.op != ncclwatch::trace::OpKind::kAllReduce) continue;
      ASSERT_TRUE(ncclwatch::trace::isPythonSite(record.callSite));
      ++tagged;
      uint32_t number = ncclwatch::trace::pythonSiteNumber(record.callSite);
      const ncclwatch::trace::PythonSite* site = nullptr;
      for (const auto& known : file.pythonSites) site = known.number == number ? &known : site;
      ASSERT_NE(site, nullptr);
      ASSERT_GE(site->frames.size(), 3u);
      EXPECT_EQ(site->frames[0], frameAt("all_reduce", "all_reduce"));
      EXPECT_TRUE(site->frames[1] == frameAt("step-first", "step") ||
                  site->frames[1] == frameAt("step-second", "step"))
          << site->frames[1];
      EXPECT_NE(site->nativeSite, 0u);
    }
    EXPECT_EQ(tagged, 6);
    std::filesystem::remove_all(logs);
  }
}

TEST(PythonSites, OffByTheSettingAndOutsidePython) {
  std::string logs = testsupport::freshDirectory("py-sites-off");
  testsupport::Output out = testsupport::command(preloaded(logs) + "NCCLWATCH_PY_SITES=0 " +
                                                 "timeout 60 python3 " + kScript);
  ASSERT_EQ(out.status, 0) << out.text;
  for (const auto& file : testsupport::readTraceFiles(logs)) {
    // Only native sites (number 0, module + offset, then the thread: watchdog/native_sites.h),
    // no Python one.
    for (const auto& site : file.pythonSites) {
      EXPECT_EQ(site.number, ncclwatch::trace::kNativeSiteNumber);
      ASSERT_GE(site.frames.size(), 1u);
      EXPECT_NE(site.frames[0].find("+0x"), std::string::npos) << site.frames[0];
    }
    for (const auto& record : file.records) {
      EXPECT_FALSE(ncclwatch::trace::isPythonSite(record.callSite));
    }
  }
  std::filesystem::remove_all(logs);
}

// Rank 1 of 3 skips the second allreduce of a step: the mismatch names rank 1 (the other two
// agree), and each class says which Python line issued its call.
TEST(PythonSites, AVerdictSaysWhereEachClassIssuedItsCall) {
  std::string logs = testsupport::freshDirectory("py-sites-verdict");
  std::string idFile = logs + ".id";
  std::filesystem::remove(idFile);
  testsupport::Output out = testsupport::command(
      "LD_LIBRARY_PATH=" + testsupport::simLibDir() + " timeout 120 " + NCCLWATCH_BINARY +
      " run --abort --dir " + logs + " -- " + NCCLWATCH_BINARY + " launch -n 3 -- python3 " +
      kScript + " --id-file " + idFile + " --skip-on 1");
  std::string verdicts = testsupport::readFile(logs + "/verdicts.jsonl");
  std::string first = verdicts.substr(0, verdicts.find('\n'));
  ASSERT_FALSE(first.empty()) << out.text;
  EXPECT_NE(first.find("\"culprits\":[1]"), std::string::npos) << first;
  // Ranks 0 and 2 issued the step's second allreduce, rank 1 (which skipped it) the next step's
  // first.
  EXPECT_NE(first.find("\"issued_at\":\"" + frameAt("all_reduce", "all_reduce") + " \u2190 " +
                       frameAt("step-second", "step")),
            std::string::npos)
      << first;
  EXPECT_NE(first.find("\"issued_at\":\"" + frameAt("all_reduce", "all_reduce") + " \u2190 " +
                       frameAt("step-first", "step")),
            std::string::npos)
      << first;
  EXPECT_NE(out.text.find("issued at " + kScript + ":"), std::string::npos) << out.text;
  std::filesystem::remove_all(logs);
  std::filesystem::remove(idFile);
}

}  // namespace
