// Token files (Note [Bearer tokens]): their format, and rotation while the server runs.
#include "util/token_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "testing/test_paths.h"

namespace qpool {
namespace {

const std::string kFirst = "0123456789abcdef0123456789abcdef";
const std::string kSecond = "fedcba9876543210fedcba9876543210";

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  chmod(path.c_str(), 0600);
}

TEST(TokenFile, CommentsAndBlankLinesAreSkippedAndSpacesTrimmed) {
  auto tokens = ParseTokens("# rotated 2026-11\n\n  " + kFirst + " \r\n" + kSecond + "\n", "t");
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  EXPECT_EQ(*tokens, (std::vector<std::string>{kFirst, kSecond}));
}

TEST(TokenFile, MalformedTokensNameTheFileAndLine) {
  for (const std::string& bad :
       std::vector<std::string>{"short", "has a space in the middle!!", std::string(4097, 'x'),
                                "caf\xc3\xa9-0123456789abcdef"}) {
    auto tokens = ParseTokens("# ok\n" + bad + "\n", "/etc/qpool/tokens");
    ASSERT_FALSE(tokens.ok()) << bad;
    EXPECT_EQ(tokens.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(tokens.status().message().find("/etc/qpool/tokens line 2"), std::string::npos)
        << tokens.status().message();
  }
  auto empty = ParseTokens("# nothing here\n\n", "tokens");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("holds no token"), std::string::npos);
}

TEST(TokenFile, AcceptsOnlyItsTokens) {
  const std::string path = testing::MakeTempDir("tokens") + "/tokens";
  Write(path, kFirst + "\n");
  auto file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE((*file)->Accepts(kFirst));
  EXPECT_FALSE((*file)->Accepts(kSecond));
  EXPECT_FALSE((*file)->Accepts(""));
  EXPECT_FALSE((*file)->Accepts(kFirst + "x"));
  EXPECT_FALSE((*file)->Accepts(kFirst.substr(0, 31)));
}

TEST(TokenFile, ARewrittenFileIsReadAgainAndABrokenOneKeepsTheOldTokens) {
  const std::string dir = testing::MakeTempDir("tokens");
  const std::string path = dir + "/tokens";
  Write(path, kFirst + "\n");
  auto file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok());
  // Rotation: add the new token, then drop the old one (a new file renamed over the old, as a
  // Kubernetes Secret update does).
  Write(dir + "/next", kFirst + "\n" + kSecond + "\n");
  ASSERT_EQ(rename((dir + "/next").c_str(), path.c_str()), 0);
  EXPECT_TRUE((*file)->Accepts(kSecond));
  EXPECT_TRUE((*file)->Accepts(kFirst));
  Write(dir + "/next", kSecond + "\n");
  ASSERT_EQ(rename((dir + "/next").c_str(), path.c_str()), 0);
  EXPECT_FALSE((*file)->Accepts(kFirst));
  EXPECT_TRUE((*file)->Accepts(kSecond));
  // A broken rewrite keeps the tokens read before instead of locking everyone out or in.
  Write(dir + "/next", "short\n");
  ASSERT_EQ(rename((dir + "/next").c_str(), path.c_str()), 0);
  EXPECT_TRUE((*file)->Accepts(kSecond));
  EXPECT_EQ((*file)->size(), 1u);
  unlink(path.c_str());
  EXPECT_TRUE((*file)->Accepts(kSecond));
}

TEST(TokenFile, OpenFailsForMissingOrEmptyFiles) {
  auto missing = TokenFile::Open("/nonexistent/tokens");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/tokens"), std::string::npos);
  const std::string path = testing::MakeTempDir("tokens") + "/empty";
  Write(path, "");
  EXPECT_EQ(TokenFile::Open(path).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace qpool
