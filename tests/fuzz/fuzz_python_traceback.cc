// libFuzzer target: parsePythonTraceback must accept any bytes (truncated, binary, huge) without
// crashing, and every frame it returns must come from the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "watchdog/python_stacks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto threads = ncclwatch::watchdog::parsePythonTraceback(text);
  for (const auto& thread : threads) {
    for (const auto& frame : thread.frames) {
      if (frame.file.size() > size || frame.function.size() > size) std::abort();
      if (frame.line < -1) std::abort();
    }
  }
  return 0;
}
