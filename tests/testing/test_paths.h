// Paths and temp dirs for tests: each test owns its own directory, nothing absolute is hard-coded.
#pragma once

#include <string>

namespace qpool::testing {

// The repository root (for test data and tools).
std::string SourceDir();
// The CMake build directory (for built binaries and the exported test repository).
std::string BinaryDir();
// A fresh, empty directory unique to this process and `tag`; removed by the caller if wanted.
std::string MakeTempDir(const std::string& tag);
// Removes `path` and everything under it (symbolic links are removed, not followed).
void RemoveTree(const std::string& path);
// Writes `contents` to `path`, creating parent directories.
void WriteFile(const std::string& path, const std::string& contents);
// The model repository with the exported tiny pipelines (built by the test scripts), or "" when
// it is missing; tests that need it skip with a message naming the command that builds it.
std::string TinyRepository();

}  // namespace qpool::testing
