// ncclwatch inspect beside verdicts.jsonl: the verdicts the collector said while the job ran come
// first, one line each, since after `run --abort` the traces hold what came after the hang; an
// unreadable line is counted, never fatal; a folder without the file prints no such section.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "inspect.h"
#include "trace/ring_writer.h"

namespace {

using namespace ncclwatch;

class InspectLive : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = "/tmp/inspect-live-" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    trace::RingWriter writer;
    ASSERT_TRUE(writer.open(dir_ + "/h-1.ncclwatch", 16, {0, 1, 0, "h", "job-live"}, nullptr));
    writer.close();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string inspect() {
    inspect::Options options;
    options.directory = dir_;
    options.colour = 0;
    std::ostringstream out, err;
    inspect::run(options, out, err);
    return out.str();
  }
  std::string dir_;
};

TEST_F(InspectLive, TheLiveVerdictsComeFirstAndABadLineIsCounted) {
  std::ofstream(dir_ + "/verdicts.jsonl")
      << R"({"kind":"deadlock","comm":{"hash":"acabede88d19cccc","size":2},"seq":3,)"
      << R"("culprits":[1],"explanation":"rank 0 waits for rank 1"})"
      << "\n"
      << "{not json\n";
  std::string text = inspect();
  EXPECT_EQ(text.rfind("Live verdicts, said while the job ran (", 0), 0u) << text;
  EXPECT_NE(text.find("\n  DEADLOCK on comm acab\u2026(2 ranks) at call #3, culprit 1: rank 0 "
                      "waits for rank 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  (1 unreadable lines skipped)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Job job-live"), std::string::npos) << text;  // the offline part follows
}

// An init nobody finished is a verdict on no communicator ("comm": null): read, not skipped
// (exp23's late_init showed it as an unreadable line).
TEST_F(InspectLive, AVerdictOnNoCommunicatorIsRead) {
  std::ofstream(dir_ + "/verdicts.jsonl")
      << R"({"kind":"init_hang","comm":null,"seq":0,"culprits":[2],)"
      << R"("explanation":"rank 2 never joined"})"
      << "\n";
  std::string text = inspect();
  EXPECT_NE(text.find("\n  INIT_HANG, culprit 2: rank 2 never joined\n"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("unreadable"), std::string::npos) << text;
}

// A withdrawal marks the verdict it withdraws (a rank alive but silent that resumed: a long
// checkpoint), the same comm and call; one with nothing to mark stands as its own line.
TEST_F(InspectLive, AWithdrawalMarksTheVerdictItWithdraws) {
  std::ofstream(dir_ + "/verdicts.jsonl")
      << R"({"kind":"dead_rank","comm":{"hash":"b8f2d2058bdc190d","size":4},"seq":18,)"
      << R"("culprits":[0],"explanation":"rank 0 is alive but stopped issuing NCCL calls"})"
      << "\n"
      << R"({"kind":"withdrawn","withdraws":"dead_rank","comm":{"hash":"b8f2d2058bdc190d",)"
      << R"("size":4},"seq":18,"culprits":[0],"explanation":"rank 0 issued NCCL calls again"})"
      << "\n"
      << R"({"kind":"withdrawn","withdraws":"dead_rank","comm":{"hash":"0000d2058bdc190d",)"
      << R"("size":4},"seq":5,"culprits":[1],"explanation":"rank 1 issued NCCL calls again"})"
      << "\n";
  std::string text = inspect();
  EXPECT_NE(text.find("\n  DEAD_RANK on comm b8f2\u2026(4 ranks) at call #18, culprit 0: rank 0 is "
                      "alive but stopped issuing NCCL calls [withdrawn: rank 0 issued NCCL calls "
                      "again]\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\n  WITHDRAWN on comm 0000\u2026(4 ranks) at call #5, culprit 1: rank 1 "
                      "issued NCCL calls again\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("unreadable"), std::string::npos) << text;
}

TEST_F(InspectLive, WithoutTheFileThereIsNoSuchSection) {
  EXPECT_EQ(inspect().find("Live verdicts"), std::string::npos);
}

}  // namespace
