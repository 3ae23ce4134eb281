// libFuzzer target: the line-table decoders and the sites-text parser accept any bytes without
// crashing or reading past them; a decoded line is -1 or reachable from the first line by the
// table's deltas; parsed sites re-format to text that parses to the same sites.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trace/python_lines.h"
#include "trace/python_sites.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const uint32_t offset = static_cast<uint32_t>(data[0]) | (static_cast<uint32_t>(data[1]) << 8);
  const int firstLine = data[2];
  std::span<const uint8_t> table(data + 3, size - 3);
  int line = ncclwatch::trace::lineFromLocationTable(table, firstLine, offset);
  if (line < -1) std::abort();
  line = ncclwatch::trace::lineFromLineTable310(table, firstLine, offset);
  // Each two-byte entry moves the line by at most 127 either way.
  if (line < -1 || line > firstLine + 127 * static_cast<int>(table.size() / 2 + 1)) std::abort();

  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<ncclwatch::trace::PythonSite> sites;
  std::string error;
  ncclwatch::trace::parsePythonSites(text, &sites, &error);
  std::vector<ncclwatch::trace::PythonSite> again;
  if (!ncclwatch::trace::parsePythonSites(ncclwatch::trace::formatPythonSites(sites), &again,
                                          &error)) {
    std::abort();
  }
  if (again.size() != sites.size()) std::abort();
  for (size_t i = 0; i < sites.size(); ++i) {
    if (again[i].number != sites[i].number || again[i].nativeSite != sites[i].nativeSite)
      std::abort();
  }
  return 0;
}
