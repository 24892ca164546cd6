#include "util/file_identity.h"

#include <cerrno>
#include <cstring>
#include <ctime>

#include "util/log.h"

namespace qpool {
namespace {

int64_t Nanoseconds(const timespec& t) {
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

}  // namespace

FileIdentity IdentityOfStat(const struct stat& st) {
  FileIdentity id;
  id.device = st.st_dev;
  id.inode = st.st_ino;
  id.size = st.st_size;
  id.mtime_ns = Nanoseconds(st.st_mtim);
  id.ctime_ns = Nanoseconds(st.st_ctim);
  return id;
}

StatusOr<FileIdentity> IdentityOf(int fd, const std::string& name) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return Internal(StrCat("cannot stat ", name, ": ", std::strerror(errno)));
  }
  return IdentityOfStat(st);
}

bool ChangedBeforeThisTick(const FileIdentity& identity) {
  // File times are taken from the coarse clock (a tick of a few milliseconds), or finer.
  timespec now{};
  clock_gettime(CLOCK_REALTIME_COARSE, &now);
  return identity.ctime_ns < Nanoseconds(now) && identity.mtime_ns < Nanoseconds(now);
}

}  // namespace qpool
