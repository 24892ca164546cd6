// AgentCheckServer on a loopback port, driven by plain POSIX sockets: one line per connection,
// then EOF; a peer that sends first (HAProxy's agent-send) still reads the answer; silent peers
// are dropped in time, and neither floods nor a slowloris keep checks unanswered; address errors
// and a port in use are refused with the address named.
#include "api/agent_check_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace qpool::api {
namespace {

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Everything the server sends until it closes.
std::string ReadAll(int fd) {
  std::string out;
  char buffer[256];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) out.append(buffer, n);
  return out;
}

std::string Ask(int port, const std::string& send_first = "") {
  const int fd = Connect(port);
  if (fd < 0) return "<no connection>";
  if (!send_first.empty()) send(fd, send_first.data(), send_first.size(), MSG_NOSIGNAL);
  std::string answer = ReadAll(fd);
  close(fd);
  return answer;
}

TEST(AgentCheckServer, AnswersEachConnectionWithOneLineThenCloses) {
  std::atomic<int> calls{0};
  auto server = AgentCheckServer::Start(
      "127.0.0.1:0", [&] { return "up ready " + std::to_string(50 + calls++) + "%\n"; });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string((*server)->port()));
  EXPECT_EQ(Ask((*server)->port()), "up ready 50%\n");
  EXPECT_EQ(Ask((*server)->port()), "up ready 51%\n");
  // HAProxy's agent-send: the peer writes first; the answer still arrives whole.
  EXPECT_EQ(Ask((*server)->port(), "backend/qpool-1\n"), "up ready 52%\n");
}

TEST(AgentCheckServer, ManyPeersAtOnceEachGetTheirLine) {
  auto server = AgentCheckServer::Start("127.0.0.1:0", [] { return std::string("drain\n"); });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<std::string> answers(32);
  std::vector<std::thread> peers;
  for (size_t i = 0; i < answers.size(); ++i) {
    peers.emplace_back([&, i] { answers[i] = Ask((*server)->port()); });
  }
  for (auto& t : peers) t.join();
  for (const auto& a : answers) EXPECT_EQ(a, "drain\n");
}

TEST(AgentCheckServer, APeerThatNeverClosesIsDroppedAfterTheTimeout) {
  auto server = AgentCheckServer::Start("127.0.0.1:0", [] { return std::string("drain\n"); });
  ASSERT_TRUE(server.ok());
  const int fd = Connect((*server)->port());
  ASSERT_GE(fd, 0);
  const auto start = std::chrono::steady_clock::now();
  // The answer, then EOF: the server shut its side down. Holding ours open, the server closes
  // the connection at its deadline; the listener keeps answering others meanwhile.
  char buffer[64];
  const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
  EXPECT_EQ(std::string(buffer, n > 0 ? n : 0), "drain\n");
  EXPECT_EQ(recv(fd, buffer, sizeof(buffer), 0), 0);
  EXPECT_EQ(Ask((*server)->port()), "drain\n");
  // After the deadline a write gets a reset: the server has closed its socket.
  std::this_thread::sleep_for(
      std::chrono::milliseconds(AgentCheckServer::kConnectionTimeoutMs + 300));
  send(fd, "x", 1, MSG_NOSIGNAL);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(send(fd, "x", 1, MSG_NOSIGNAL), -1);
  close(fd);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// Note [Agent connections]: a peer that floods once held the only thread for seconds.
TEST(AgentCheckServer, PeersThatFloodDoNotHoldTheThread) {
  auto server = AgentCheckServer::Start("127.0.0.1:0", [] { return std::string("drain\n"); });
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  std::atomic<bool> stop{false};
  std::atomic<int> closed_floods{0};
  std::vector<std::thread> floods;
  for (int i = 0; i < 2; ++i) {
    floods.emplace_back([&] {
      const std::string chunk(64 << 10, 'x');
      while (!stop) {  // as fast as loopback takes it; again once the server closes
        const int fd = Connect(port);
        if (fd < 0) continue;
        while (!stop && send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL) > 0) {
        }
        if (!stop) ++closed_floods;
        close(fd);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int i = 0; i < 20; ++i) {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0);
    timeval timeout{2, 0};  // far above a round's time; a held thread answers never
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    EXPECT_EQ(ReadAll(fd), "drain\n") << "check " << i;
    close(fd);
  }
  stop = true;
  for (auto& t : floods) t.join();
  EXPECT_GT(closed_floods.load(), 0) << "a flood past kMaxDiscardBytes is closed";
}

TEST(AgentCheckServer, ConnectionsThatNeverCloseDoNotKeepNewChecksUnanswered) {
  auto server = AgentCheckServer::Start("127.0.0.1:0", [] { return std::string("drain\n"); });
  ASSERT_TRUE(server.ok());
  std::vector<int> held;  // three times the limit, each answered and left open
  for (int i = 0; i < 3 * AgentCheckServer::kMaxConnections; ++i) {
    held.push_back(Connect((*server)->port()));
  }
  for (int i = 0; i < 10; ++i) EXPECT_EQ(Ask((*server)->port()), "drain\n") << "check " << i;
  for (int fd : held) close(fd);
}

TEST(AgentCheckServer, APortInUseIsUnavailableAndNamesTheAddress) {
  auto first = AgentCheckServer::Start("127.0.0.1:0", [] { return std::string("drain\n"); });
  ASSERT_TRUE(first.ok());
  const std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = AgentCheckServer::Start(taken, [] { return std::string("drain\n"); });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(taken), std::string::npos);
  EXPECT_NE(second.status().message().find("in use"), std::string::npos)
      << second.status().message();
}

TEST(AgentCheckServer, MalformedAddressesAreInvalidArguments) {
  for (const char* listen : {"127.0.0.1", "127.0.0.1:", ":50052", "127.0.0.1:99999", "::1:5",
                             "[::1", "127.0.0.1:12a", "no-such-host.invalid:5"}) {
    auto server = AgentCheckServer::Start(listen, [] { return std::string("drain\n"); });
    ASSERT_FALSE(server.ok()) << listen;
    EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument) << listen;
    EXPECT_NE(server.status().message().find(listen), std::string::npos)
        << server.status().message();
  }
}

TEST(AgentCheckServer, StopClosesThePortAndIsIdempotent) {
  auto server = AgentCheckServer::Start("127.0.0.1:0", [] { return std::string("drain\n"); });
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  (*server)->Stop();
  (*server)->Stop();
  EXPECT_EQ(Connect(port), -1);
}

}  // namespace
}  // namespace qpool::api
