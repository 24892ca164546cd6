// Server flags: values, --help and --version, and errors that say what is wrong.
#include "config/server_options.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qpool {
namespace {

StatusOr<ServerOptions> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "qpool-server");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ParseServerOptions(static_cast<int>(argv.size()), argv.data(), "1.2.3");
}

TEST(ServerOptions, ValuesInBothSpellings) {
  auto o =
      Parse({"--listen", "127.0.0.1:0", "--max-queue=7", "--load", "a,b", "--attention=cudnn"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->attention, "cudnn");  // checked at start (Note [Attention backend])
  EXPECT_EQ(Parse({})->attention, "auto");
  EXPECT_EQ(o->listen, "127.0.0.1:0");
  EXPECT_EQ(o->max_queue, 7);
  EXPECT_EQ(o->load, (std::vector<std::string>{"a", "b"}));
}

TEST(ServerOptions, ProfileFlags) {
  const ServerOptions off = *Parse({});
  EXPECT_TRUE(off.profile_dir.empty());
  EXPECT_EQ(off.profile_skip, 1);
  EXPECT_EQ(off.profile_batches, 1);
  auto o = Parse({"--profile-dir", "/tmp/p", "--profile-skip=0", "--profile-batches", "3"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->profile_dir, "/tmp/p");
  EXPECT_EQ(o->profile_skip, 0);
  EXPECT_EQ(o->profile_batches, 3);
  EXPECT_FALSE(Parse({"--profile-dir="}).ok());
  EXPECT_FALSE(Parse({"--profile-skip", "-1"}).ok());
  EXPECT_FALSE(Parse({"--profile-batches", "0"}).ok());
}

TEST(ServerOptions, VersionAndHelpAreAnswersNotErrors) {
  auto version = Parse({"--version"});
  EXPECT_EQ(version.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(version.status().message(), "qpool-server 1.2.3\n");
  auto help = Parse({"--help"});
  EXPECT_EQ(help.status().code(), StatusCode::kCancelled);
  EXPECT_NE(help.status().message().find("--version"), std::string::npos);
}

TEST(ServerOptions, AnUnknownFlagIsUnknownEvenWithoutAValue) {
  for (const char* typo : {"--verison", "--lisen=x"}) {
    auto o = Parse({typo});
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find("unknown flag"), std::string::npos) << o.status().message();
  }
  auto missing = Parse({"--listen"});
  EXPECT_NE(missing.status().message().find("--listen needs a value"), std::string::npos);
}

TEST(ServerOptions, TlsAndCredentialFlagsThatCannotWorkAreRefused) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tls-cert", "c.pem"}, "--tls-cert and --tls-key go together"},
      {{"--tls-key", "k.pem"}, "--tls-cert and --tls-key go together"},
      {{"--tls-client-ca", "ca.pem"}, "--tls-client-ca needs --tls-cert"},
      {{"--admin-clients", "ops"}, "--admin-clients needs --tls-client-ca"},
      {{"--metrics-tls", "on"}, "--metrics-tls on needs --tls-cert"},
      {{"--metrics-tls", "yes"}, "--metrics-tls must be auto, on or off"},
      {{"--protect", "admin,everything"}, "--protect takes admin, inference, read or all"},
      {{"--tls-reload-seconds", "0"}, "--tls-reload-seconds must be an integer between 1"},
  };
  for (const auto& [args, expected] : cases) {
    auto o = Parse(args);
    ASSERT_FALSE(o.ok()) << args[0];
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find(expected), std::string::npos) << o.status().message();
  }
}

TEST(ServerOptions, TlsAndCredentialFlags) {
  auto o = Parse({"--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem",
                  "--admin-clients", "ops,deployer", "--protect", "admin,read",
                  "--admin-token-file", "tokens", "--tls-reload-seconds", "5"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->admin_clients, (std::vector<std::string>{"ops", "deployer"}));
  EXPECT_EQ(o->protect, (std::vector<std::string>{"admin", "read"}));
  EXPECT_EQ(o->tls_reload_seconds, 5);
  EXPECT_EQ(o->metrics_tls, "auto");
  auto all = Parse({"--protect", "all"});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->protect, (std::vector<std::string>{"admin", "inference", "read"}));
  auto defaults = Parse({});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->protect, (std::vector<std::string>{"admin"}));
}

// Values that would silently leave admin calls open, or a feature off, are start-up errors
// naming the flag (exit 2), not shorter lists.
TEST(ServerOptions, EmptyListsAndEmptyFileOrAddressValuesAreRefused) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--protect", ""}, "--protect takes one or more comma-separated classes"},
      {{"--protect", ","}, "--protect takes one or more comma-separated classes"},
      {{"--protect", "admin,,read"}, "--protect takes one or more comma-separated classes"},
      {{"--protect", "read,"}, "--protect takes one or more comma-separated classes"},
      {{"--admin-clients", ""}, "--admin-clients takes one or more comma-separated client"},
      {{"--admin-clients", "ops,"}, "--admin-clients takes one or more comma-separated client"},
      {{"--admin-token-file", ""}, "--admin-token-file needs a value"},
      {{"--tls-cert=", "--tls-key="}, "--tls-cert needs a value"},
      {{"--tls-client-ca", ""}, "--tls-client-ca needs a value"},
      {{"--listen", ""}, "--listen needs a value"},
      {{"--model-repository="}, "--model-repository needs a value"},
      {{"--metrics-listen="}, "--metrics-listen needs a value"},
  };
  for (const auto& [args, expected] : cases) {
    auto o = Parse(args);
    ASSERT_FALSE(o.ok()) << args[0] << " " << (args.size() > 1 ? args[1] : "");
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find(expected), std::string::npos) << o.status().message();
  }
}

// --protect adds classes to admin, which stays protected whatever it names.
TEST(ServerOptions, ProtectAddsToAdminNeverReplacesIt) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"read", {"admin", "read"}},
      {"inference", {"admin", "inference"}},
      {"inference,read", {"admin", "inference", "read"}},
      {"read,admin,read", {"admin", "read"}},
      {"admin", {"admin"}},
      {"all", {"admin", "inference", "read"}},
  };
  for (const auto& [value, expected] : cases) {
    auto o = Parse({"--protect", value});
    ASSERT_TRUE(o.ok()) << value << ": " << o.status().ToString();
    EXPECT_EQ(o->protect, expected) << value;
  }
}

TEST(ServerOptions, LoopbackAddresses) {
  for (const char* local : {"127.0.0.1:50051", "127.1.2.3:0", "localhost:9100", "[::1]:50051"}) {
    EXPECT_TRUE(IsLoopbackListen(local)) << local;
  }
  for (const char* remote : {"0.0.0.0:50051", "[::]:50051", "10.0.0.7:50051", "qpool:50051",
                             "127example.com:1", "127.evil.example:1"}) {
    EXPECT_FALSE(IsLoopbackListen(remote)) << remote;
  }
}

}  // namespace
}  // namespace qpool
