// ModelFile: a model file opened once, checked where it is, hashed and read through the one
// descriptor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "util/file_digest.h"
#include "util/status.h"

namespace qpool {

// Note [One descriptor per file]
// Checking a file by its path and then reading it by its path again reads whatever the path
// names by then: a file renamed over a component between its digest check and its load was
// loaded unverified, and a symbolic link swapped in after the
// manifest was read led out of the model repository. So a load opens each file once and does
// everything through that descriptor:
//   - where: the opened file's real path, read back from the descriptor (/proc/self/fd), must
//     lie inside the model repository (links within it stay allowed: Note [Files stay in the
//     repository] in config/manifest_parser.cpp); a link swapped in later changes nothing, the
//     descriptor is already open;
//   - what: the digest is of the descriptor's bytes, and the loader reads the same descriptor;
//   - when: a rewrite in place (the same inode) is what a descriptor does not stop, and every
//     write, truncation or time change moves the inode's change time (ctime), which no user can
//     set back. The identity (device, inode, size, mtime, ctime) is taken at open and compared
//     after the load: a file changed meanwhile fails its load, to be loaded again. Timestamps
//     come from a clock that ticks every few milliseconds, so a file changed in the tick of its
//     open could change again unseen: Open waits until that tick is over (only files written
//     within the last few milliseconds wait at all).
// What remains: filesystems whose timestamps are coarser than a tick (one second on FAT or old
// ext3 inodes), and writes through a shared writable mapping opened before the load, which the
// kernel dates only when the page is next written back. Keep the repository writable only by
// the exporter.
class ModelFile {
 public:
  // Opens `path` for reading. With `root`, the file opened must lie inside it, links resolved:
  // InvalidArgument naming both otherwise. NotFound when it cannot be opened, InvalidArgument
  // when it is no regular file.
  static StatusOr<std::unique_ptr<ModelFile>> Open(const std::string& path,
                                                   const std::string& root = "");
  ~ModelFile();
  ModelFile(const ModelFile&) = delete;
  ModelFile& operator=(const ModelFile&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  int64_t size() const { return opened_.size; }
  const FileIdentity& identity() const { return opened_; }
  // A path that opens this very file (the descriptor's /proc/self/fd entry), for libraries that
  // take a path only; valid while this object lives.
  std::string descriptor_path() const;

  // Lowercase hex SHA-256 of the bytes behind the descriptor, remembered by identity for the
  // life of the process (Note [File digests] in util/file_digest.h).
  StatusOr<std::string> Sha256() const;
  // Reads up to `n` bytes at `offset`; the count read (less only at the end), or an error.
  StatusOr<size_t> ReadAt(uint64_t offset, void* buffer, size_t n) const;
  // InvalidArgument naming the file when it changed since Open (size, times or contents).
  Status CheckUnchanged() const;

 private:
  ModelFile(int fd, std::string path, FileIdentity opened);

  const int fd_;
  const std::string path_;
  const FileIdentity opened_;
};

}  // namespace qpool
