#include "util/token_file.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
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

namespace {

// The file's contents, read through one descriptor whose own identity is returned: what was read
// is what the identity describes, even if the path is swapped meanwhile.
Status ReadTokenFile(const std::string& path, std::string* text, TokenFile::Identity* identity) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return NotFound(StrCat("cannot read token file ", path, ": ", std::strerror(errno)));
  struct stat st {};
  Status status;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kMaxFileBytes) {
    status = InvalidArgument(StrCat("token file ", path, " is not a regular file of at most ",
                                    kMaxFileBytes, " bytes"));
  } else {
    *identity = IdentityOfStat(st);
    text->clear();
    char buffer[8192];
    for (;;) {
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status = NotFound(StrCat("cannot read token file ", path, ": ", std::strerror(errno)));
        break;
      }
      if (n == 0) break;
      text->append(buffer, static_cast<size_t>(n));
      if (text->size() > static_cast<size_t>(kMaxFileBytes)) {  // grew while being read
        status = InvalidArgument(StrCat("token file ", path, " is larger than ", kMaxFileBytes,
                                        " bytes"));
        break;
      }
    }
  }
  close(fd);
  return status;
}

}  // namespace

Status TokenFile::RefreshLocked() {
  struct stat st {};
  if (stat(path_.c_str(), &st) == 0 && read_ && !racy_ && IdentityOfStat(st) == identity_) {
    return state_;
  }
  std::string text;
  Identity identity{};
  Status status = ReadTokenFile(path_, &text, &identity);
  Digest contents{};
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), contents.data());
  // A file changed within a second of being read may change again with the same times (they
  // advance by the kernel's clock tick): until a read comes later, the contents are compared.
  struct timespec now {};
  clock_gettime(CLOCK_REALTIME, &now);
  racy_ = !status.ok() || now.tv_sec <= identity.ctime_ns / 1000000000 + 1;
  if (status.ok() && read_ && contents == contents_) {  // touched, not changed
    identity_ = identity;
    return state_;
  }
  const bool read_ok = status.ok();
  std::vector<Digest> digests;
  if (read_ok) {
    StatusOr<std::vector<std::string>> tokens = ParseTokens(text, path_);
    status = tokens.status();
    for (std::string& token : tokens.ok() ? *tokens : std::vector<std::string>{}) {
      Digest digest;
      SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest.data());
      digests.push_back(digest);
      OPENSSL_cleanse(token.data(), token.size());
    }
  }
  OPENSSL_cleanse(text.data(), text.size());
  if (read_ && status.ok()) {
    log::Info("token file ", path_, " re-read: ", digests.size(), " token(s)");
  } else if (read_ && (state_.ok() || status.message() != state_.message())) {
    log::Error(status.message(), "; no token is valid until a good file is read");
  }
  digests_ = std::move(digests);  // empty on failure: revocation fails closed
  contents_ = status.ok() ? contents : Digest{};
  identity_ = read_ok ? identity : IdentityOfStat(st);
  state_ = status;
  read_ = true;
  return status;
}

bool TokenFile::Accepts(const std::string& token) {
  Digest presented;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), presented.data());
  std::lock_guard<std::mutex> lock(mu_);
  RefreshLocked();  // a failure leaves digests_ empty; it is logged when the state changes
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
