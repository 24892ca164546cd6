// TokenFile: the bearer tokens that authorize protected calls, read from a file that an operator
// (or a Kubernetes Secret) can rewrite while the server runs.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "util/status.h"

namespace qpool {

// Note [Bearer tokens]
// A token file holds one token per line; blank lines and lines starting with '#' are skipped, so
// a new token can be added before the old one is removed (rotation without a restart). A token is
// 16 to 4096 printable ASCII characters without spaces: shorter ones are guessable, and anything
// else could not travel in an `authorization: Bearer <token>` header. Only SHA-256 digests of the
// tokens stay in memory, and a presented token is compared digest to digest with CRYPTO_memcmp,
// so neither a core dump nor the time a comparison takes gives a token away. The file is re-read
// when its identity (device, inode, size, modification time) changes, which covers both an edit
// in place and a Secret's atomic symlink swap; a re-read that fails keeps the tokens it had.

class TokenFile {
 public:
  // Reads `path`. NotFound if it cannot be read, InvalidArgument naming the file and line for a
  // malformed token or a file without tokens.
  static StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path);

  // True if `token` is one of the file's tokens. Re-reads the file first when it changed.
  // Thread safety: safe from any thread (takes mu_; the re-read happens under it).
  bool Accepts(const std::string& token);

  const std::string& path() const { return path_; }
  // How many tokens the file holds now.
  size_t size();

 private:
  using Digest = std::array<uint8_t, 32>;
  using Identity = std::tuple<uint64_t, uint64_t, int64_t, int64_t, int64_t>;

  explicit TokenFile(std::string path) : path_(std::move(path)) {}
  // Reads the file if its identity differs from identity_; mu_ held.
  Status RefreshLocked();

  const std::string path_;
  std::mutex mu_;
  Identity identity_{};
  std::vector<Digest> digests_;
  bool reported_failure_ = false;  // a failed re-read is logged once until the next success
};

// The tokens of a token file's text; InvalidArgument naming `path` and the line otherwise.
StatusOr<std::vector<std::string>> ParseTokens(const std::string& text, const std::string& path);

}  // namespace qpool
