// fuzz_tls_files: arbitrary bytes as the PEM files of TLS (util/tls_files.h): split at the first
// NUL byte into a certificate chain and a private key, checked as a renewal is before it is served
// (CheckCertificateAndKeyPem, Note [TLS renewal] in api/tls_file_mirror.h), and the whole input
// as a client CA bundle and as a client's certificate (ParseClientCertificate). A refusal must be
// INVALID_ARGUMENT naming the file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "util/tls_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qpool;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string cert = input.substr(0, split);
  const std::string key = split == std::string::npos ? "" : input.substr(split + 1);
  const auto pair = CheckCertificateAndKeyPem(cert, key, "tls.crt", "tls.key");
  if (!pair.ok()) {
    FUZZ_CHECK(pair.status().code() == StatusCode::kInvalidArgument, pair.status().ToString());
    FUZZ_CHECK(fuzz::StartsWith(pair.status().message(), "tls.crt ") ||
                   fuzz::StartsWith(pair.status().message(), "tls.key "),
               pair.status().message());
  }
  const auto bundle = CheckCertificateBundlePem(input, "ca.crt");
  if (!bundle.ok()) {
    FUZZ_CHECK(fuzz::StartsWith(bundle.status().message(), "ca.crt "), bundle.status().message());
  } else {
    FUZZ_CHECK(*bundle >= 1, "a bundle without certificates accepted");
  }
  const auto client = ParseClientCertificate(input);
  FUZZ_CHECK(client.ok() || client.status().code() == StatusCode::kInvalidArgument,
             client.status().ToString());
  return 0;
}
