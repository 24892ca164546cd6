// TlsFileMirror: the validated copies of the TLS files that gRPC serves from.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "metrics/metrics_registry.h"
#include "util/status.h"

namespace qpool::api {

// Note [TLS renewal]
// gRPC's file-watching certificate provider re-reads its files and serves whatever it finds: a
// renewal that wrote garbage, a truncated chain or the key of another certificate made every new
// handshake fail until the files were fixed. So gRPC watches a private mirror (a 0700 directory
// of the server's own) instead of the operator's files, and only pairs that validate reach it:
// every reload period the mirror reads the operator's certificate, key and client CA, and when
// their contents changed parses them all (every certificate of the chain, the key unencrypted and
// matching the certificate, the CA bundle) before it replaces its copies (each by a rename, key
// first). A renewal that fails keeps the last good files serving, is logged at error level once
// per distinct content and counted in qpool_tls_reload_failures_total; the certificate being
// served has its remaining validity in qpool_tls_certificate_expiry_seconds (negative once it
// expired, which is also a start-up warning).
class TlsFileMirror {
 public:
  struct Files {
    std::string cert;
    std::string key;
    std::string client_ca;  // empty: no client CA
  };

  // Validates `files` (InvalidArgument naming the file otherwise), writes the mirror and starts
  // watching every `reload_seconds`. `metrics` may be null.
  static StatusOr<std::unique_ptr<TlsFileMirror>> Start(const Files& files,
                                                        unsigned reload_seconds,
                                                        MetricsRegistry* metrics);
  // Stops watching and removes the mirror.
  ~TlsFileMirror();

  // The mirror's files, for gRPC's provider (client_ca empty when none).
  const Files& mirror() const { return mirror_; }

  // Checks the operator's files once now, as the watcher does every period; true if the mirror
  // was replaced. Thread safety: safe from any thread (takes mu_).
  bool Refresh();

 private:
  using Digest = std::array<uint8_t, 32>;
  TlsFileMirror(Files files, std::string dir, unsigned reload_seconds);
  // Validates the contents and writes the mirror; mu_ held.
  Status ApplyLocked(const std::string& cert, const std::string& key, const std::string& ca);
  void Watch();

  const Files files_;
  const std::string dir_;
  const Files mirror_;
  const unsigned reload_seconds_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  Digest applied_{};   // contents the mirror holds
  Digest refused_{};   // contents last refused (logged once)
  CounterFamily* failures_ = nullptr;
  GaugeFamily* expiry_ = nullptr;
  std::thread watcher_;
};

}  // namespace qpool::api
