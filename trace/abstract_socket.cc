#include "trace/abstract_socket.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

namespace ncclwatch::trace {
namespace {

// The address of `name` (sun_path[0] = 0: abstract), or 0 when it does not fit.
socklen_t abstractAddress(const std::string& name, sockaddr_un* address) {
  *address = sockaddr_un{};
  address->sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof address->sun_path) return 0;
  std::memcpy(address->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// A socket for `name` after `act` (bind+listen or connect); -1 with act's errno when it failed.
template <typename Act>
int withSocket(const std::string& name, Act act) {
  sockaddr_un address;
  socklen_t length = abstractAddress(name, &address);
  if (length == 0) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (!act(fd, reinterpret_cast<sockaddr*>(&address), length)) {
    int why = errno;
    close(fd);
    errno = why;
    return -1;
  }
  return fd;
}

}  // namespace

int listenOnAbstractName(const std::string& name) {
  return withSocket(name, [](int fd, sockaddr* address, socklen_t length) {
    return bind(fd, address, length) == 0 && listen(fd, 1024) == 0;
  });
}

int connectToAbstractName(const std::string& name) {
  return withSocket(name, [](int fd, sockaddr* address, socklen_t length) {
    return connect(fd, address, length) == 0 || errno == EINPROGRESS;
  });
}

}  // namespace ncclwatch::trace
