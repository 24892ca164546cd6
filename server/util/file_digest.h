// SHA-256 digests of model files, each file hashed once per identity.
#pragma once

#include <string>

#include "util/file_identity.h"
#include "util/status.h"

namespace qpool {

// Note [File digests]
// The manifest may record each component file's SHA-256 (the exporter and the importer write
// them). A load verifies it on the bytes it loads (Note [One descriptor per file] in
// util/model_file.h), so a flipped byte, a truncated copy or another component's file under this
// name fails the load with INVALID_ARGUMENT naming the file, instead of loading and generating
// wrong images. Hashing reads the whole file, bound by the CPU even with its SHA extensions, so
// digests are remembered by file identity (device, inode, size, modification and change times):
// reloading an unchanged file costs one fstat, and a file rewritten in place, even to the same
// size with its modification time set back, is hashed again (its change time cannot be set
// back). A digest is remembered only for a file unchanged while it was hashed and last changed
// before the clock's current tick (a change within that tick could be followed by another
// stamped alike). A load hashes all its component files at once, each on its own thread (a
// first load of FLUX hashes 35 GB): the wait is the largest file's, mostly behind the reading of
// the ones before it.

// Lowercase hex SHA-256 of the file at `path`; NotFound / Internal naming the file on failure.
StatusOr<std::string> Sha256File(const std::string& path);

// The same of the bytes of the file open as `fd` (read with pread: the offset is left alone),
// named `name` in errors.
StatusOr<std::string> Sha256Descriptor(int fd, const std::string& name);

// Sha256Descriptor, remembered by the file's identity for the life of the process.
// Thread safety: safe to call from any thread; two threads may hash one new file at once.
StatusOr<std::string> CachedSha256Descriptor(int fd, const std::string& name);

// CachedSha256Descriptor of the file at `path`.
StatusOr<std::string> CachedSha256File(const std::string& path);

// True for 64 lowercase hex digits.
bool IsSha256Hex(const std::string& s);

}  // namespace qpool
