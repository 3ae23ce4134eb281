// ncclwatch show: what a user reads off one ring file — the process line, the communicator table,
// one row per record with its state — and JSON that parses, with problems reported, not hidden.
#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>

#include <sstream>

#include "show.h"
#include "trace/ring_reader.h"
#include "trace/ring_writer.h"

namespace {

using namespace ncclwatch;

class ShowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/tmp/show-test-" + std::to_string(getpid()) + ".ncclwatch";
    trace::RingWriter writer;
    ASSERT_TRUE(writer.open(path_, 16, {3, 8, 3, "node7", "job42"}, nullptr));
    writer.setNcclLibrary(22809, "/opt/nccl/libnccl.so.2");
    trace::CommInfo comm{};
    comm.commHash = 0x9f3a000000000001;
    comm.nranks = 8;
    comm.rank = 3;
    comm.color = -1;
    comm.kind = static_cast<uint8_t>(trace::OpKind::kInit);
    std::snprintf(comm.name, sizeof comm.name, "world");
    writer.addComm(comm);
    int64_t anchor = trace::readTraceFile(path_).header.anchorMonotonicNs;
    trace::CallRecord allreduce{};
    allreduce.commHash = comm.commHash;
    allreduce.seq = 1;
    allreduce.op = trace::OpKind::kAllReduce;
    allreduce.count = 4194304;
    allreduce.dtype = 7;
    allreduce.redop = 0;
    allreduce.rootOrPeer = -1;
    allreduce.state = trace::RecordState::kIssued;
    allreduce.issueNs = anchor + 2'000'000;
    uint64_t index = writer.append(allreduce);
    writer.updateState(index, trace::RecordState::kCompleted, anchor + 2'500'000,
                       anchor + 4'000'000);
    trace::CallRecord broadcast = allreduce;
    broadcast.seq = 2;
    broadcast.op = trace::OpKind::kBroadcast;
    broadcast.rootOrPeer = 0;
    broadcast.issueNs = anchor + 5'000'000;
    writer.append(broadcast);
  }
  void TearDown() override { unlink(path_.c_str()); }
  std::string path_;
};

TEST_F(ShowTest, TableNamesProcessCommAndEveryRecord) {
  std::ostringstream out, err;
  EXPECT_EQ(show::run(path_, false, out, err), 0);
  std::string text = out.str();
  EXPECT_NE(text.find(", rank 3 of 8 (local 3), job job42\n"), std::string::npos) << text;
  EXPECT_NE(text.find("nccl: 22809 /opt/nccl/libnccl.so.2\n"), std::string::npos);
  EXPECT_NE(text.find("ended: not cleanly"), std::string::npos);
  EXPECT_NE(text.find("  9f3a000000000001  -                     8     3     -1  Init    world\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("      1  AllReduce         4194304  float     sum        -1  completed  "
                      "     2.000       2.500       4.000  0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("      2  Broadcast         4194304  float     -           0  issued     "
                      "     5.000           -           -  0\n"),
            std::string::npos)
      << text;
}

TEST_F(ShowTest, JsonParsesAndCarriesTheRecords) {
  std::ostringstream out, err;
  ASSERT_EQ(show::run(path_, true, out, err), 0);
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  ASSERT_EQ(parser.parse(out.str()).get(root), simdjson::SUCCESS) << out.str();
  EXPECT_EQ(int64_t(root["rank"]), 3);
  EXPECT_EQ(std::string_view(root["communicators"].at(0)["comm"]), "9f3a000000000001");
  simdjson::dom::array records = root["records"];
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(std::string_view(records.at(0)["state"]), "completed");
  EXPECT_EQ(std::string_view(records.at(1)["op"]), "Broadcast");
  EXPECT_EQ(int64_t(records.at(1)["root_or_peer"]), 0);
}

TEST_F(ShowTest, DamagedFilesReportProblemsOrRefuse) {
  ASSERT_EQ(truncate(path_.c_str(), trace::kRingHeaderBytes + 128 * 8 + 5), 0);
  std::ostringstream out, err;
  EXPECT_EQ(show::run(path_, false, out, err), 1);
  EXPECT_NE(out.str().find("problem at offset 17408: file truncated: 8 of 16 record slots present"),
            std::string::npos)
      << out.str();
  std::ostringstream out2, err2;
  EXPECT_EQ(show::run("/nonexistent.ncclwatch", false, out2, err2), 2);
  EXPECT_EQ(err2.str(),
            "ncclwatch show: /nonexistent.ncclwatch: cannot open: No such file or directory\n");
}

}  // namespace
