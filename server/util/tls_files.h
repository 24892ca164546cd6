// PEM files of TLS certificates and keys, checked before a server starts with them.
#pragma once

#include <string>

#include "util/status.h"

namespace qpool {

// What a certificate says about itself, for the start-up log.
struct CertificateInfo {
  std::string subject;    // e.g. "CN=qpool.example"
  std::string not_after;  // e.g. "Nov 25 07:00:00 2027 GMT"
};

// Checks that `cert_path` holds a PEM certificate chain and `key_path` the PEM private key of its
// first certificate. InvalidArgument naming the file otherwise (unreadable, not PEM, key of
// another certificate), so a mistake fails at start-up rather than as failed handshakes.
StatusOr<CertificateInfo> CheckCertificateAndKey(const std::string& cert_path,
                                                 const std::string& key_path);

// Checks that `path` holds at least one PEM certificate (a CA bundle); returns how many.
StatusOr<int> CheckCertificateBundle(const std::string& path);

// The whole file; NotFound naming it when it cannot be read.
StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes = 1 << 20);

}  // namespace qpool
