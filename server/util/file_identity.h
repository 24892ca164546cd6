// FileIdentity: what tells one version of a file from another without reading it.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "util/status.h"

namespace qpool {

// What stat says of a file; equal identities mean an unchanged file (the change time moves on
// every write, truncation, rename or time change, and no user can set it back).
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  bool operator==(const FileIdentity& o) const {
    return device == o.device && inode == o.inode && size == o.size && mtime_ns == o.mtime_ns &&
           ctime_ns == o.ctime_ns;
  }
  bool operator!=(const FileIdentity& o) const { return !(*this == o); }
};

// The identity of the file open as `fd`; Internal naming `name` on failure.
StatusOr<FileIdentity> IdentityOf(int fd, const std::string& name);

// True when the file last changed before the tick of the clock that stamps file times now: any
// later change is stamped later (Note [File digests]).
bool ChangedBeforeThisTick(const FileIdentity& identity);

// The identity `st` describes.
FileIdentity IdentityOfStat(const struct stat& st);

}  // namespace qpool
