#include "metrics/metrics_http_server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <thread>

#include "metrics/text_exposition.h"
#include "util/listen_socket.h"
#include "util/log.h"

namespace qpool {

// What libmicrohttpd's callbacks read (Note [Metrics connections]): the registry served, when
// each open connection's next request header is due, and the thread that shuts down the sockets
// of those past it. libmicrohttpd reports a connection closed
// (Forget) before it closes the socket, so a descriptor here is never one reused by another
// connection.
class MetricsConnections {
 public:
  explicit MetricsConnections(const MetricsRegistry& registry)
      : registry(registry), thread_([this] { Loop(); }) {}
  ~MetricsConnections() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  MetricsConnections(const MetricsConnections&) = delete;
  MetricsConnections& operator=(const MetricsConnections&) = delete;

  const MetricsRegistry& registry;

  // A connection opened on socket `fd`: its first request header is due.
  void Opened(const MHD_Connection* connection, int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    open_[connection] = {fd, Due()};
  }
  // Its request header came in full: nothing is due while the request is answered.
  void RequestArrived(const MHD_Connection* connection) {
    Set(connection, Clock::time_point::max());
  }
  // Its reply is complete: the next request header is due.
  void Replied(const MHD_Connection* connection) { Set(connection, Due()); }
  void Closed(const MHD_Connection* connection) {
    std::lock_guard<std::mutex> lock(mu_);
    open_.erase(connection);
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Open {
    int fd;
    Clock::time_point due;
  };

  static Clock::time_point Due() {
    return Clock::now() + std::chrono::seconds(MetricsHttpServer::kRequestSeconds);
  }
  void Set(const MHD_Connection* connection, Clock::time_point due) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(connection);
    if (it != open_.end()) it->second.due = due;
  }
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(250));
      const auto now = Clock::now();
      for (auto& [connection, open] : open_) {
        if (open.due > now) continue;
        // libmicrohttpd sees the end of the stream and closes the connection itself.
        shutdown(open.fd, SHUT_RDWR);
        open.due = Clock::time_point::max();
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<const MHD_Connection*, Open> open_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

// Note [Metrics listen socket]
// We open the listening socket ourselves (Note [Listen sockets] in util/listen_socket.h) and hand
// it to libmicrohttpd (MHD_OPTION_LISTEN_SOCKET) instead of giving it a sockaddr, so that
// addresses resolve and fail the same way as our other listeners'. Once passed, the socket
// belongs to libmicrohttpd: MHD_stop_daemon closes it, and a failed start closes it too on all
// but its option-parsing paths, which our fixed options never take.
namespace {

constexpr int kListenBacklog = 64;

void NotifyConnection(void* cls, MHD_Connection* connection, void** /*socket_context*/,
                      MHD_ConnectionNotificationCode code) {
  auto* connections = static_cast<MetricsConnections*>(cls);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const MHD_ConnectionInfo* info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info != nullptr) connections->Opened(connection, info->connect_fd);
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    connections->Closed(connection);
  }
}

void NotifyCompleted(void* cls, MHD_Connection* connection, void** /*request_state*/,
                     MHD_RequestTerminationCode /*code*/) {
  static_cast<MetricsConnections*>(cls)->Replied(connection);
}

void LogFromMhd(void* /*cls*/, const char* format, va_list args) {
  char buffer[512];
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  std::string message(buffer);
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r')) message.pop_back();
  log::Warn("metrics http: ", message);
}

MHD_Result Reply(MHD_Connection* connection, unsigned code, const char* content_type,
                 const std::string& body, bool allow_header = false) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  if (allow_header) MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  const MHD_Result result = MHD_queue_response(connection, code, response);
  MHD_destroy_response(response);
  return result;
}

constexpr char kIndexPage[] =
    "<html><head><title>qpool-server metrics</title></head>\n"
    "<body><h1>qpool-server metrics</h1><p><a href=\"/metrics\">/metrics</a></p></body></html>\n";

// libmicrohttpd's access handler; `cls` is the MetricsConnections. A GET or HEAD is answered on
// the second call, once libmicrohttpd knows the request has no body: a reply queued on the first
// call closes the connection after it (no keep-alive). Anything else, and a GET that comes with a
// body, is answered at once and its connection closed: no request we serve has a body.
MHD_Result HandleRequest(void* cls, MHD_Connection* connection, const char* url, const char* method,
                         const char* /*version*/, const char* /*upload_data*/,
                         size_t* upload_data_size, void** request_state) {
  auto* connections = static_cast<MetricsConnections*>(cls);
  const MetricsRegistry* registry = &connections->registry;
  const bool read_only = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                         std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  if (*request_state == nullptr) {
    connections->RequestArrived(connection);
    static int started;
    *request_state = &started;
    if (read_only) return MHD_YES;
  }
  if (!read_only) {
    return Reply(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain; charset=utf-8",
                 "method not allowed: use GET\n", /*allow_header=*/true);
  }
  if (*upload_data_size != 0) {
    return Reply(connection, MHD_HTTP_BAD_REQUEST, "text/plain; charset=utf-8",
                 "a GET has no body\n");
  }
  const std::string path(url);
  if (path == "/metrics") {
    std::string body;
    try {  // no exception crosses into libmicrohttpd's thread
      body = registry->Expose();
    } catch (const std::exception& e) {
      log::Error("metrics: scrape failed: ", e.what());
      return Reply(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain; charset=utf-8",
                   "scrape failed\n");
    }
    return Reply(connection, MHD_HTTP_OK, kMetricsTextContentType, body);
  }
  if (path == "/") return Reply(connection, MHD_HTTP_OK, "text/html; charset=utf-8", kIndexPage);
  return Reply(connection, MHD_HTTP_NOT_FOUND, "text/plain; charset=utf-8",
               "not found; metrics are at /metrics\n");
}

}  // namespace

StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, const MetricsRegistry& registry, std::optional<MetricsTls> tls) {
  if (tls && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
    return InvalidArgument("this libmicrohttpd has no TLS: /metrics cannot serve HTTPS");
  }
  ASSIGN_OR_RETURN(const int fd,
                   OpenListenSocket(listen, {"metrics", "metrics", 9100}, kListenBacklog));
  const BoundAddress bound = BoundAddressOf(fd);

  unsigned flags = MHD_USE_ERROR_LOG | (bound.ipv6 ? MHD_USE_IPv6 : 0);
  flags |= MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL_INTERNAL_THREAD
                                                                  : MHD_USE_POLL_INTERNAL_THREAD;
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(
      tls ? std::make_unique<const MetricsTls>(std::move(*tls)) : nullptr, bound.host, bound.port));
  // The certificate options come last; without TLS they are the end of the list.
  const MHD_OPTION cert_option = server->tls_ ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END;
  const char* cert = server->tls_ ? server->tls_->cert_pem.c_str() : nullptr;
  const char* key = server->tls_ ? server->tls_->key_pem.c_str() : nullptr;
  if (server->tls_) flags |= MHD_USE_TLS;
  server->connections_ = std::make_unique<MetricsConnections>(registry);
  MetricsConnections* connections = server->connections_.get();
  // clang-format off: one option and its values a line
  server->daemon_ = MHD_start_daemon(
      flags, 0, nullptr, nullptr, &HandleRequest, connections,
      MHD_OPTION_EXTERNAL_LOGGER, &LogFromMhd, nullptr,
      MHD_OPTION_LISTEN_SOCKET, fd,
      MHD_OPTION_THREAD_POOL_SIZE, kThreads,
      // Note [Metrics connections]
      MHD_OPTION_CONNECTION_TIMEOUT, kConnectionTimeoutSeconds,
      MHD_OPTION_CONNECTION_LIMIT, kConnectionLimit,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, kConnectionsPerAddress,
      MHD_OPTION_NOTIFY_CONNECTION, &NotifyConnection, connections,
      MHD_OPTION_NOTIFY_COMPLETED, &NotifyCompleted, connections,
      cert_option, cert,  // MHD_OPTION_END without TLS
      MHD_OPTION_HTTPS_MEM_KEY, key,
      MHD_OPTION_END);
  // clang-format on
  if (server->daemon_ == nullptr) {  // the socket is libmicrohttpd's (Note [Metrics listen socket])
    return Unavailable("cannot start the metrics HTTP server on " + listen +
                       " (libmicrohttpd refused; see the log)");
  }
  return server;
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<const MetricsTls> tls, std::string host,
                                     int port)
    : tls_(std::move(tls)), host_(std::move(host)), port_(port) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

std::string MetricsHttpServer::address() const { return host_ + ":" + std::to_string(port_); }

void MetricsHttpServer::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (daemon_ == nullptr) return;
  MHD_stop_daemon(daemon_);
  daemon_ = nullptr;
}

}  // namespace qpool
