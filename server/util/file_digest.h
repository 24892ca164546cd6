// SHA-256 digests of model files, each file hashed once per identity.
#pragma once

#include <string>

#include "util/status.h"

namespace qpool {

// Note [File digests]
// The manifest may record each component file's SHA-256 (the exporter and the importer write
// them). A load verifies it before TorchScript reads the file, so a flipped byte, a truncated
// copy or another component's file under this name fails the load with INVALID_ARGUMENT naming
// the file, instead of loading and generating wrong images. Hashing reads the whole file (about
// 2 GB/s with the CPU's SHA extensions), so digests are remembered by file identity (device,
// inode, size, modification time): reloading an unchanged file costs one stat, and a file
// rewritten in place, even to the same size, is hashed again. A load hashes all its component
// files at once, each on its own thread (a first load of FLUX hashes 35 GB): the wait is the
// largest file's, mostly behind the reading of the ones before it.

// Lowercase hex SHA-256 of the file at `path`; NotFound / Internal naming the file on failure.
StatusOr<std::string> Sha256File(const std::string& path);

// Sha256File, remembered by the file's identity for the life of the process.
// Thread safety: safe to call from any thread; two threads may hash one new file at once.
StatusOr<std::string> CachedSha256File(const std::string& path);

// True for 64 lowercase hex digits.
bool IsSha256Hex(const std::string& s);

}  // namespace qpool
