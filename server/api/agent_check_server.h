// AgentCheckServer: HAProxy's agent-check protocol on its own TCP port (--agent-listen). Each
// connection gets one line (api/agent_weight.h) and is closed; what the peer sends is read and
// dropped. One thread polls the listening socket and the open connections, all non-blocking.
//
// Thread safety: Start, Stop, port and address may be called from any thread. `answer` is called
// on the server's thread, once per accepted connection.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "util/status.h"

namespace qpool::api {

// Note [Agent connections]
// HAProxy opens a connection every agent-inter, reads until the first end of line and closes.
// We compute the answer when we accept, write it, shut our side down and then read (and drop)
// until the peer closes: closing with unread bytes in our receive buffer (an "agent-send"
// string) would send a reset, which can destroy the answer before the peer reads it. Each
// connection is bounded in time (kConnectionTimeoutMs from its accept, written or not), in what
// it may send (kMaxDiscardBytes, far more than an agent-send string) and in number
// (kMaxConnections). The one thread serves everyone in rounds, and no peer can hold it: a round
// reads one buffer from each connection and accepts at most kMaxConnections new ones (a peer
// that floods could otherwise hold it). At the limit, the oldest connection whose answer is
// written is closed to make room, so a slowloris of connections that never close cannot keep
// new checks unanswered; only when every connection is still being written to is a new one
// closed unanswered, and its peer keeps what it read last.
class AgentCheckServer {
 public:
  static constexpr int kMaxConnections = 64;
  static constexpr int kConnectionTimeoutMs = 2000;
  static constexpr size_t kMaxDiscardBytes = 16 << 10;

  // Listens on `listen`, "HOST:PORT" (HOST a name or address, IPv6 in brackets: "[::]:50052";
  // PORT 0 picks a free port), and answers each connection with `answer()`. InvalidArgument for
  // a malformed or unresolvable address, Unavailable when it cannot be bound (port in use,
  // address not local); both messages name the address.
  static StatusOr<std::unique_ptr<AgentCheckServer>> Start(const std::string& listen,
                                                           std::function<std::string()> answer);
  // Stops the server.
  ~AgentCheckServer();
  AgentCheckServer(const AgentCheckServer&) = delete;
  AgentCheckServer& operator=(const AgentCheckServer&) = delete;

  // The bound port (the chosen one when started with port 0).
  int port() const { return port_; }
  // The bound address as "HOST:PORT" with HOST numeric, e.g. "127.0.0.1:50052".
  std::string address() const;
  // Closes the port and every open connection and joins the thread; idempotent.
  void Stop();

 private:
  AgentCheckServer(int listen_fd, int wake_fd, std::string host, int port,
                   std::function<std::string()> answer);
  void Loop();

  int listen_fd_;      // closed by Stop (-1 then); Loop reads it until Stop joins it
  const int wake_fd_;  // an eventfd: Stop writes it to end Loop's poll
  const std::string host_;
  const int port_;
  const std::function<std::string()> answer_;
  std::mutex mu_;  // guards thread_ and listen_fd_'s closing (Stop)
  std::thread thread_;
};

}  // namespace qpool::api
