#include "util/listen_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace qpool {
namespace {

// "HOST:PORT" split, the brackets of an IPv6 host removed.
struct HostPort {
  std::string host;
  std::string port;
  bool bracketed = false;  // an IPv6 address, not a name
};

StatusOr<HostPort> ParseListen(const std::string& listen, const ListenerName& name) {
  auto bad = [&](const std::string& why) {
    const std::string port = std::to_string(name.example_port);
    return InvalidArgument(name.label + " listen address '" + listen + "' " + why +
                           " (expected HOST:PORT, e.g. 127.0.0.1:" + port + ", 0.0.0.0:" + port +
                           " or [::]:" + port + ")");
  };
  HostPort out;
  size_t colon;
  if (!listen.empty() && listen[0] == '[') {
    const size_t close = listen.find(']');
    if (close == std::string::npos) return bad("has no ']'");
    if (close + 1 >= listen.size() || listen[close + 1] != ':') return bad("has no port");
    out.host = listen.substr(1, close - 1);
    out.bracketed = true;
    colon = close + 1;
  } else {
    colon = listen.rfind(':');
    if (colon == std::string::npos) return bad("has no port");
    out.host = listen.substr(0, colon);
    if (out.host.find(':') != std::string::npos) return bad("needs brackets around an IPv6 host");
  }
  if (out.host.empty()) return bad("has no host");
  out.port = listen.substr(colon + 1);
  if (out.port.empty() || out.port.size() > 5 ||
      out.port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(out.port) > 65535) {
    return bad("has an invalid port");
  }
  return out;
}

// The addresses `listen` resolves to (freeaddrinfo them), or InvalidArgument.
StatusOr<addrinfo*> Resolve(const std::string& listen, const ListenerName& name) {
  ASSIGN_OR_RETURN(const HostPort where, ParseListen(listen, name));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV | (where.bracketed ? AI_NUMERICHOST : 0);
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(where.host.c_str(), where.port.c_str(), &hints, &found);
  if (rc != 0) {
    return InvalidArgument(name.label + " listen address '" + listen + "': cannot resolve host '" +
                           where.host + "': " + gai_strerror(rc));
  }
  return found;
}

}  // namespace

Status CheckListenAddress(const std::string& listen, const ListenerName& name) {
  ASSIGN_OR_RETURN(addrinfo* found, Resolve(listen, name));
  freeaddrinfo(found);
  return Status::Ok();
}

StatusOr<int> OpenListenSocket(const std::string& listen, const ListenerName& name, int backlog) {
  ASSIGN_OR_RETURN(addrinfo* found, Resolve(listen, name));
  int error = 0;
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, backlog) != 0) {
      error = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return Unavailable("cannot listen for " + name.purpose + " on " + listen + ": " +
                       std::strerror(error));
  }
  return fd;
}

BoundAddress BoundAddressOf(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  char host[NI_MAXHOST] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host, sizeof(host), nullptr, 0,
              NI_NUMERICHOST);
  BoundAddress out;
  out.ipv6 = address.ss_family == AF_INET6;
  out.host = out.ipv6 ? "[" + std::string(host) + "]" : std::string(host);
  out.port = out.ipv6 ? ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port)
                      : ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  return out;
}

}  // namespace qpool
