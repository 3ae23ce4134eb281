// Our decoders of CPython's line tables against what each installed CPython (3.10-3.13) says of
// its own code objects (co_lines), for every instruction, including tables with long line jumps
// (varints) and lines that go backwards; and the bounds on malformed tables.
#include "trace/python_lines.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "command.h"

namespace {

using ncclwatch::trace::lineFromLineTable310;
using ncclwatch::trace::lineFromLocationTable;

std::vector<uint8_t> fromHex(const std::string& hex) {
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return bytes;
}

TEST(PythonLines, EveryInstructionGetsTheLineCPythonGivesIt) {
  int interpreters = 0;
  for (const char* version : {"3.10", "3.11", "3.12", "3.13"}) {
    std::string python = testsupport::command(std::string("ls -d /root/.pyenv/versions/") +
                                              version + ".*/bin/python 2>/dev/null | head -1")
                             .text;
    while (!python.empty() && python.back() == '\n') python.pop_back();
    if (python.empty()) continue;
    ++interpreters;
    testsupport::Output out = testsupport::command(python + " " NCCLWATCH_TABLES_SCRIPT);
    ASSERT_EQ(out.status, 0) << out.text;
    std::istringstream lines(out.text);
    std::string line;
    int checked = 0;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      int minor = 0, firstLine = 0;
      std::string hex, ranges;
      fields >> minor >> firstLine >> hex >> ranges;
      std::vector<uint8_t> table = fromHex(hex);
      std::istringstream each(ranges);
      std::string range;
      while (std::getline(each, range, ',')) {
        unsigned start = 0, end = 0;
        int expected = 0;
        ASSERT_EQ(std::sscanf(range.c_str(), "%u:%u:%d", &start, &end, &expected), 3) << range;
        for (unsigned byte = start; byte < end; byte += 2) {
          int got = minor == 10 ? lineFromLineTable310(table, firstLine, byte)
                                : lineFromLocationTable(table, firstLine, byte / 2);
          ASSERT_EQ(got, expected) << "3." << minor << " byte " << byte << " of " << line;
          ++checked;
        }
      }
    }
    EXPECT_GT(checked, 50) << version;
  }
  if (interpreters == 0) GTEST_SKIP() << "no CPython 3.10-3.13 under /root/.pyenv/versions";
}

TEST(PythonLines, MalformedOrShortTablesGiveNoLine) {
  // An entry without bit 7, a long-form entry cut short, an offset past the end.
  EXPECT_EQ(lineFromLocationTable(std::vector<uint8_t>{0x01}, 10, 0), -1);
  EXPECT_EQ(lineFromLocationTable(std::vector<uint8_t>{0xf0}, 10, 0), -1);  // long form, no body
  EXPECT_EQ(lineFromLocationTable(std::vector<uint8_t>{0xe8, 0x02}, 10, 5), -1);
  EXPECT_EQ(lineFromLocationTable({}, 10, 0), -1);
  // NO_COLUMNS (13) with a signed varint +2 covering one code unit: line 12; NONE (15): no line.
  std::vector<uint8_t> table = {0x80 | (13 << 3), 0x04, 0x80 | (15 << 3)};
  EXPECT_EQ(lineFromLocationTable(table, 10, 0), 12);
  EXPECT_EQ(lineFromLocationTable(table, 10, 1), -1);
  EXPECT_EQ(lineFromLineTable310(std::vector<uint8_t>{4, 1, 4, 0x80}, 7, 2), 8);
  EXPECT_EQ(lineFromLineTable310(std::vector<uint8_t>{4, 1, 4, 0x80}, 7, 6), -1);  // -128: none
  EXPECT_EQ(lineFromLineTable310(std::vector<uint8_t>{4}, 7, 0), -1);              // odd length
}

}  // namespace
