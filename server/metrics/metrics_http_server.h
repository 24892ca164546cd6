// MetricsHttpServer: serves a MetricsRegistry as Prometheus text on GET /metrics, on its own
// port (libmicrohttpd, a pool of kThreads threads on epoll). Nothing else is served: GET /
// links to /metrics, other paths are 404 and methods other than GET and HEAD are 405.
//
// Thread safety: Start, Stop, port and address may be called from any thread. Requests are
// answered on libmicrohttpd's threads, which call only MetricsRegistry::Expose; one more thread
// closes connections past their request deadline (Note [Metrics connections]).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "metrics/metrics_registry.h"
#include "util/status.h"

struct MHD_Daemon;

namespace qpool {

class MetricsConnections;  // Note [Metrics connections]

// A PEM certificate chain and its private key: /metrics over HTTPS. libmicrohttpd holds them
// for the life of the server (no reload: a renewed certificate needs a restart).
struct MetricsTls {
  std::string cert_pem;
  std::string key_pem;
};

class MetricsHttpServer {
 public:
  // Scrapes are rare (every few seconds) and short, so two threads keep one slow client from
  // delaying another without costing the server anything.
  static constexpr unsigned kThreads = 2;
  // Note [Metrics connections]
  // A scraper sends its request at once and reads the reply at once, so a connection that does
  // neither is a stuck or hostile peer, and such peers must not keep scrapes out (peers that drip
  // a byte at a time could hold every slot). Three bounds: a connection is closed after
  // kConnectionTimeoutSeconds without a byte (libmicrohttpd's idle timeout), and after
  // kRequestSeconds without a complete request header since it opened or since its previous reply,
  // however steadily it drips (a thread of ours shuts such sockets down: libmicrohttpd has no total
  // deadline); at most kConnectionsPerAddress are open from one address, kConnectionLimit in all,
  // and past either a new connection is closed at once. So one peer holds at most a sixteenth of
  // the slots, and every slot comes free within kRequestSeconds of its last request.
  static constexpr unsigned kConnectionTimeoutSeconds = 10;
  static constexpr unsigned kRequestSeconds = 5;
  static constexpr unsigned kConnectionsPerAddress = 16;
  static constexpr unsigned kConnectionLimit = 256;

  // Listens on `listen`, "HOST:PORT" (HOST a name or address, IPv6 in brackets: "[::]:9100";
  // PORT 0 picks a free port) and serves `registry`, which must outlive the server.
  // InvalidArgument for a malformed or unresolvable address, Unavailable when it cannot be
  // bound (port in use, address not local); both messages name the address.
  // With `tls`, serves HTTPS only; InvalidArgument if libmicrohttpd lacks TLS or refuses the
  // pair.
  static StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, const MetricsRegistry& registry,
      std::optional<MetricsTls> tls = std::nullopt);
  // Stops the server.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port (the chosen one when started with port 0).
  int port() const { return port_; }
  // The bound address as "HOST:PORT" with HOST numeric, e.g. "127.0.0.1:9100" or "[::]:9100".
  std::string address() const;
  // Closes the port and waits for requests in progress; idempotent.
  void Stop();

 private:
  MetricsHttpServer(std::unique_ptr<const MetricsTls> tls, std::string host, int port);

  std::mutex mu_;                                    // guards daemon_ (Stop)
  std::unique_ptr<MetricsConnections> connections_;  // outlives daemon_ (Stop)
  const std::unique_ptr<const MetricsTls> tls_;      // read by libmicrohttpd while it runs
  MHD_Daemon* daemon_ = nullptr;
  const std::string host_;  // numeric, IPv6 in brackets
  const int port_;
};

}  // namespace qpool
