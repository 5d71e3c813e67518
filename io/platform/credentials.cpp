#include "io/platform/credentials.hpp"

#include "io/platform/files.hpp"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <sys/stat.h>

#include <functional>
#include <memory>

namespace chorus::platform {

std::string ssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

namespace {

template <class T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const noexcept { Free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Store = std::unique_ptr<X509_STORE, Deleter<X509_STORE, X509_STORE_free>>;
using StoreCtx = std::unique_ptr<X509_STORE_CTX, Deleter<X509_STORE_CTX, X509_STORE_CTX_free>>;

/// OpenSSL's errors as ssl_errors() says them, or that it gave no reason.
std::string ssl_error() {
  const std::string e = ssl_errors();
  return e.empty() ? "unknown OpenSSL error" : e;
}

Error failed(std::string what) {
  what.append(": ").append(ssl_error());
  return {Errc::internal, std::move(what)};
}

bool add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

/// A certificate for `key` named `cn`, signed by `issuer_key` (self-signed when `issuer` is null).
Cert make_cert(EVP_PKEY* key, const char* cn, X509* issuer, EVP_PKEY* issuer_key, int days, bool ca) {
  Cert cert(X509_new());
  if (!cert) return nullptr;
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof serial) != 1) return nullptr;
  serial[0] &= 0x7f; // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  const bool serial_ok = bn != nullptr && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(bn);
  if (!serial_ok || X509_set_version(cert.get(), 2) != 1) return nullptr;
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60 * 60); // an hour of clock skew between nodes
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 24 * 60 * 60);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("chorus"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) != 1 || X509_set_pubkey(cert.get(), key) != 1)
    return nullptr;
  const bool ext_ok =
      ca ? add_ext(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") &&
               add_ext(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign") &&
               add_ext(cert.get(), signer, NID_subject_key_identifier, "hash")
         : add_ext(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE") &&
               add_ext(cert.get(), signer, NID_key_usage, "critical,digitalSignature,keyAgreement") &&
               add_ext(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth") &&
               add_ext(cert.get(), signer, NID_authority_key_identifier, "keyid:always");
  if (!ext_ok || X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0) return nullptr;
  return cert;
}

std::string pem(const std::function<int(BIO*)>& write) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio || write(bio.get()) != 1) return {};
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

Bio open_file(const std::string& path) { return Bio(BIO_new_file(path.c_str(), "r")); }

Error unreadable(const std::string& path, const char* what, const std::string& dir) {
  std::string m = "cannot read the ";
  m.append(what).append(" ").append(path).append(" (").append(ssl_error()).append(
      "): make the job's credentials with `chorus certs ");
  m.append(dir).append("` and copy that directory to every node");
  return {Errc::invalid_argument, std::move(m)};
}

} // namespace

Error make_credentials(const std::string& dir, int days, bool replace) {
  if (days <= 0 || days > 36500)
    return {Errc::invalid_argument, "credentials must be valid for 1 to 36500 days, not " + std::to_string(days)};
  struct stat st {};
  if (!replace && ::stat((dir + "/key.pem").c_str(), &st) == 0)
    return {Errc::invalid_argument, dir + "/key.pem already exists: the job's credentials are there; pass --force to "
                                          "replace them (every node then needs the new ones)"};
  if (Error e = make_dirs(dir)) return e;
  ::chmod(dir.c_str(), 0700);

  Key ca_key(EVP_EC_gen("P-256"));
  Key node_key(EVP_EC_gen("P-256"));
  if (!ca_key || !node_key) return failed("cannot make an EC P-256 key");
  Cert ca = make_cert(ca_key.get(), "chorus job CA", nullptr, ca_key.get(), days, true);
  if (!ca) return failed("cannot make the job's CA certificate");
  Cert node = make_cert(node_key.get(), "chorus node", ca.get(), ca_key.get(), days, false);
  if (!node) return failed("cannot make the nodes' certificate");

  const std::string key_pem = pem([&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, node_key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  const std::string cert_pem = pem([&](BIO* b) { return PEM_write_bio_X509(b, node.get()); });
  const std::string ca_pem = pem([&](BIO* b) { return PEM_write_bio_X509(b, ca.get()); });
  if (key_pem.empty() || cert_pem.empty() || ca_pem.empty()) return failed("cannot write the credentials as PEM");
  // The key first: a half-written set is one `chorus certs --force` away from whole.
  if (Error e = write_file_atomic(dir + "/key.pem", key_pem)) return e;
  if (Error e = write_file_atomic(dir + "/cert.pem", cert_pem)) return e;
  return write_file_atomic(dir + "/ca.pem", ca_pem);
}

void keep_tls_library_until_exit() noexcept {
  // Only the first initialisation decides whether OpenSSL registers its exit handler.
  (void)OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr);
}

Error check_credentials(const std::string& dir, Credentials& out) {
  keep_tls_library_until_exit();
  out = {dir + "/ca.pem", dir + "/cert.pem", dir + "/key.pem"};
  Bio ca_bio = open_file(out.ca_file);
  Cert ca(ca_bio ? PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!ca) return unreadable(out.ca_file, "job CA certificate", dir);
  Bio cert_bio = open_file(out.cert_file);
  Cert cert(cert_bio ? PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!cert) return unreadable(out.cert_file, "certificate", dir);
  Bio key_bio = open_file(out.key_file);
  Key key(key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!key) return unreadable(out.key_file, "private key", dir);
  if (X509_check_private_key(cert.get(), key.get()) != 1)
    return {Errc::invalid_argument, out.key_file + " is not the key of " + out.cert_file +
                                        ": the files come from different `chorus certs` runs; copy the whole "
                                        "directory of one run to every node"};
  Store store(X509_STORE_new());
  StoreCtx ctx(X509_STORE_CTX_new());
  if (!store || !ctx || X509_STORE_add_cert(store.get(), ca.get()) != 1 ||
      X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr) != 1)
    return failed("cannot check the certificate");
  if (X509_verify_cert(ctx.get()) != 1) {
    std::string m = out.cert_file;
    m.append(" does not verify against ").append(out.ca_file).append(" (");
    m.append(X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get())));
    m.append("): make new credentials with `chorus certs ").append(dir).append(" --force` and copy them to every node");
    return {Errc::invalid_argument, std::move(m)};
  }
  ERR_clear_error();
  return {};
}

} // namespace chorus::platform
