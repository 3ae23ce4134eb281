// Host-local abstract unix sockets (Linux): a name with no file behind it, gone with the last
// descriptor. The host's relay listens on one (watchdog/relay_host.h, tools/relay.h) and the
// host's agents connect to it. Names are given without the leading NUL.
#pragma once
#include <string>

namespace ncclwatch::trace {

// Binds and listens on `name`, non-blocking and close-on-exec: a descriptor, or -1 with errno
// (EADDRINUSE: someone listens there already; ENAMETOOLONG: no room for the name).
int listenOnAbstractName(const std::string& name);
// A non-blocking connection to `name`: the descriptor (connected, or connecting), or -1 with
// errno (ECONNREFUSED: nobody listens).
int connectToAbstractName(const std::string& name);

}  // namespace ncclwatch::trace
