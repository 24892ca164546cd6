// MetricsHttpServer on a loopback port, driven by a plain POSIX socket client: status lines,
// Content-Type, body, 404/405, address parsing and bind errors, and scrapes served while slow
// or idle peers hold connections (Note [Metrics connections]).
#include "metrics/metrics_http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "metrics/text_exposition.h"

namespace qpool {
namespace {

struct HttpReply {
  std::string status_line;                     // "HTTP/1.1 200 OK"; "" if nothing came back
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;
};

// Connects to `family` loopback:port; -1 on failure.
int Connect(int port, int family = AF_INET) {
  const int fd = socket(family, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  int rc;
  if (family == AF_INET6) {
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_port = htons(port);
    address.sin6_addr = in6addr_loopback;
    rc = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  } else {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rc = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  }
  if (rc != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Connects to 127.0.0.1:port from `source` (another loopback address: another peer); -1 on
// failure.
int ConnectFrom(int port, const char* source) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True once the server has closed `fd` (recv sees the end or a reset), waiting at most `wait`.
bool ClosedByServer(int fd, std::chrono::milliseconds wait) {
  timeval timeout{static_cast<time_t>(wait.count() / 1000),
                  static_cast<suseconds_t>(wait.count() % 1000 * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  char byte;
  const ssize_t n = recv(fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// Sends one HTTP/1.1 request with "Connection: close" and reads the reply to EOF.
HttpReply Fetch(int port, const std::string& method, const std::string& path,
                const std::string& body = "", int family = AF_INET) {
  HttpReply reply;
  const int fd = Connect(port, family);
  if (fd < 0) return reply;
  std::string request =
      method + " " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n";
  if (!body.empty()) request += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  request += "\r\n" + body;
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += n;
  }
  std::string raw;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) raw.append(buffer, n);
  close(fd);

  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return reply;
  reply.body = raw.substr(head_end + 4);
  size_t line_end = raw.find("\r\n");
  reply.status_line = raw.substr(0, line_end);
  while (line_end < head_end) {
    const size_t start = line_end + 2;
    line_end = raw.find("\r\n", start);
    const std::string line = raw.substr(start, line_end - start);
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    reply.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
  }
  return reply;
}

// True when ::1 can be bound (containers may run without IPv6).
bool HaveIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return ok;
}

class MetricsHttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.AddCounter("qpool_requests_total", "Requests.", {"pipeline"})
        .WithLabels({"tiny"})
        .Inc(2);
    auto server = MetricsHttpServer::Start("127.0.0.1:0", registry_);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
  }

  MetricsRegistry registry_;  // declared first: outlives the server
  std::unique_ptr<MetricsHttpServer> server_;
};

TEST_F(MetricsHttpServerTest, ServesTheRegistryOnMetrics) {
  ASSERT_GT(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(server_->port()));
  HttpReply reply = Fetch(server_->port(), "GET", "/metrics");
  EXPECT_EQ(reply.status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(reply.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(reply.headers["content-type"], kMetricsTextContentType);
  EXPECT_EQ(reply.body,
            "# HELP qpool_requests_total Requests.\n"
            "# TYPE qpool_requests_total counter\n"
            "qpool_requests_total{pipeline=\"tiny\"} 2\n");
  // Every scrape reads the current values; a query string does not matter.
  registry_.AddCounter("qpool_requests_total", "Requests.", {"pipeline"})
      .WithLabels({"tiny"})
      .Inc();
  reply = Fetch(server_->port(), "GET", "/metrics?x=1");
  EXPECT_NE(reply.body.find("qpool_requests_total{pipeline=\"tiny\"} 3\n"), std::string::npos)
      << reply.body;
}

TEST_F(MetricsHttpServerTest, HeadHasHeadersOnly) {
  HttpReply reply = Fetch(server_->port(), "HEAD", "/metrics");
  EXPECT_EQ(reply.status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(reply.headers["content-type"], kMetricsTextContentType);
  EXPECT_EQ(reply.body, "");
}

TEST_F(MetricsHttpServerTest, RootLinksToMetrics) {
  HttpReply reply = Fetch(server_->port(), "GET", "/");
  EXPECT_EQ(reply.status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(reply.headers["content-type"], "text/html; charset=utf-8");
  EXPECT_NE(reply.body.find("href=\"/metrics\""), std::string::npos) << reply.body;
}

TEST_F(MetricsHttpServerTest, UnknownPathIs404) {
  for (const char* path : {"/metric", "/metrics/", "/favicon.ico"}) {
    HttpReply reply = Fetch(server_->port(), "GET", path);
    EXPECT_EQ(reply.status_line, "HTTP/1.1 404 Not Found") << path;
  }
}

TEST_F(MetricsHttpServerTest, OtherMethodsAre405) {
  for (const char* method : {"POST", "PUT", "DELETE"}) {
    HttpReply reply = Fetch(server_->port(), method, "/metrics", "x=1");
    EXPECT_EQ(reply.status_line, "HTTP/1.1 405 Method Not Allowed") << method;
    EXPECT_EQ(reply.headers["allow"], "GET, HEAD") << method;
  }
}

TEST_F(MetricsHttpServerTest, StopIsIdempotentAndFreesThePort) {
  const int port = server_->port();
  server_->Stop();
  server_->Stop();
  EXPECT_EQ(Connect(port), -1);
  // The port can be bound again at once (a restarted server keeps its configured port).
  auto again = MetricsHttpServer::Start("127.0.0.1:" + std::to_string(port), registry_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(Fetch(port, "GET", "/metrics").status_line, "HTTP/1.1 200 OK");
}

TEST_F(MetricsHttpServerTest, BusyPortIsUnavailableAndNamesTheAddress) {
  const std::string address = "127.0.0.1:" + std::to_string(server_->port());
  auto second = MetricsHttpServer::Start(address, registry_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(address), std::string::npos)
      << second.status().message();
  EXPECT_NE(second.status().message().find("in use"), std::string::npos)
      << second.status().message();
  // The first server is unaffected.
  EXPECT_EQ(Fetch(server_->port(), "GET", "/metrics").status_line, "HTTP/1.1 200 OK");
}

// Note [Metrics connections]: before the bounds, 80 peers dripping their request held every
// slot and a scrape waited until they gave up.
TEST_F(MetricsHttpServerTest, ScrapesAreServedWhilePeersHoldConnections) {
  std::vector<int> held;
  for (int i = 0; i < 80; ++i) {
    const int fd = ConnectFrom(server_->port(), "127.0.0.2");
    ASSERT_GE(fd, 0) << "loopback source 127.0.0.2";
    send(fd, "GET /met", 8, MSG_NOSIGNAL);  // a request begun, never finished
    held.push_back(fd);
  }
  // Idle ones from a third address too.
  for (int i = 0; i < 40; ++i) held.push_back(ConnectFrom(server_->port(), "127.0.0.3"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Fetch(server_->port(), "GET", "/metrics").status_line, "HTTP/1.1 200 OK");
  }
  // Past the limit per address, a connection is closed at once.
  EXPECT_TRUE(ClosedByServer(held.back(), std::chrono::milliseconds(2000)));
  for (int fd : held) close(fd);
}

TEST_F(MetricsHttpServerTest, ClosesAConnectionThatDripsItsRequestPastTheDeadline) {
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  const auto start = std::chrono::steady_clock::now();
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
  bool closed = false;
  // A byte every 500 ms: never idle, never done.
  for (size_t i = 0; !closed && i < 40; ++i) {
    if (send(fd, request.data() + i % request.size(), 1, MSG_NOSIGNAL) != 1) break;
    closed = ClosedByServer(fd, std::chrono::milliseconds(500));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  close(fd);
  EXPECT_GE(seconds, MetricsHttpServer::kRequestSeconds - 1.0);
  EXPECT_LT(seconds, MetricsHttpServer::kRequestSeconds + 3.0)
      << "a dripping request held its connection past the deadline";
}

TEST_F(MetricsHttpServerTest, KeepAliveConnectionsServeRequestAfterRequest) {
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
    std::string raw;
    char buffer[4096];
    while (raw.find("} 2\n") == std::string::npos) {
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      ASSERT_GT(n, 0) << "request " << i << " got: " << raw;
      raw.append(buffer, n);
    }
    EXPECT_EQ(raw.rfind("HTTP/1.1 200 OK", 0), 0u) << raw;
    // Each request within the deadline from the previous reply, the connection's life past it.
    if (i < 2)
      std::this_thread::sleep_for(std::chrono::seconds(MetricsHttpServer::kRequestSeconds - 2));
  }
  close(fd);
}

TEST(MetricsHttpServerAddressTest, MalformedAddressesAreInvalidArgument) {
  MetricsRegistry registry;
  for (const std::string listen :
       {"", "127.0.0.1", "127.0.0.1:", ":9100", "127.0.0.1:abc", "127.0.0.1:65536", "127.0.0.1:-1",
        "::1:9100", "[::1", "[::1]9100", "[not-an-ip]:0", "[]:0"}) {
    auto server = MetricsHttpServer::Start(listen, registry);
    ASSERT_FALSE(server.ok()) << listen;
    EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument) << listen;
    EXPECT_NE(server.status().message().find("'" + listen + "'"), std::string::npos)
        << server.status().message();
  }
}

TEST(MetricsHttpServerAddressTest, NonLocalAddressIsUnavailable) {
  MetricsRegistry registry;
  auto server = MetricsHttpServer::Start("192.0.2.1:0", registry);  // TEST-NET-1
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(server.status().message().find("192.0.2.1:0"), std::string::npos)
      << server.status().message();
}

TEST(MetricsHttpServerAddressTest, WildcardAndIpv6Addresses) {
  MetricsRegistry registry;
  registry.AddGauge("qpool_up", "Up.").WithLabels({}).Set(1);
  auto any = MetricsHttpServer::Start("0.0.0.0:0", registry);
  ASSERT_TRUE(any.ok()) << any.status().ToString();
  EXPECT_EQ((*any)->address(), "0.0.0.0:" + std::to_string((*any)->port()));
  EXPECT_EQ(Fetch((*any)->port(), "GET", "/metrics").body, registry.Expose());

  if (!HaveIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback on this host";
  auto loopback6 = MetricsHttpServer::Start("[::1]:0", registry);
  ASSERT_TRUE(loopback6.ok()) << loopback6.status().ToString();
  EXPECT_EQ((*loopback6)->address(), "[::1]:" + std::to_string((*loopback6)->port()));
  EXPECT_EQ(Fetch((*loopback6)->port(), "GET", "/metrics", "", AF_INET6).body, registry.Expose());
  auto any6 = MetricsHttpServer::Start("[::]:0", registry);
  ASSERT_TRUE(any6.ok()) << any6.status().ToString();
  EXPECT_EQ((*any6)->address(), "[::]:" + std::to_string((*any6)->port()));
  EXPECT_EQ(Fetch((*any6)->port(), "GET", "/metrics", "", AF_INET6).status_line, "HTTP/1.1 200 OK");
}

TEST(MetricsHttpServerAddressTest, HostNamesAreResolved) {
  MetricsRegistry registry;
  auto server = MetricsHttpServer::Start("localhost:0", registry);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string address = (*server)->address();
  EXPECT_TRUE(address.rfind("127.0.0.1:", 0) == 0 || address.rfind("[::1]:", 0) == 0) << address;
}

}  // namespace
}  // namespace qpool
