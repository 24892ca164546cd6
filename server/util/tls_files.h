// PEM files of TLS certificates and keys, checked before a server starts with them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace qpool {

// What a certificate says about itself, for the start-up log.
struct CertificateInfo {
  std::string subject;    // e.g. "CN=qpool.example"
  std::string not_after;  // e.g. "Nov 25 07:00:00 2027 GMT"
  int64_t seconds_left = 0;  // until not_after; negative once it passed
};

// Checks that `cert_path` holds a PEM certificate chain and `key_path` the PEM private key of its
// first certificate. InvalidArgument naming the file otherwise (unreadable, not PEM, key of
// another certificate), so a mistake fails at start-up rather than as failed handshakes.
StatusOr<CertificateInfo> CheckCertificateAndKey(const std::string& cert_path,
                                                 const std::string& key_path);

// The same checks on the files' contents, named `cert_name` and `key_name` in errors; every PEM
// block of the chain must parse (a truncated renewal is refused, not served with half a chain).
StatusOr<CertificateInfo> CheckCertificateAndKeyPem(const std::string& cert_pem,
                                                    const std::string& key_pem,
                                                    const std::string& cert_name,
                                                    const std::string& key_name);

// Checks that `path` holds at least one PEM certificate (a CA bundle); returns how many.
StatusOr<int> CheckCertificateBundle(const std::string& path);
// The same on the file's contents, named `name` in errors.
StatusOr<int> CheckCertificateBundlePem(const std::string& pem, const std::string& name);

// What an mTLS allow-list may take from a client's leaf certificate (Note [Admin credentials] in
// api/access_control.h).
struct ClientCertificate {
  bool is_ca = false;                     // basicConstraints CA:TRUE: no client's certificate
  std::vector<std::string> common_names;  // every CN of the subject, in order
};

// Parses the first certificate of `pem`; InvalidArgument when it does not parse.
StatusOr<ClientCertificate> ParseClientCertificate(const std::string& pem);

// The whole file; NotFound naming it when it cannot be read.
StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes = 1 << 20);

}  // namespace qpool
