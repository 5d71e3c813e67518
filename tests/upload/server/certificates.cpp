// write_test_certificates (tracking_server.hpp): a throwaway CA and a
// loopback server certificate it signs, with OpenSSL, for the HTTPS tests.
#include "tests/upload/tracking_server.hpp"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace chorus::test {

namespace {

template <class T, void (*Free)(T*)>
struct Freer {
  void operator()(T* p) const noexcept { Free(p); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, Freer<EVP_PKEY, EVP_PKEY_free>>;
using CertPtr = std::unique_ptr<X509, Freer<X509, X509_free>>;
using BioPtr = std::unique_ptr<BIO, Freer<BIO, BIO_free_all>>;

[[noreturn]] void openssl_failed(const std::string& what) {
  const unsigned long e = ERR_get_error();
  char reason[256] = "no OpenSSL error recorded";
  if (e != 0) ERR_error_string_n(e, reason, sizeof reason);
  ERR_clear_error();
  throw std::runtime_error(what + ": " + reason);
}

void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) openssl_failed(std::string("extension ") + value);
  const int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (added != 1) openssl_failed(std::string("adding extension ") + value);
}

// A certificate for `key`, signed by `issuer_key` (self-signed when `issuer` is null).
CertPtr issue(EVP_PKEY* key, const std::string& common_name, X509* issuer, EVP_PKEY* issuer_key, bool ca) {
  CertPtr cert(X509_new());
  std::uint64_t serial = 0;
  if (!cert || RAND_bytes(reinterpret_cast<unsigned char*>(&serial), sizeof serial) != 1 ||
      ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert.get()), serial >> 1) != 1 || X509_set_version(cert.get(), 2) != 1)
    openssl_failed("new certificate");
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 7L * 24 * 3600);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>("chorus tests"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                             -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) != 1 || X509_set_pubkey(cert.get(), key) != 1)
    openssl_failed("certificate names");
  add_extension(cert.get(), signer, NID_subject_key_identifier, "hash");
  if (ca) {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE");
    add_extension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(cert.get(), signer, NID_key_usage, "critical,digitalSignature");
    add_extension(cert.get(), signer, NID_ext_key_usage, "serverAuth");
    add_extension(cert.get(), signer, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
    add_extension(cert.get(), signer, NID_authority_key_identifier, "keyid:always");
  }
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0) openssl_failed("signing " + common_name);
  return cert;
}

void write_pem(const std::string& path, const std::function<int(BIO*)>& write, mode_t mode) {
  BioPtr bio(BIO_new_file(path.c_str(), "w"));
  if (!bio || write(bio.get()) != 1) openssl_failed("writing " + path);
  bio.reset();
  ::chmod(path.c_str(), mode);
}

} // namespace

TlsFiles write_test_certificates(const std::string& dir) {
  KeyPtr ca_key(EVP_EC_gen("P-256"));
  KeyPtr server_key(EVP_EC_gen("P-256"));
  if (!ca_key || !server_key) openssl_failed("EC P-256 key");
  std::uint32_t tag = 0;
  RAND_bytes(reinterpret_cast<unsigned char*>(&tag), sizeof tag);
  char ca_name[64];
  std::snprintf(ca_name, sizeof ca_name, "chorus test CA %08x", tag); // each CA its own name
  const CertPtr ca = issue(ca_key.get(), ca_name, nullptr, ca_key.get(), true);
  const CertPtr server = issue(server_key.get(), "127.0.0.1", ca.get(), ca_key.get(), false);
  TlsFiles files{dir + "/server.pem", dir + "/server.key", dir + "/ca.pem"};
  write_pem(files.ca, [&](BIO* b) { return PEM_write_bio_X509(b, ca.get()); }, 0644);
  write_pem(files.cert, [&](BIO* b) { return PEM_write_bio_X509(b, server.get()); }, 0644);
  write_pem(
      files.key,
      [&](BIO* b) { return PEM_write_bio_PrivateKey(b, server_key.get(), nullptr, nullptr, 0, nullptr, nullptr); },
      0600);
  return files;
}

} // namespace chorus::test
