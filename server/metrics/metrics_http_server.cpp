#include "metrics/metrics_http_server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>

#include "metrics/text_exposition.h"
#include "util/listen_socket.h"
#include "util/log.h"

namespace qpool {

// Note [Metrics listen socket]
// We open the listening socket ourselves (Note [Listen sockets] in util/listen_socket.h) and hand
// it to libmicrohttpd (MHD_OPTION_LISTEN_SOCKET) instead of giving it a sockaddr, so that
// addresses resolve and fail the same way as our other listeners'. Once passed, the socket
// belongs to libmicrohttpd: MHD_stop_daemon closes it, and a failed start closes it too on all
// but its option-parsing paths, which our fixed options never take.
namespace {

constexpr int kListenBacklog = 64;
constexpr unsigned kConnectionLimit = 64;

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

// libmicrohttpd's access handler; `cls` is the MetricsRegistry. Answers on the first call: no
// request we serve has a body, and a body we refuse is discarded by libmicrohttpd.
MHD_Result HandleRequest(void* cls, MHD_Connection* connection, const char* url, const char* method,
                         const char* /*version*/, const char* /*upload_data*/,
                         size_t* /*upload_data_size*/, void** /*request_state*/) {
  const auto* registry = static_cast<const MetricsRegistry*>(cls);
  if (std::strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
      std::strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    return Reply(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain; charset=utf-8",
                 "method not allowed: use GET\n", /*allow_header=*/true);
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
  server->daemon_ = MHD_start_daemon(
      flags, 0, nullptr, nullptr, &HandleRequest, const_cast<MetricsRegistry*>(&registry),
      MHD_OPTION_EXTERNAL_LOGGER, &LogFromMhd, nullptr, MHD_OPTION_LISTEN_SOCKET, fd,
      MHD_OPTION_THREAD_POOL_SIZE, kThreads, MHD_OPTION_CONNECTION_TIMEOUT,
      kConnectionTimeoutSeconds, MHD_OPTION_CONNECTION_LIMIT, kConnectionLimit, cert_option, cert,
      MHD_OPTION_HTTPS_MEM_KEY, key, MHD_OPTION_END);
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
