#include "util/file_digest.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "util/log.h"

namespace qpool {
namespace {

struct Cache {
  std::mutex mu;
  // By (device, inode): the identity the digest was taken at, and the digest.
  std::map<std::pair<uint64_t, uint64_t>, std::pair<FileIdentity, std::string>> digests;
};

Cache& TheCache() {
  static Cache* cache = new Cache();  // never destroyed: loads may run during exit
  return *cache;
}

// Closes the descriptor it holds.
struct Descriptor {
  int fd;
  ~Descriptor() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

bool IsSha256Hex(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

StatusOr<std::string> Sha256Descriptor(int fd, const std::string& name) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return Internal("SHA-256 is not available");
  }
  std::vector<unsigned char> buffer(size_t{4} << 20);
  for (off_t offset = 0;;) {
    const ssize_t n = pread(fd, buffer.data(), buffer.size(), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Internal(StrCat("reading ", name, " failed: ", std::strerror(errno)));
    if (n == 0) break;
    if (EVP_DigestUpdate(ctx.get(), buffer.data(), static_cast<size_t>(n)) != 1) {
      return Internal(StrCat("hashing ", name, " failed"));
    }
    offset += n;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest, &size) != 1) {
    return Internal(StrCat("hashing ", name, " failed"));
  }
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < size; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

StatusOr<std::string> Sha256File(const std::string& path) {
  Descriptor file{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) return NotFound(StrCat("cannot read ", path, ": ", std::strerror(errno)));
  return Sha256Descriptor(file.fd, path);
}

StatusOr<std::string> CachedSha256Descriptor(int fd, const std::string& name) {
  ASSIGN_OR_RETURN(const FileIdentity before, IdentityOf(fd, name));
  const std::pair<uint64_t, uint64_t> key{before.device, before.inode};
  Cache& cache = TheCache();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.digests.find(key);
    if (it != cache.digests.end() && it->second.first == before) return it->second.second;
  }
  const bool settled = ChangedBeforeThisTick(before);
  ASSIGN_OR_RETURN(std::string digest, Sha256Descriptor(fd, name));
  // Remembered only if the file did not change while it was read (Note [File digests]).
  ASSIGN_OR_RETURN(const FileIdentity after, IdentityOf(fd, name));
  if (settled && after == before) {
    std::lock_guard<std::mutex> lock(cache.mu);
    cache.digests[key] = {after, digest};
  }
  return digest;
}

StatusOr<std::string> CachedSha256File(const std::string& path) {
  Descriptor file{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) return NotFound(StrCat("cannot read ", path, ": ", std::strerror(errno)));
  return CachedSha256Descriptor(file.fd, path);
}

}  // namespace qpool
