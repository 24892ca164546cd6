// TokenFile: the bearer tokens that authorize protected calls, read from a file that an operator
// (or a Kubernetes Secret) can rewrite while the server runs.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "util/file_identity.h"
#include "util/status.h"

namespace qpool {

// Note [Bearer tokens]
// A token file holds one token per line; blank lines and lines starting with '#' are skipped, so
// a new token can be added before the old one is removed (rotation without a restart). A token is
// 16 to 4096 printable ASCII characters without spaces: shorter ones are guessable, and anything
// else could not travel in an `authorization: Bearer <token>` header. Only SHA-256 digests of the
// tokens stay in memory, and a presented token is compared digest to digest with CRYPTO_memcmp,
// so neither a core dump nor the time a comparison takes gives a token away.
//
// Every check looks at the file again: its identity (device, inode, size, modification and
// change times) covers an edit in place, one that restores the size and modification time too,
// and a Secret's atomic symlink swap. A changed identity re-reads the file, and a changed digest
// of its contents replaces the tokens; a file changed within a second of its last read is read
// again whatever its identity, since its times advance by the kernel's clock tick. Revocation
// fails closed: a file that is missing, empty, comments only or malformed on any line leaves no
// token valid, so protected calls are denied (and the state logged once) until a good file is
// read. Open, at start-up, refuses all of these instead: a server started without a usable token
// is a mistake to report, not a state to serve.

class TokenFile {
 public:
  // What tells a rewrite of the file: device, inode, size, modification and change times.
  using Identity = FileIdentity;

  // Reads `path`. NotFound if it cannot be read, InvalidArgument naming the file and line for a
  // malformed token or a file without tokens.
  static StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path);

  // True if `token` is one of the file's tokens now. Re-reads the file first when it changed;
  // false for every token while the file is missing or malformed (Note [Bearer tokens]).
  // Thread safety: safe from any thread (takes mu_; the re-read happens under it).
  bool Accepts(const std::string& token);

  const std::string& path() const { return path_; }
  // How many tokens are valid now (0 while the file is missing, empty or malformed).
  size_t size();

 private:
  using Digest = std::array<uint8_t, 32>;

  explicit TokenFile(std::string path) : path_(std::move(path)) {}
  // Reads the file if its identity differs from identity_, replacing digests_ when its contents
  // changed and clearing them when it cannot be read or parsed; returns why no token is valid
  // (or Ok). mu_ held.
  Status RefreshLocked();

  const std::string path_;
  std::mutex mu_;
  Identity identity_{};
  bool read_ = false;     // identity_, contents_ and state_ describe a read of the file
  bool racy_ = false;     // the read came within a second of the file's change: re-read
  Digest contents_{};     // SHA-256 of the contents read last
  Status state_;          // why no token is valid, or Ok (logged when it changes)
  std::vector<Digest> digests_;
};

// The tokens of a token file's text; InvalidArgument naming `path` and the line otherwise.
StatusOr<std::vector<std::string>> ParseTokens(const std::string& text, const std::string& path);

}  // namespace qpool
