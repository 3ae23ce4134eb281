// Unmodified PyTorch (ProcessGroupNCCL under the real torchrun, from scripts/torch_venv.sh's
// venv) hanging on the sim, each with a bug users meet: a skipped gradient all_reduce, a shape
// that differs, a rank that raises and exits, a subgroup barrier one rank skips. ncclwatch, with
// PyTorch's own watchdog and Flight Recorder on at their defaults beside it, names the rank and
// the Python line that issued the hung call. Skipped, saying why, without the venv.
#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "command.h"
#include "job.h"
#include "traces.h"

namespace {

const std::string kCli = NCCLWATCH_BINARY;
const std::string kVenv = NCCLWATCH_TORCH_VENV;
const std::string kScript = NCCLWATCH_HANGS_SCRIPT;

int lineOf(const std::string& marker) {
  std::ifstream in(kScript);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find(marker) != std::string::npos) return number;
  }
  return -1;
}

std::string siteOf(const std::string& marker) {
  return kScript + ":" + std::to_string(lineOf(marker)) + " train";
}

struct Hang {
  const char* bug;
  const char* kind;           // the first live verdict
  const char* culprits;       // "1" etc.
  const char* hungLine;       // marker of the line that issued the hung call
  const char* explains = "";  // words the verdict's explanation must hold, when set
};

void PrintTo(const Hang& hang, std::ostream* out) {
  *out << hang.bug;
}

class PytorchHang : public ::testing::TestWithParam<Hang> {
 protected:
  void SetUp() override {
    if (access((kVenv + "/.ncclwatch-torch-ok").c_str(), R_OK) != 0) {
      GTEST_SKIP() << "no torch venv at " << kVenv
                   << " (scripts/torch_venv.sh installs it; needs PyPI)";
    }
  }
  // `ncclwatch run --abort` around the real torchrun, the sim preloaded as torch needs it.
  testsupport::Output run(const std::string& logs, const std::string& bug) {
    std::string sim = testsupport::simLibDir();
    return testsupport::command(
        "LD_PRELOAD=" + sim + "/libcuda.so.1:" + sim + "/libcudart.so.13:" + sim +
        "/libnccl.so.2 OMP_NUM_THREADS=1 timeout 150 " + kCli + " run --abort --dir " + logs +
        " -- " + kVenv + "/bin/torchrun --standalone --nproc_per_node=4 " + kScript + " --bug " +
        bug);
  }
};

// The merged stacks of the hang read as one path from the script's line down to the wait:
// ranks 0, 2 and 3 wait in `grad.sum().item()` for the stream that runs the all_reduce rank 1
// skipped (ProcessGroupNCCL's all_reduce returns at once: the NCCL call itself is on no host
// thread's stack, its kernel runs on the sim's stream worker). Their thread that matters has a
// mixed stack whose path holds the script's line and, below it, the CUDA call that waits.
void expectMixedStack(const std::string& logs) {
  testsupport::Output stacks = testsupport::command(kCli + " stacks --json " + logs, "2>/dev/null");
  ASSERT_EQ(stacks.status, 0) << stacks.text;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(stacks.text).get(doc), simdjson::SUCCESS) << stacks.text;
  std::string waitLine = kScript + ":" + std::to_string(lineOf("# WAIT")) + " train";
  bool found = false;
  for (simdjson::dom::element c : doc["classes"].get_array()) {
    std::vector<std::string> path;
    for (simdjson::dom::element label : c["path"].get_array()) {
      path.emplace_back(std::string_view(label));
    }
    auto line = std::find(path.begin(), path.end(), waitLine);
    if (line == path.end()) continue;
    EXPECT_EQ(std::string_view(c["user_line"]), waitLine);
    found = std::find(line, path.end(), "cudaStreamSynchronize") != path.end();
    EXPECT_TRUE(found) << "no CUDA wait below the script's line in one path:\n" << stacks.text;
    EXPECT_EQ(std::string_view(c["ranks"]), "0,2-3") << stacks.text;
  }
  EXPECT_TRUE(found) << "no class path holds " << waitLine << ":\n" << stacks.text;
  testsupport::Output text = testsupport::command(kCli + " stacks " + logs, "2>/dev/null");
  std::printf("%s\n", text.text.c_str());  // for the log: the mixed tree as users read it
}

TEST_P(PytorchHang, TheVerdictNamesTheRankAndThePythonLine) {
  const Hang& hang = GetParam();
  std::string logs = testsupport::freshDirectory(std::string("pytorch-") + hang.bug);
  testsupport::Output out = run(logs, hang.bug);
  EXPECT_NE(out.status, 124) << "still hanging when the test's bound ran out\n" << out.text;
  // Aborted, the job failed (a rank that ended normally after the abort, its collective's
  // result lost, still makes `run` fail), and no call of PyTorch's reached the communicator
  // NCCL freed in ncclwatch's abort (the sim stops a process on such a use after free).
  EXPECT_NE(out.status, 0) << out.text;
  EXPECT_EQ(out.text.find("use after free"), std::string::npos) << out.text;
  std::string first = testsupport::firstErrorVerdict(logs);
  ASSERT_FALSE(first.empty()) << out.text;
  EXPECT_NE(first.find(std::string("\"kind\":\"") + hang.kind + "\""), std::string::npos) << first;
  EXPECT_NE(first.find(std::string("\"culprits\":[") + hang.culprits + "]"), std::string::npos)
      << first;
  // Where the hung call was issued, from the Python frames recorded with it.
  EXPECT_NE(first.find("\"issued_at\":\"" + siteOf(hang.hungLine)), std::string::npos) << first;
  EXPECT_NE(first.find(hang.explains), std::string::npos) << first;
  // PyTorch's own machinery ran beside ours: nothing of ours broke the job's start, its
  // collectives before the bug, or its watchdog (it reports the abort).
  EXPECT_NE(out.text.find("rank 0: step 1 done"), std::string::npos) << out.text;
  if (std::string(hang.bug) == "skip") expectMixedStack(logs);
  std::filesystem::remove_all(logs);
}

INSTANTIATE_TEST_SUITE_P(
    Bugs, PytorchHang,
    ::testing::Values(Hang{"skip", "missing", "1", "# HUNG skip"},
                      Hang{"shape", "mismatch", "1", "# HUNG shape"},
                      Hang{"raise", "dead_rank", "2", "dist.all_reduce(grad)  # the step",
                           "rank 2 failed (exit status 1)"},
                      // Shapes written after the detection was (session 17): a root, a
                      // reduction (silent) and an extra call, which it got right as it was.
                      Hang{"root", "mismatch", "2", "# HUNG root"},
                      Hang{"redop", "mismatch", "1", "# HUNG redop"},
                      Hang{"extra", "mismatch", "2", "# HUNG extra"},
                      // Each of ranks 1 and 2 receives from the other before it sends.
                      Hang{"recvfirst", "deadlock", "1,2", "# HUNG recvfirst"},
                      // Session 18: a tagged exchange posted in another order on each side.
                      Hang{"tags", "unmatched_p2p", "1,2", "# HUNG tags",
                           "the same sizes in another order"}),
    [](const ::testing::TestParamInfo<Hang>& info) { return std::string(info.param.bug); });

// Rank 1 skips a barrier of the subgroup {0, 1}: rank 0 waits in it; ranks 1-3 wait in the
// world's next all_reduce for rank 0, and rank 1's next barrier is queued behind that. Each
// communicator alone would blame the other side (the world: rank 0 never came); the live
// verdict follows the cycle and names rank 1, which left the order of calls it kept until then,
// and the barrier's line.
TEST_F(PytorchHang, ASkippedSubgroupBarrierNamesTheRankThatSkippedIt) {
  std::string logs = testsupport::freshDirectory("pytorch-subgroup");
  testsupport::Output out = run(logs, "subgroup");
  EXPECT_NE(out.status, 124) << out.text;
  std::string first = testsupport::firstErrorVerdict(logs);
  ASSERT_FALSE(first.empty()) << out.text;
  EXPECT_NE(first.find("\"kind\":\"deadlock\""), std::string::npos) << first;
  EXPECT_NE(first.find("\"culprits\":[1]"), std::string::npos) << first;
  EXPECT_NE(first.find("\"issued_at\":\"" + siteOf("# HUNG subgroup")), std::string::npos) << first;
  EXPECT_NE(out.text.find("Rank 1 broke the order of calls it kept until here"), std::string::npos)
      << out.text;
  std::filesystem::remove_all(logs);
}

}  // namespace
