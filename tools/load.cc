#include "load.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace ncclwatch::cli {
namespace {

// A one-line counter on stderr, redrawn at most every 100 ms, shown only on a terminal and
// only once reading has taken 300 ms.
class Progress {
 public:
  explicit Progress(size_t total)
      : total_(total), enabled_(isatty(STDERR_FILENO) != 0), start_(Clock::now()) {}
  ~Progress() {
    if (shown_) std::fputs("\r\033[K", stderr);
  }
  void update(size_t done) {
    if (!enabled_) return;
    auto now = Clock::now();
    if (now - start_ < std::chrono::milliseconds(300) ||
        now - last_ < std::chrono::milliseconds(100)) {
      return;
    }
    last_ = now;
    shown_ = true;
    std::fprintf(stderr, "\r\033[K[ncclwatch] reading trace files: %zu/%zu", done, total_);
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  size_t total_;
  bool enabled_;
  bool shown_ = false;
  Clock::time_point start_, last_{};
};

}  // namespace

bool loadTraces(const std::string& directory, const std::string& command, std::ostream& err,
                Loaded* loaded) {
  namespace fs = std::filesystem;
  const std::string prefix = "ncclwatch " + command + ": ";
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) {
    err << prefix << directory << " is not a readable folder\n";
    return false;
  }
  std::vector<std::string> paths;
  fs::recursive_directory_iterator it(directory, fs::directory_options::skip_permission_denied, ec);
  if (ec) {
    err << prefix << "cannot read " << directory << ": " << ec.message() << "\n";
    return false;
  }
  for (auto end = fs::recursive_directory_iterator(); it != end; it.increment(ec)) {
    if (ec) {
      err << prefix << ec.message() << "\n";
      break;
    }
    if (it->is_regular_file(ec) && it->path().extension() == ".ncclwatch") {
      paths.push_back(it->path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  loaded->found = static_cast<int>(paths.size());
  if (paths.empty()) {
    err << prefix << "no .ncclwatch files under " << directory << "\n";
    return false;
  }
  loaded->files.reserve(paths.size());
  {
    Progress progress(paths.size());
    for (size_t i = 0; i < paths.size(); ++i) {
      progress.update(i);
      trace::TraceFile file = trace::readTraceFile(paths[i]);
      if (!file.usable) {
        ++loaded->unusable;
        err << prefix << paths[i] << ": not usable";
        if (!file.problems.empty()) err << " (" << file.problems.front().what << ")";
        err << "\n";
        continue;
      }
      if (!file.problems.empty()) {
        ++loaded->damaged;
        err << prefix << paths[i] << ": " << file.problems.size()
            << " problem(s), first: " << file.problems.front().what << "; using what is valid\n";
      }
      loaded->files.push_back(std::move(file));
    }
  }
  if (loaded->files.empty()) {
    err << prefix << "none of the " << paths.size() << " files is a usable trace\n";
    return false;
  }
  return true;
}

bool useColour(int choice, int fd) {
  if (choice >= 0) return choice == 1;
  return isatty(fd) != 0 && std::getenv("NO_COLOR") == nullptr;
}

}  // namespace ncclwatch::cli
