// ModelFile (Note [One descriptor per file]): the digest and the reads are of the file opened,
// whatever the path names later; a change in place is seen, times set back or not; a file that
// resolves outside the repository is refused at open.
#include "util/model_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "testing/test_paths.h"
#include "util/file_digest.h"

namespace qpool {
namespace {

std::string Read(const ModelFile& file) {
  std::string bytes(static_cast<size_t>(file.size()), '\0');
  auto got = file.ReadAt(0, bytes.data(), bytes.size());
  EXPECT_TRUE(got.ok()) << got.status().ToString();
  bytes.resize(got.ok() ? *got : 0);
  return bytes;
}

TEST(ModelFile, DigestAndReadsAreOfTheFileOpenedThoughAnotherIsRenamedOverIt) {
  const std::string dir = testing::MakeTempDir("model-file-swap");
  testing::WriteFile(dir + "/unet.pt", "the verified component");
  testing::WriteFile(dir + "/other.pt", "a file swapped in later");
  auto file = ModelFile::Open(dir + "/unet.pt", dir);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const std::string expected = *Sha256File(dir + "/unet.pt");
  ASSERT_EQ(std::rename((dir + "/other.pt").c_str(), (dir + "/unet.pt").c_str()), 0);
  EXPECT_EQ(*(*file)->Sha256(), expected);
  EXPECT_EQ(Read(**file), "the verified component");
  // The rename unlinked the file opened: what was loaded from it is not what the path is now.
  const Status unchanged = (*file)->CheckUnchanged();
  EXPECT_EQ(unchanged.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unchanged.message().find(dir + "/unet.pt changed while it was loaded"),
            std::string::npos)
      << unchanged.message();
  testing::RemoveTree(dir);
}

TEST(ModelFile, ARewriteInPlaceIsSeenThoughItsSizeAndModificationTimeAreKept) {
  const std::string dir = testing::MakeTempDir("model-file-edit");
  const std::string path = dir + "/unet.pt";
  testing::WriteFile(path, "abc");
  auto file = ModelFile::Open(path, dir);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE((*file)->CheckUnchanged().ok());
  const std::string before = *(*file)->Sha256();
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  const int fd = open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "abd", 3, 0), 3);
  close(fd);
  const timespec times[2] = {st.st_atim, st.st_mtim};  // the modification time set back
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_EQ((*file)->CheckUnchanged().code(), StatusCode::kInvalidArgument);
  // The digest cache sees it too (it once keyed on size and modification time only).
  EXPECT_NE(*(*file)->Sha256(), before);
  EXPECT_EQ(*(*file)->Sha256(), *Sha256File(path));
  testing::RemoveTree(dir);
}

TEST(ModelFile, AFileThatResolvesOutsideTheRepositoryIsRefusedAtOpen) {
  const std::string base = testing::MakeTempDir("model-file-root");
  const std::string root = base + "/models";
  testing::WriteFile(root + "/tiny/unet.pt", "inside");
  testing::WriteFile(base + "/secret", "outside");
  std::filesystem::create_symlink(root + "/tiny/unet.pt", root + "/tiny/shared.pt");
  std::filesystem::create_symlink(base + "/secret", root + "/tiny/vae.pt");
  EXPECT_TRUE(ModelFile::Open(root + "/tiny/unet.pt", root).ok());
  EXPECT_TRUE(ModelFile::Open(root + "/tiny/shared.pt", root).ok()) << "a link within stays";
  auto out = ModelFile::Open(root + "/tiny/vae.pt", root);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("outside the model repository"), std::string::npos)
      << out.status().message();
  // A sibling whose name starts like the repository's is outside too.
  testing::WriteFile(base + "/models-other/unet.pt", "outside");
  std::filesystem::create_symlink(base + "/models-other/unet.pt", root + "/tiny/text.pt");
  EXPECT_FALSE(ModelFile::Open(root + "/tiny/text.pt", root).ok());
  testing::RemoveTree(base);
}

TEST(ModelFile, MissingFilesAndFoldersAreRefusedNamingThePath) {
  const std::string dir = testing::MakeTempDir("model-file-missing");
  auto missing = ModelFile::Open(dir + "/nowhere.pt", dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir + "/nowhere.pt"), std::string::npos);
  auto folder = ModelFile::Open(dir, dir);
  ASSERT_FALSE(folder.ok());
  EXPECT_EQ(folder.status().code(), StatusCode::kInvalidArgument);
  testing::RemoveTree(dir);
}

}  // namespace
}  // namespace qpool
