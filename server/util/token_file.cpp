#include "util/token_file.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "util/log.h"

namespace qpool {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr size_t kMaxTokenLength = 4096;
// A token file is a handful of lines; anything much larger is the wrong file.
constexpr std::streamoff kMaxFileBytes = 1 << 20;

std::string Trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  const auto end = s.find_last_not_of(" \t\r");
  return s.substr(begin, end - begin + 1);
}

bool IsTokenChar(char c) { return c > 0x20 && c < 0x7f; }

}  // namespace

StatusOr<std::vector<std::string>> ParseTokens(const std::string& text, const std::string& path) {
  std::vector<std::string> tokens;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string token = Trim(line);
    if (token.empty() || token[0] == '#') continue;
    bool printable = true;
    for (char c : token) printable = printable && IsTokenChar(c);
    if (!printable || token.size() < kMinTokenLength || token.size() > kMaxTokenLength) {
      return InvalidArgument(StrCat(path, " line ", number, ": a token is ", kMinTokenLength,
                                    " to ", kMaxTokenLength,
                                    " printable ASCII characters without spaces (e.g. openssl "
                                    "rand -hex 32)"));
    }
    tokens.push_back(token);
  }
  if (tokens.empty()) return InvalidArgument(StrCat(path, " holds no token"));
  return tokens;
}

StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path) {
  std::unique_ptr<TokenFile> file(new TokenFile(path));
  std::lock_guard<std::mutex> lock(file->mu_);
  RETURN_IF_ERROR(file->RefreshLocked());
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(st.st_mode & 0777));
    log::Warn("token file ", path, " can be read by other users (mode ", mode, "); chmod 600 it");
  }
  return file;
}

Status TokenFile::RefreshLocked() {
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) {
    return NotFound(StrCat("cannot read token file ", path_, ": ", std::strerror(errno)));
  }
  const Identity identity{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
  if (identity == identity_ && !digests_.empty()) return Status::Ok();
  if (!S_ISREG(st.st_mode) || st.st_size > kMaxFileBytes) {
    return InvalidArgument(StrCat("token file ", path_, " is not a regular file of at most ",
                                  kMaxFileBytes, " bytes"));
  }
  std::ifstream in(path_, std::ios::binary);
  if (!in) return NotFound(StrCat("cannot read token file ", path_, ": ", std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  ASSIGN_OR_RETURN(std::vector<std::string> tokens, ParseTokens(text.str(), path_));
  std::vector<Digest> digests;
  for (const std::string& token : tokens) {
    Digest digest;
    SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest.data());
    digests.push_back(digest);
    OPENSSL_cleanse(const_cast<char*>(token.data()), token.size());
  }
  if (!digests_.empty()) log::Info("token file ", path_, " re-read: ", digests.size(), " token(s)");
  digests_ = std::move(digests);
  identity_ = identity;
  return Status::Ok();
}

bool TokenFile::Accepts(const std::string& token) {
  Digest presented;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), presented.data());
  std::lock_guard<std::mutex> lock(mu_);
  const Status refreshed = RefreshLocked();
  if (!refreshed.ok() && !reported_failure_) {
    log::Error(refreshed.message(), "; keeping the ", digests_.size(), " token(s) read before");
  }
  reported_failure_ = !refreshed.ok();
  bool accepted = false;
  for (const Digest& digest : digests_) {  // no early exit: every digest is compared
    accepted |= CRYPTO_memcmp(digest.data(), presented.data(), digest.size()) == 0;
  }
  return accepted;
}

size_t TokenFile::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return digests_.size();
}

}  // namespace qpool
