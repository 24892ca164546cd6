#include "util/model_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "util/log.h"

namespace qpool {
namespace fs = std::filesystem;

namespace {

// True when `path` is `root` or lies below it (both absolute and free of links).
bool Inside(const fs::path& path, const fs::path& root) {
  auto p = path.begin();
  for (auto r = root.begin(); r != root.end(); ++r, ++p) {
    if (r->empty()) continue;  // a trailing separator
    if (p == path.end() || *p != *r) return false;
  }
  return true;
}

}  // namespace

StatusOr<std::unique_ptr<ModelFile>> ModelFile::Open(const std::string& path,
                                                     const std::string& root) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound(StrCat("cannot open ", path, ": ", std::strerror(errno)));
  auto fail = [fd](Status status) {
    close(fd);
    return status;
  };
  auto identity = IdentityOf(fd, path);
  if (!identity.ok()) return fail(identity.status());
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return fail(InvalidArgument(StrCat(path, " is not a regular file")));
  }
  std::unique_ptr<ModelFile> file(new ModelFile(fd, path, *identity));
  if (!root.empty()) {
    // Where the descriptor is, not where the path leads now (Note [One descriptor per file]).
    std::error_code error;
    const fs::path real = fs::read_symlink(file->descriptor_path(), error);
    if (error) {
      return InvalidArgument(
          StrCat(path, ": cannot tell where the opened file lies: ", error.message()));
    }
    const fs::path real_root = fs::canonical(root, error);
    if (error) return InvalidArgument(StrCat("model repository ", root, ": ", error.message()));
    if (!Inside(real, real_root)) {
      return InvalidArgument(StrCat(path, " resolves to ", real.string(),
                                    ", outside the model repository ", real_root.string(),
                                    " (a symbolic link out of it is refused)"));
    }
  }
  // A file changed within the clock's current tick could change again with the same times:
  // wait the tick out (Note [One descriptor per file]).
  for (int i = 0; i < 100 && !ChangedBeforeThisTick(file->opened_); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return file;
}

ModelFile::ModelFile(int fd, std::string path, FileIdentity opened)
    : fd_(fd), path_(std::move(path)), opened_(opened) {}

ModelFile::~ModelFile() { close(fd_); }

std::string ModelFile::descriptor_path() const { return StrCat("/proc/self/fd/", fd_); }

StatusOr<std::string> ModelFile::Sha256() const { return CachedSha256Descriptor(fd_, path_); }

StatusOr<size_t> ModelFile::ReadAt(uint64_t offset, void* buffer, size_t n) const {
  size_t done = 0;
  while (done < n) {
    const ssize_t got =
        pread(fd_, static_cast<char*>(buffer) + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return Internal(StrCat("reading ", path_, " failed: ", std::strerror(errno)));
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

Status ModelFile::CheckUnchanged() const {
  ASSIGN_OR_RETURN(const FileIdentity now, IdentityOf(fd_, path_));
  if (now == opened_) return Status::Ok();
  return InvalidArgument(StrCat(path_,
                                " changed while it was loaded (rewritten, renamed over or "
                                "deleted); what was read is not used: load it again"));
}

}  // namespace qpool
