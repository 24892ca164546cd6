// Sha256File against the standard's vectors; CachedSha256File sees a file rewritten in place,
// its times restored or not.
#include "util/file_digest.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "testing/test_paths.h"

namespace qpool {
namespace {

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(FileDigest, KnownVectors) {
  const std::string dir = testing::MakeTempDir("digest");
  Write(dir + "/empty", "");
  Write(dir + "/abc", "abc");
  EXPECT_EQ(*Sha256File(dir + "/empty"),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(*Sha256File(dir + "/abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // Longer than the read buffer (4 MiB): one million 'a's, then 5 MiB of them.
  Write(dir + "/million", std::string(1000000, 'a'));
  EXPECT_EQ(*Sha256File(dir + "/million"),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  Write(dir + "/big", std::string(5 << 20, 'a'));
  EXPECT_TRUE(IsSha256Hex(*Sha256File(dir + "/big")));
}

TEST(FileDigest, MissingFileIsNotFoundNamingIt) {
  auto digest = Sha256File("/nonexistent/unet.pt");
  ASSERT_FALSE(digest.ok());
  EXPECT_EQ(digest.status().code(), StatusCode::kNotFound);
  EXPECT_NE(digest.status().message().find("/nonexistent/unet.pt"), std::string::npos);
  EXPECT_FALSE(CachedSha256File("/nonexistent/unet.pt").ok());
}

TEST(FileDigest, CacheSeesAFileRewrittenInPlaceToTheSameSize) {
  const std::string path = testing::MakeTempDir("digest-cache") + "/unet.pt";
  Write(path, "abc");
  EXPECT_EQ(*CachedSha256File(path), *Sha256File(path));
  EXPECT_EQ(*CachedSha256File(path), *Sha256File(path));  // remembered
  Write(path, "abd");
  // Another modification time even on a coarse clock.
  struct timespec times[2] = {{0, UTIME_OMIT}, {1234567, 89}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_EQ(*CachedSha256File(path), *Sha256File(path));
  EXPECT_NE(*CachedSha256File(path),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(FileDigest, CacheSeesAnEditWhoseSizeAndModificationTimeAreRestored) {
  const std::string path = testing::MakeTempDir("digest-cache-times") + "/unet.pt";
  Write(path, "abc");
  usleep(20000);  // past the clock tick of the write: the digest is remembered
  const std::string first = *CachedSha256File(path);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  Write(path, "abd");
  const timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_NE(*CachedSha256File(path), first);  // the change time moved; no one sets it back
  EXPECT_EQ(*CachedSha256File(path), *Sha256File(path));
}

TEST(FileDigest, HexCheck) {
  EXPECT_TRUE(IsSha256Hex(std::string(64, 'a')));
  EXPECT_FALSE(IsSha256Hex(std::string(63, 'a')));
  EXPECT_FALSE(IsSha256Hex(std::string(64, 'A')));
  EXPECT_FALSE(IsSha256Hex(std::string(63, 'a') + "g"));
}

}  // namespace
}  // namespace qpool
