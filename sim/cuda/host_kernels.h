// The few device kernels the sim computes on the host, recognised by their (mangled) names:
// PyTorch's contiguous elementwise loops for fill, add and multiply/divide, whose argument
// layout follows from the kernel's template arguments. Every other kernel is a no-op on the sim.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace cudasim {

// How one recognised kernel computes. `prepare` reads the launch's arguments (they point into
// the caller's frame, so everything needed is copied) and returns the work to run in stream
// order, or an empty function when an argument is outside the sim's heap (the launch then
// fails as an illegal address would on a GPU).
class HostKernel {
 public:
  virtual ~HostKernel() = default;
  virtual std::function<void()> prepare(void** params) const = 0;
  virtual std::string describe() const = 0;  // e.g. "fill float", for tests and debug output
};

// Returns the host implementation of the kernel with this mangled name, or null when the sim
// does not compute it.
std::unique_ptr<HostKernel> findHostKernel(const char* mangledName);

// The demangled name (or the mangled one when it cannot be demangled), for messages.
std::string demangledName(const char* mangledName);

}  // namespace cudasim
