#include "api/tls_file_mirror.h"

#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "util/log.h"
#include "util/tls_files.h"

namespace qpool::api {
namespace {

// Writes `data` to `path` through a temporary file renamed over it, readable by the owner only.
Status WriteAtomically(const std::string& path, const std::string& data) {
  const std::string temporary = path + ".new";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << data;
    if (!out.flush()) return Internal(StrCat("cannot write ", temporary, ": ", std::strerror(errno)));
  }
  chmod(temporary.c_str(), 0600);
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return Internal(StrCat("cannot rename ", temporary, ": ", std::strerror(errno)));
  }
  return Status::Ok();
}

// One digest of the three files' contents (or of why they could not be read).
std::array<uint8_t, 32> DigestOf(const std::string& cert, const std::string& key,
                                 const std::string& ca) {
  std::string parts;
  for (const std::string* part : {&cert, &key, &ca}) {
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(part->data()), part->size(), digest);
    parts.append(reinterpret_cast<const char*>(digest), sizeof(digest));
  }
  std::array<uint8_t, 32> out{};
  SHA256(reinterpret_cast<const unsigned char*>(parts.data()), parts.size(), out.data());
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<TlsFileMirror>> TlsFileMirror::Start(const Files& files,
                                                              unsigned reload_seconds,
                                                              MetricsRegistry* metrics) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/qpool-tls-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return Internal(StrCat("cannot make the TLS mirror directory: ", std::strerror(errno)));
  }
  std::unique_ptr<TlsFileMirror> mirror(new TlsFileMirror(files, pattern, reload_seconds));
  if (metrics != nullptr) {
    mirror->failures_ = &metrics->AddCounter(
        "qpool_tls_reload_failures_total",
        "Re-reads of the TLS certificate, key or client CA that did not validate and were not "
        "served (Note [TLS renewal]); the last good files keep serving.",
        {});
    mirror->failures_->WithLabels({});
    mirror->expiry_ = &metrics->AddGauge(
        "qpool_tls_certificate_expiry_seconds",
        "Seconds until the served TLS certificate expires; negative once it has.", {});
  }
  ASSIGN_OR_RETURN(const std::string cert, ReadSmallFile(files.cert));
  ASSIGN_OR_RETURN(const std::string key, ReadSmallFile(files.key));
  std::string ca;
  if (!files.client_ca.empty()) {
    ASSIGN_OR_RETURN(ca, ReadSmallFile(files.client_ca, size_t{16} << 20));
  }
  {
    std::lock_guard<std::mutex> lock(mirror->mu_);
    RETURN_IF_ERROR(mirror->ApplyLocked(cert, key, ca));
    mirror->applied_ = DigestOf(cert, key, ca);
  }
  mirror->watcher_ = std::thread([m = mirror.get()] { m->Watch(); });
  return mirror;
}

TlsFileMirror::TlsFileMirror(Files files, std::string dir, unsigned reload_seconds)
    : files_(std::move(files)),
      dir_(std::move(dir)),
      mirror_{dir_ + "/tls.crt", dir_ + "/tls.key", files_.client_ca.empty() ? "" : dir_ + "/ca.crt"},
      reload_seconds_(reload_seconds) {}

TlsFileMirror::~TlsFileMirror() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  // Exactly the files it wrote, then the directory: nothing else is ever removed.
  for (const std::string& file : {mirror_.cert, mirror_.key, mirror_.client_ca}) {
    if (file.empty()) continue;
    unlink(file.c_str());
    unlink((file + ".new").c_str());
  }
  rmdir(dir_.c_str());
}

Status TlsFileMirror::ApplyLocked(const std::string& cert, const std::string& key,
                                  const std::string& ca) {
  ASSIGN_OR_RETURN(const CertificateInfo info,
                   CheckCertificateAndKeyPem(cert, key, files_.cert, files_.key));
  if (!files_.client_ca.empty()) {
    ASSIGN_OR_RETURN(const int authorities, CheckCertificateBundlePem(ca, files_.client_ca));
    (void)authorities;
  }
  // The key first: until the certificate follows, gRPC sees a pair that does not match and keeps
  // serving the one it has.
  RETURN_IF_ERROR(WriteAtomically(mirror_.key, key));
  RETURN_IF_ERROR(WriteAtomically(mirror_.cert, cert));
  if (!mirror_.client_ca.empty()) RETURN_IF_ERROR(WriteAtomically(mirror_.client_ca, ca));
  if (expiry_ != nullptr) expiry_->WithLabels({}).Set(static_cast<double>(info.seconds_left));
  if (info.seconds_left < 0) {
    log::Warn("TLS: certificate ", info.subject, " of ", files_.cert, " expired on ",
              info.not_after, ": clients that check dates refuse it");
  }
  return Status::Ok();
}

bool TlsFileMirror::Refresh() {
  auto cert = ReadSmallFile(files_.cert);
  auto key = ReadSmallFile(files_.key);
  StatusOr<std::string> ca = std::string();
  if (!files_.client_ca.empty()) ca = ReadSmallFile(files_.client_ca, size_t{16} << 20);
  std::lock_guard<std::mutex> lock(mu_);
  Status status = !cert.ok() ? cert.status() : !key.ok() ? key.status() : ca.status();
  const Digest digest =
      status.ok() ? DigestOf(*cert, *key, *ca) : DigestOf(status.message(), "", "");
  if (digest == applied_ || digest == refused_) return false;  // served, or refused already
  if (status.ok()) status = ApplyLocked(*cert, *key, *ca);
  if (status.ok()) {
    applied_ = digest;
    refused_ = {};
    log::Info("TLS: renewed certificate from ", files_.cert, " serves new connections");
    return true;
  }
  refused_ = digest;
  if (failures_ != nullptr) failures_->WithLabels({}).Inc();
  log::Error("TLS: ", status.message(), "; the last good certificate and key keep serving");
  return false;
}

void TlsFileMirror::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait_for(lock, std::chrono::seconds(reload_seconds_), [this] { return stop_; });
    if (stop_) return;
    lock.unlock();
    Refresh();
    lock.lock();
  }
}

}  // namespace qpool::api
