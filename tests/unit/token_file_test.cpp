// Token files (Note [Bearer tokens]): their format, and rotation while the server runs.
#include "util/token_file.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <utility>
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

TEST(TokenFile, ARewrittenFileIsReadAgain) {
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
}

// Revocation fails closed (Note [Bearer tokens]): whatever the file turns into, no token read
// before it stays valid, and a good file read afterwards is served again.
TEST(TokenFile, AnEmptyMissingOrMalformedRewriteLeavesNoTokenValid) {
  const std::string dir = testing::MakeTempDir("tokens");
  const std::string path = dir + "/tokens";
  const std::vector<std::pair<std::string, std::string>> revocations = {
      {"empty", ""},
      {"comments only", "# revoked\n\n"},
      {"one malformed line", kSecond + "\nshort\n"},
      {"a malformed line before a good one", "not a token\n" + kSecond + "\n"},
  };
  for (const auto& [what, text] : revocations) {
    Write(dir + "/next", kFirst + "\n");
    ASSERT_EQ(rename((dir + "/next").c_str(), path.c_str()), 0);
    auto file = TokenFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    ASSERT_TRUE((*file)->Accepts(kFirst));
    Write(dir + "/next", text);
    ASSERT_EQ(rename((dir + "/next").c_str(), path.c_str()), 0);
    EXPECT_FALSE((*file)->Accepts(kFirst)) << what;
    EXPECT_FALSE((*file)->Accepts(kSecond)) << what;
    EXPECT_EQ((*file)->size(), 0u) << what;
    // A good file afterwards is read again.
    Write(dir + "/next", kSecond + "\n");
    ASSERT_EQ(rename((dir + "/next").c_str(), path.c_str()), 0);
    EXPECT_TRUE((*file)->Accepts(kSecond)) << what;
    EXPECT_FALSE((*file)->Accepts(kFirst)) << what;
  }
  auto file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Accepts(kSecond));
  ASSERT_EQ(unlink(path.c_str()), 0);
  EXPECT_FALSE((*file)->Accepts(kSecond)) << "a deleted file revokes every token";
  Write(path, kFirst + "\n");
  EXPECT_TRUE((*file)->Accepts(kFirst)) << "a recreated file is read";
}

// An edit in place that keeps the size and restores the modification time still changes the
// file's change time, and the new contents are read.
TEST(TokenFile, AnInPlaceEditKeepingSizeAndModificationTimeIsRead) {
  const std::string path = testing::MakeTempDir("tokens") + "/tokens";
  Write(path, kFirst + "\n");
  struct stat before {};
  ASSERT_EQ(stat(path.c_str(), &before), 0);
  auto file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Accepts(kFirst));
  {
    std::fstream edit(path, std::ios::in | std::ios::out | std::ios::binary);
    edit.seekp(0);
    edit << kSecond;  // same length
  }
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  struct stat after {};
  ASSERT_EQ(stat(path.c_str(), &after), 0);
  ASSERT_EQ(after.st_size, before.st_size);
  ASSERT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  EXPECT_TRUE((*file)->Accepts(kSecond));
  EXPECT_FALSE((*file)->Accepts(kFirst));
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
