// ListenSocket: the listening TCP sockets of qpool's own small listeners (/metrics, the
// HAProxy agent check), opened the same way.
#pragma once

#include <string>

#include "util/status.h"

namespace qpool {

// Note [Listen sockets]
// "HOST:PORT" is resolved with getaddrinfo (names, IPv4, bracketed IPv6) and each candidate
// address is tried in turn; a failure is a Status carrying the address and errno's text
// ("Address already in use") rather than a log line. SO_REUSEADDR only allows rebinding over
// TIME_WAIT connections after a restart; without SO_REUSEPORT, a port another process listens on
// stays an error, so a second server never shares a port with the first.

// How a listener is named in errors: "<label> listen address '...'" and "cannot listen for
// <purpose> on ...", with `example_port` in the expected-format hint.
struct ListenerName {
  std::string label;    // "metrics"
  std::string purpose;  // "metrics"
  int example_port = 0;
};

// A bound address: numeric host (an IPv6 one in brackets) and port.
struct BoundAddress {
  std::string host;
  int port = 0;
  bool ipv6 = false;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};

// A listening, non-blocking, close-on-exec socket on the first address of `listen` that can be
// bound (Note [Listen sockets]); the caller owns it. InvalidArgument for a malformed address or
// a host that does not resolve, Unavailable when no address could be bound.
StatusOr<int> OpenListenSocket(const std::string& listen, const ListenerName& name,
                               int backlog = 64);

// Ok if `listen` is a well-formed HOST:PORT whose host resolves; the InvalidArgument that
// OpenListenSocket would give otherwise. For listeners that bind through a library (gRPC), so that
// a malformed address is the flag's error, not a port in use.
Status CheckListenAddress(const std::string& listen, const ListenerName& name);

// Where the listening socket `fd` is bound (the port the kernel chose for port 0).
BoundAddress BoundAddressOf(int fd);

}  // namespace qpool
