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
  auto o = Parse({"--listen", "127.0.0.1:0", "--max-queue=7", "--load", "a,b"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->listen, "127.0.0.1:0");
  EXPECT_EQ(o->max_queue, 7);
  EXPECT_EQ(o->load, (std::vector<std::string>{"a", "b"}));
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

}  // namespace
}  // namespace qpool
