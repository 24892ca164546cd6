#include "util/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "util/log.h"

namespace qpool {
namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using X509Ptr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;

// OpenSSL's last error as text, clearing its queue.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM data";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

Bio MemoryBio(const std::string& data) {
  return Bio(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

std::string Subject(X509* cert) {
  Bio out(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(out.get(), X509_get_subject_name(cert), 0, XN_FLAG_RFC2253);
  char* data = nullptr;
  const long size = BIO_get_mem_data(out.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

std::string NotAfter(X509* cert) {
  Bio out(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(out.get(), X509_get0_notAfter(cert));
  char* data = nullptr;
  const long size = BIO_get_mem_data(out.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

}  // namespace

StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(StrCat("cannot read ", path, ": ", std::strerror(errno)));
  std::string data;
  data.resize(max_bytes + 1);
  in.read(&data[0], static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<size_t>(in.gcount()));
  if (data.size() > max_bytes) {
    return InvalidArgument(StrCat(path, " is larger than ", max_bytes, " bytes"));
  }
  return data;
}

StatusOr<CertificateInfo> CheckCertificateAndKey(const std::string& cert_path,
                                                 const std::string& key_path) {
  ASSIGN_OR_RETURN(const std::string cert_pem, ReadSmallFile(cert_path));
  ASSIGN_OR_RETURN(const std::string key_pem, ReadSmallFile(key_path));
  return CheckCertificateAndKeyPem(cert_pem, key_pem, cert_path, key_path);
}

StatusOr<CertificateInfo> CheckCertificateAndKeyPem(const std::string& cert_pem,
                                                    const std::string& key_pem,
                                                    const std::string& cert_name,
                                                    const std::string& key_name) {
  ERR_clear_error();
  ASSIGN_OR_RETURN(const int chain, CheckCertificateBundlePem(cert_pem, cert_name));
  (void)chain;
  Bio cert_bio = MemoryBio(cert_pem);
  X509Ptr cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    return InvalidArgument(StrCat(cert_name, " is not a PEM certificate (", OpenSslError(), ")"));
  }
  Bio key_bio = MemoryBio(key_pem);
  // A null password callback with no password: an encrypted key fails here, not at a handshake.
  KeyPtr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, const_cast<char*>("")));
  if (!key) {
    return InvalidArgument(
        StrCat(key_name, " is not an unencrypted PEM private key (", OpenSslError(), ")"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return InvalidArgument(
        StrCat(key_name, " is not the private key of the certificate in ", cert_name));
  }
  CertificateInfo info{Subject(cert.get()), NotAfter(cert.get())};
  int days = 0;
  int seconds = 0;
  if (ASN1_TIME_diff(&days, &seconds, nullptr, X509_get0_notAfter(cert.get())) == 1) {
    info.seconds_left = int64_t{days} * 86400 + seconds;
  }
  return info;
}

StatusOr<ClientCertificate> ParseClientCertificate(const std::string& pem) {
  ERR_clear_error();
  Bio bio = MemoryBio(pem);
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) return InvalidArgument(StrCat("not a PEM certificate (", OpenSslError(), ")"));
  ClientCertificate out;
  out.is_ca = X509_check_ca(cert.get()) != 0;
  X509_NAME* subject = X509_get_subject_name(cert.get());
  for (int i = X509_NAME_get_index_by_NID(subject, NID_commonName, -1); i >= 0;
       i = X509_NAME_get_index_by_NID(subject, NID_commonName, i)) {
    const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i));
    unsigned char* utf8 = nullptr;
    const int length = ASN1_STRING_to_UTF8(&utf8, data);
    if (length >= 0) out.common_names.emplace_back(reinterpret_cast<char*>(utf8), length);
    OPENSSL_free(utf8);
  }
  return out;
}

StatusOr<int> CheckCertificateBundle(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string pem, ReadSmallFile(path, size_t{16} << 20));
  return CheckCertificateBundlePem(pem, path);
}

StatusOr<int> CheckCertificateBundlePem(const std::string& pem, const std::string& name) {
  ERR_clear_error();
  Bio bio = MemoryBio(pem);
  int count = 0;
  while (X509Ptr cert{PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)}) ++count;
  ERR_clear_error();  // the read past the last certificate
  if (count == 0) return InvalidArgument(StrCat(name, " holds no PEM certificate"));
  // Every certificate block must have parsed: a truncated file's last one stops the loop above.
  static const std::string kBegin = "-----BEGIN CERTIFICATE-----";
  size_t blocks = 0;
  for (size_t at = pem.find(kBegin); at != std::string::npos; at = pem.find(kBegin, at + 1)) {
    ++blocks;
  }
  if (blocks > static_cast<size_t>(count)) {
    return InvalidArgument(StrCat(name, " holds ", blocks, " PEM certificates of which only ",
                                  count, " parse (truncated or corrupt)"));
  }
  return count;
}

}  // namespace qpool
