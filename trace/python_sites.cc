#include "trace/python_sites.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

namespace ncclwatch::trace {
namespace {

constexpr std::string_view kSeparator = " | ";

// Frames of library code a user did not write: the package that called NCCL and its wrappers.
bool libraryFrame(const std::string& frame) {
  for (std::string_view marker : {"/site-packages/", "/dist-packages/", "/lib/python3"}) {
    if (frame.find(marker) != std::string::npos) return true;
  }
  return frame.rfind("<frozen ", 0) == 0;
}

}  // namespace

std::string formatPythonSites(const std::vector<PythonSite>& sites) {
  std::string text;
  for (const PythonSite& site : sites) {
    char head[48];
    std::snprintf(head, sizeof head, "%" PRIu32 " 0x%" PRIx64, site.number, site.nativeSite);
    text += head;
    for (size_t i = 0; i < site.frames.size(); ++i) {
      text += i == 0 ? " " : std::string(kSeparator);
      // A frame never contains the separator or a newline: they would split it.
      for (char c : site.frames[i]) text += (c == '\n' || c == '|') ? '?' : c;
    }
    text += '\n';
  }
  return text;
}

bool parsePythonSites(std::string_view text, std::vector<PythonSite>* sites, std::string* error) {
  size_t lineNumber = 0;
  while (!text.empty()) {
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    ++lineNumber;
    if (line.empty()) continue;
    PythonSite site;
    std::string owned(line);
    char* rest = nullptr;
    unsigned long number = std::strtoul(owned.c_str(), &rest, 10);
    if (rest == owned.c_str() || *rest != ' ' || number > UINT32_MAX) {
      *error = "sites line " + std::to_string(lineNumber) + ": no site number";
      return false;
    }
    char* afterNative = nullptr;
    site.number = static_cast<uint32_t>(number);
    site.nativeSite = std::strtoull(rest + 1, &afterNative, 16);
    if (afterNative == rest + 1 || (*afterNative != ' ' && *afterNative != '\0')) {
      *error = "sites line " + std::to_string(lineNumber) + ": no native address";
      return false;
    }
    std::string_view frames(afterNative);
    if (!frames.empty()) frames.remove_prefix(1);
    while (!frames.empty()) {
      size_t cut = frames.find(kSeparator);
      site.frames.emplace_back(frames.substr(0, cut));
      frames = cut == std::string_view::npos ? std::string_view()
                                             : frames.substr(cut + kSeparator.size());
    }
    sites->push_back(std::move(site));
  }
  return true;
}

std::string pythonApiOf(const PythonSite& site) {
  size_t first = 0;
  while (first < site.frames.size() && libraryFrame(site.frames[first])) ++first;
  if (first == 0 || first == site.frames.size()) return {};
  // Frames are "path:line function", innermost first: walk inward from the user's call past the
  // wrappers a decorator adds (c10d_logger's `wrapper`, contextlib's `__exit__`).
  for (size_t i = first; i-- > 0;) {
    const std::string& frame = site.frames[i];
    size_t space = frame.rfind(' ');
    if (space == std::string::npos) return {};
    std::string_view function = std::string_view(frame).substr(space + 1);
    std::string_view path = std::string_view(frame).substr(0, frame.rfind(':', space));
    bool decorator = path.ends_with("/c10d_logger.py") || path.ends_with("/contextlib.py") ||
                     path.ends_with("/functools.py") || function == "wrapper";
    if (decorator) continue;
    if (path.find("/torch/distributed/") == std::string_view::npos) return {};
    return std::string(function);
  }
  return {};
}

std::string issuedAtText(const PythonSite& site) {
  size_t first = 0;
  while (first < site.frames.size() && libraryFrame(site.frames[first])) ++first;
  if (first == site.frames.size()) first = 0;
  std::string text;
  for (size_t i = first; i < site.frames.size() && i < first + 2; ++i) {
    text += (i == first ? "" : " \u2190 ") + site.frames[i];
  }
  return text;
}

}  // namespace ncclwatch::trace
