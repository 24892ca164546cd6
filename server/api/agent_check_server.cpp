#include "api/agent_check_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <vector>

#include "util/listen_socket.h"
#include "util/log.h"

namespace qpool::api {
namespace {

constexpr int kListenBacklog = 64;

using Clock = std::chrono::steady_clock;

// One accepted connection (Note [Agent connections]).
struct Connection {
  int fd = -1;
  std::string answer;
  size_t written = 0;    // bytes of `answer` sent
  size_t discarded = 0;  // bytes the peer sent
  bool shut = false;     // all written and our side shut down: reading until the peer closes
  Clock::time_point deadline;
};

// Sends what is left of the answer; true while the connection should stay open.
bool Send(Connection& c) {
  while (c.written < c.answer.size()) {
    const ssize_t n = send(c.fd, c.answer.data() + c.written, c.answer.size() - c.written,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    c.written += static_cast<size_t>(n);
  }
  shutdown(c.fd, SHUT_WR);
  c.shut = true;
  return true;
}

// Reads and drops what the peer sent, one buffer a round (a peer that floods must not keep the
// thread from the others); true until it closes, fails, or has sent more than any agent-send
// string (Note [Agent connections]).
bool Discard(Connection& c) {
  char buffer[4096];
  while (true) {
    const ssize_t n = recv(c.fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n > 0) {
      c.discarded += static_cast<size_t>(n);
      return c.discarded <= AgentCheckServer::kMaxDiscardBytes;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

}  // namespace

StatusOr<std::unique_ptr<AgentCheckServer>> AgentCheckServer::Start(
    const std::string& listen, std::function<std::string()> answer) {
  ASSIGN_OR_RETURN(const int fd,
                   OpenListenSocket(listen, {"agent", "agent checks", 50052}, kListenBacklog));
  const int wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) {
    const int error = errno;
    close(fd);
    return Internal(std::string("agent check server: eventfd: ") + std::strerror(error));
  }
  const BoundAddress bound = BoundAddressOf(fd);
  std::unique_ptr<AgentCheckServer> server(
      new AgentCheckServer(fd, wake, bound.host, bound.port, std::move(answer)));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

AgentCheckServer::AgentCheckServer(int listen_fd, int wake_fd, std::string host, int port,
                                   std::function<std::string()> answer)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      host_(std::move(host)),
      port_(port),
      answer_(std::move(answer)) {}

AgentCheckServer::~AgentCheckServer() {
  Stop();
  close(wake_fd_);
}

std::string AgentCheckServer::address() const { return host_ + ":" + std::to_string(port_); }

void AgentCheckServer::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable()) {
    const uint64_t one = 1;
    while (write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
  }
}

void AgentCheckServer::Loop() {
  std::vector<Connection> connections;
  std::vector<pollfd> fds;
  while (true) {
    // Wait at most until the nearest connection's deadline.
    const auto now = Clock::now();
    int timeout_ms = -1;
    for (const auto& c : connections) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count();
      const int ms = static_cast<int>(std::max<int64_t>(0, left + 1));
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& c : connections) {
      fds.push_back({c.fd, static_cast<short>(c.shut ? POLLIN : POLLOUT), 0});
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      log::Error("agent check server: poll: ", std::strerror(errno));
      break;
    }
    if (fds[0].revents != 0) break;  // Stop()

    // Connections first (fds[2 + i] is connections[i]); new ones are appended after.
    const auto checked = Clock::now();
    std::vector<Connection> open;
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& c = connections[i];
      const short events = fds[2 + i].revents;
      bool keep = checked < c.deadline;
      if (keep && events != 0) {
        if (!c.shut) keep = Send(c);
        if (keep && c.shut) keep = Discard(c);
      }
      if (keep) {
        open.push_back(std::move(c));
      } else {
        close(c.fd);
      }
    }
    connections = std::move(open);

    if ((fds[1].revents & POLLIN) == 0) continue;
    // At most kMaxConnections new ones a round: a flood of connections must not keep the thread
    // from the open ones (and their deadlines).
    for (int accepted = 0; accepted < kMaxConnections; ++accepted) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        // EAGAIN: all taken. EMFILE and the like: left in the backlog for the next round.
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          log::Warn("agent check server: accept: ", std::strerror(errno));
        }
        break;
      }
      if (connections.size() >= static_cast<size_t>(kMaxConnections)) {
        // Full: the oldest connection already answered makes room (its peer has its line, or
        // never read it in time); a new check is always answered (Note [Agent connections]).
        auto oldest = std::find_if(connections.begin(), connections.end(),
                                   [](const Connection& c) { return c.shut; });
        if (oldest == connections.end()) {
          close(fd);
          continue;
        }
        close(oldest->fd);
        connections.erase(oldest);
      }
      Connection c;
      c.fd = fd;
      c.deadline = Clock::now() + std::chrono::milliseconds(kConnectionTimeoutMs);
      try {  // no exception leaves this thread
        c.answer = answer_();
      } catch (const std::exception& e) {
        log::Error("agent check server: answer failed: ", e.what());
        close(fd);
        continue;
      }
      if (Send(c) && (!c.shut || Discard(c))) {
        connections.push_back(std::move(c));
      } else {
        close(c.fd);
      }
    }
  }
  for (const auto& c : connections) close(c.fd);
}

}  // namespace qpool::api
