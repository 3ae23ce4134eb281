// End to end: 8 ranks of examples/train_loop on the sim with rank 3 skipping a DP bucket at step
// 2, recorded by libncclwatch.so with NCCLWATCH_ON_HANG=dump; once every rank has dumped on the
// hang the job is killed. `ncclwatch stacks` (text and JSON, normalized) must match the golden
// files, and `ncclwatch report`'s page, rendered by headless Chromium, must show the verdict,
// the culprit and the stack frames without console errors.
#include <gtest/gtest.h>
#include <signal.h>
#include <simdjson.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "command.h"
#include "job.h"
#include "trace/ring_reader.h"

namespace {

using namespace std::chrono_literals;

using testsupport::Output;

// stderr goes to `stderrTo` (a file, /dev/null, or &1 for stdout).
Output command(const std::string& line, const std::string& stderrTo = "/dev/null") {
  return testsupport::command(line, "2>" + stderrTo);
}

std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Whether every rank's file holds a dump the watchdog took on the hang.
bool everyRankDumped(const std::string& logs, int ranks) {
  int dumped = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(logs, ec)) {
    if (entry.path().extension() != ".ncclwatch") continue;
    auto file = ncclwatch::trace::readTraceFile(entry.path());
    for (const auto& dump : file.dumps) {
      if (dump.trigger == "hang") {
        ++dumped;
        break;
      }
    }
  }
  return dumped == ranks;
}

// Pids, tids, addresses, offsets, hashes and times vary from run to run; line numbers change
// with every edit of the sources (SourceLine checks the one that matters).
std::string normalize(std::string text) {
  text = std::regex_replace(text, std::regex(" at ([^ \":]+):[0-9]+"), " at $1:N");
  text = std::regex_replace(text, std::regex("[0-9a-f]{16}"), "HASH");
  text = std::regex_replace(text, std::regex("[0-9a-f]{4}\u2026"), "HASH\u2026");
  text = std::regex_replace(text, std::regex("0x[0-9a-f]+"), "ADDR");
  text = std::regex_replace(text, std::regex("tid [0-9]+"), "tid N");
  text = std::regex_replace(text, std::regex("/[^ \"]*/"), "PATH/");
  return text;
}

void expectGolden(const std::string& name, const std::string& got, const std::string& full) {
  std::string golden = std::string(NCCLWATCH_GOLDEN_DIR) + "/" + name;
  if (std::getenv("NCCLWATCH_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(golden) << got;
    return;
  }
  EXPECT_EQ(got, readText(golden)) << "golden " << golden << " differs; full output:\n" << full;
}

class HungJob : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    logs_ = std::string(testing::TempDir()) + "/nw-stacks-skip-" + std::to_string(getpid());
    std::filesystem::remove_all(logs_);
    testsupport::JobSpec spec;
    spec.program = testsupport::buildDir() + "/examples/train_loop";
    spec.args = {"--steps", "4", "--bug", "skip:rank=3,step=2", "--quiet"};
    spec.ranks = 8;
    spec.env = {{"LD_PRELOAD", NCCLWATCH_PRELOAD}, {"NCCLWATCH_DIR", logs_},
                {"NCCLWATCH_ON_HANG", "dump"},     {"NCCLWATCH_HANG_MS", "1500"},
                {"NCCLWATCH_WARN_MS", "700"},      {"NCCLWATCH_POLL_MS", "50"}};
    testsupport::Job job(spec);
    auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!(dumped_ = everyRankDumped(logs_, spec.ranks)) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(100ms);
    }
    job.signalAll(SIGKILL);
    job.waitExit(10s);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(logs_); }
  void SetUp() override { ASSERT_TRUE(dumped_) << "not every rank dumped on the hang"; }

  static std::string logs_;
  static bool dumped_;
};
std::string HungJob::logs_;
bool HungJob::dumped_ = false;

TEST_F(HungJob, StacksTextMatchesTheGolden) {
  Output text = command(std::string(NCCLWATCH_BINARY) + " stacks " + logs_);
  EXPECT_EQ(text.status, 0) << text.text;
  // Classes and the representative come first, then suspects, then the trees.
  EXPECT_EQ(text.text.find("Stacks of 8 ranks"), 0u) << text.text;
  EXPECT_LT(text.text.find("representative ranks:"), text.text.find("Suspects on comm"));
  EXPECT_NE(text.text.find("  rank 3  issued #14, completed #10, 1 behind  (culprit)"),
            std::string::npos)
      << text.text;
  EXPECT_NE(text.text.find("[0-7] (anonymous namespace)::TrainLoop::runStep(int) at "),
            std::string::npos)
      << text.text;
  expectGolden("stacks_skip.txt", normalize(text.text), text.text);
}

// The hung call's frame names the line of examples/train_loop.cc that waits, as a user opens it.
TEST_F(HungJob, RunStepFrameNamesTheLineThatWaits) {
  Output text = command(std::string(NCCLWATCH_BINARY) + " stacks " + logs_);
  std::smatch where;
  const std::string out = text.text;
  ASSERT_TRUE(std::regex_search(
      out, where,
      std::regex("TrainLoop::runStep\\(int\\) at (/[^ :]+/examples/train_loop\\.cc):([0-9]+)")))
      << out;
  std::ifstream source(where[1].str());
  std::string line;
  for (int n = std::stoi(where[2].str()); n > 0 && std::getline(source, line);) --n;
  EXPECT_NE(line.find("cudaStreamSynchronize"), std::string::npos)
      << where[1] << ":" << where[2] << " is `" << line << "`";
  // main calls it through an inlined function: shown as a frame of its own.
  EXPECT_TRUE(std::regex_search(out, std::regex("train_loop\\.cc:[0-9]+ \\(inlined\\)"))) << out;
}

TEST_F(HungJob, StacksJsonMatchesTheGolden) {
  Output json = command(std::string(NCCLWATCH_BINARY) + " stacks --json " + logs_);
  EXPECT_EQ(json.status, 0) << json.text;
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(json.text);
  EXPECT_EQ(int64_t(doc["ranks"]), 8);
  EXPECT_EQ(int64_t(doc["suspects"].at(0)["rank"]), 3);
  EXPECT_TRUE(bool(doc["suspects"].at(0)["culprit"]));
  for (simdjson::dom::element note : simdjson::dom::array(doc["rank_notes"])) {
    EXPECT_EQ(std::string_view(note["trigger"]), "hang");
  }
  expectGolden("stacks_skip.json", normalize(json.text), json.text);
}

TEST_F(HungJob, AllThreadsAndModuleKeysShowMore) {
  Output all = command(std::string(NCCLWATCH_BINARY) + " stacks --all-threads " + logs_);
  EXPECT_EQ(all.status, 0) << all.text;
  EXPECT_NE(all.text.find("ncclwatch::watchdog::Agent::run()"), std::string::npos) << all.text;
  EXPECT_NE(all.text.find("cudasim::waitFor"), std::string::npos) << all.text;
  Output module = command(std::string(NCCLWATCH_BINARY) + " stacks --by module " + logs_);
  EXPECT_EQ(module.status, 0) << module.text;
  EXPECT_TRUE(std::regex_search(module.text, std::regex("\\] train_loop\\+0x[0-9a-f]+ "
                                                        "\\(anonymous namespace\\)::TrainLoop::"
                                                        "runStep\\(int\\)")))
      << module.text;
  Output bad = command(std::string(NCCLWATCH_BINARY) + " stacks --by line " + logs_);
  EXPECT_EQ(bad.status, 2);
}

// Whether one of lines [line - 2, line] of `path` holds `text`: a call spread over several lines
// is attributed to one of them.
bool sourceNear(const std::string& path, int line, const std::string& text) {
  std::ifstream source(path);
  std::string current;
  for (int n = 1; n <= line && std::getline(source, current); ++n) {
    if (n >= line - 2 && current.find(text) != std::string::npos) return true;
  }
  return false;
}

// Every rank dumped, so each verdict class's native call site maps into train_loop's DWARF:
// `inspect` names the line that issued the call, in text, JSON and the HTML page.
TEST_F(HungJob, InspectNamesTheLineThatIssuedEachCall) {
  Output text = command(std::string(NCCLWATCH_BINARY) + " inspect " + logs_);
  std::smatch where;
  ASSERT_TRUE(std::regex_search(
      text.text, where,
      std::regex("AllReduce [^\n]* issued at (/[^ :]+/examples/train_loop\\.cc):([0-9]+) "
                 "\\(anonymous namespace\\)::TrainLoop::[^\n]* \u2190 [^\n]*train_loop\\.cc:[0-9]+ "
                 "\\(anonymous namespace\\)::TrainLoop::runStep(\\(int\\))?\n")))
      << text.text;
  EXPECT_TRUE(sourceNear(where[1].str(), std::stoi(where[2].str()), "ncclAllReduce"))
      << where[1] << ":" << where[2];
  Output json = command(std::string(NCCLWATCH_BINARY) + " inspect --json " + logs_);
  EXPECT_TRUE(std::regex_search(json.text, std::regex("\"issued_at\":\"/[^\"]+/train_loop\\.cc:")))
      << json.text;
  EXPECT_TRUE(std::regex_search(
      json.text, std::regex("\"stack_top\":\"[^\"]*TrainLoop::runStep\\(int\\) at /[^\"]+/"
                            "train_loop\\.cc:[0-9]+")))
      << json.text;
  std::string page = logs_ + "-lines.html";
  ASSERT_EQ(command(std::string(NCCLWATCH_BINARY) + " report " + logs_ + " -o " + page).status, 0);
  std::string html = readText(page);
  EXPECT_TRUE(std::regex_search(html, std::regex("TrainLoop::runStep\\(int\\) at /[^ ]+/"
                                                 "train_loop\\.cc:[0-9]+")))
      << html;
  std::filesystem::remove(page);
  // The Perfetto timeline's verdict and dump marks carry the same lines.
  Output timeline = command(std::string(NCCLWATCH_BINARY) + " timeline " + logs_ + " -o -");
  EXPECT_TRUE(std::regex_search(timeline.text,
                                std::regex("\"issued_at\":\"/[^\"]+/train_loop\\.cc:[0-9]+")))
      << timeline.text.substr(0, 2000);
  EXPECT_TRUE(std::regex_search(timeline.text,
                                std::regex("\"stack_top\":\"[^\"]*runStep\\(int\\) at /[^\"]+/"
                                           "train_loop\\.cc:[0-9]+")))
      << timeline.text.substr(0, 2000);
}

// Chromium from Debian's `chromium` package (scripts/setup.sh installs it).
std::string chromium() {
  for (const char* path : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

TEST_F(HungJob, ReportPageShowsTheVerdictCulpritAndStacksInABrowser) {
  std::string page = logs_ + "-report.html";
  Output written =
      command(std::string(NCCLWATCH_BINARY) + " report " + logs_ + " -o " + page, "&1");
  ASSERT_EQ(written.status, 0) << written.text;
  std::string html = readText(page);
  EXPECT_EQ(html.find("<script"), std::string::npos) << "no script needed";
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"))
      << "no external resource";
  EXPECT_NE(html.find("<svg"), std::string::npos);

  std::string browser = chromium();
  if (browser.empty()) {
    GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs Debian's chromium)";
  }
  std::string screenshot = testsupport::buildDir() + "/report_skip.png";
  std::string profile = logs_ + "-chromium";
  std::string flags =
      " --headless --no-sandbox --disable-gpu --hide-scrollbars "
      "--enable-logging=stderr --v=0 --user-data-dir=" +
      profile + " --window-size=1200,2200 ";
  std::string log = logs_ + "-chromium.log";
  Output dom = command("timeout 90 " + browser + flags + "--dump-dom file://" + page, log.c_str());
  ASSERT_EQ(dom.status, 0) << readText(log);
  std::string console = readText(log);
  EXPECT_EQ(console.find("Uncaught"), std::string::npos) << console;
  EXPECT_EQ(console.find("ERROR:CONSOLE"), std::string::npos) << console;
  // What a user sees: the verdict, the culprit, the frames.
  EXPECT_NE(dom.text.find("[ncclwatch] MISMATCH on comm"), std::string::npos) << dom.text;
  EXPECT_NE(dom.text.find("culprit rank 3"), std::string::npos) << dom.text;
  EXPECT_NE(dom.text.find("rank 3 \u25c0 culprit"), std::string::npos) << "timeline row";
  EXPECT_NE(dom.text.find("runStep"), std::string::npos);
  EXPECT_NE(dom.text.find("cudasim::waitFor"), std::string::npos);
  EXPECT_NE(dom.text.find("<td>hang: "), std::string::npos) << "dump trigger per rank";

  std::filesystem::remove(screenshot);
  Output shot =
      command("timeout 90 " + browser + flags + "--screenshot=" + screenshot + " file://" + page,
              log.c_str());
  EXPECT_EQ(shot.status, 0) << readText(log);
  EXPECT_GT(std::filesystem::exists(screenshot) ? std::filesystem::file_size(screenshot) : 0,
            10000u)
      << readText(log);
  console = readText(log);
  EXPECT_EQ(console.find("Uncaught"), std::string::npos) << console;
  EXPECT_EQ(console.find("ERROR:CONSOLE"), std::string::npos) << console;
  std::filesystem::remove_all(profile);
  std::filesystem::remove(page);
  std::filesystem::remove(log);
}

}  // namespace
