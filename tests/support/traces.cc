#include "traces.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace testsupport {

std::string freshDirectory(const std::string& name, bool create) {
  const char* base = std::getenv("TMPDIR");
  std::string directory = std::string(base != nullptr && *base ? base : "/tmp") + "/nw-" + name +
                          "-" + std::to_string(getpid());
  std::filesystem::remove_all(directory);
  if (create) std::filesystem::create_directories(directory);
  return directory;
}

std::vector<ncclwatch::trace::TraceFile> readTraceFiles(const std::string& directory) {
  std::vector<ncclwatch::trace::TraceFile> files;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    if (entry.path().extension() == ".ncclwatch") {
      files.push_back(ncclwatch::trace::readTraceFile(entry.path()));
    }
  }
  std::sort(files.begin(), files.end(),
            [](const auto& a, const auto& b) { return a.header.rank < b.header.rank; });
  return files;
}

namespace {
constexpr const char* kInformation = "\"effect\":\"information\"";
}

std::string firstErrorVerdict(const std::string& logs) {
  std::string verdicts = readFile(logs + "/verdicts.jsonl");
  for (size_t start = 0; start < verdicts.size();) {
    size_t end = verdicts.find('\n', start);
    if (end == std::string::npos) end = verdicts.size();
    std::string line = verdicts.substr(start, end - start);
    if (!line.empty() && line.find(kInformation) == std::string::npos) return line;
    start = end + 1;
  }
  return {};
}

std::string hasErrorVerdictCondition(const std::string& logs) {
  return std::string("grep -qv '") + kInformation + "' " + logs + "/verdicts.jsonl 2>/dev/null";
}

std::string readFile(const std::string& path) {
  // libstdc++'s filebuf throws on a read error even without an exception mask: a /proc file
  // of a process that exits while it is read (ESRCH) must read as what was there, not end the
  // test.
  std::ifstream in(path);
  std::string text;
  try {
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception&) {
  }
  return text;
}

}  // namespace testsupport
