// TLS for the links between nodes: see actors/links/tls_session.hpp.
#include "actors/links/tls_session.hpp"

#include "io/platform/credentials.hpp"
#include "runtime/core/immortal.hpp"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <sys/socket.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

namespace chorus::actors {
namespace {

// A BIO over the connection's socket: recv, and send without SIGPIPE.
int fd_of(BIO* b) { return static_cast<int>(reinterpret_cast<std::intptr_t>(BIO_get_data(b))); }

int socket_write(BIO* b, const char* data, int len) {
  BIO_clear_retry_flags(b);
  const ssize_t n = ::send(fd_of(b), data, static_cast<std::size_t>(len), MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_write(b);
  return static_cast<int>(n);
}

int socket_read(BIO* b, char* data, int len) {
  BIO_clear_retry_flags(b);
  const ssize_t n = ::recv(fd_of(b), data, static_cast<std::size_t>(len), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(b);
  return static_cast<int>(n);
}

long socket_ctrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int socket_create(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

BIO_METHOD* socket_method() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "chorus link socket");
    if (m != nullptr) {
      BIO_meth_set_write(m, socket_write);
      BIO_meth_set_read(m, socket_read);
      BIO_meth_set_ctrl(m, socket_ctrl);
      BIO_meth_set_create(m, socket_create);
    }
    return m;
  }();
  return method;
}

Error unloadable(const std::string& file, const char* what) {
  std::string m = "cannot load the job's ";
  m.append(what).append(" ").append(file).append(" for TLS (").append(platform::ssl_errors()).append(
      "): make the job's credentials with `chorus certs DIR`, copy DIR to every node and set CHORUS_TLS_DIR=DIR");
  return {Errc::invalid_argument, std::move(m)};
}

} // namespace

Result<std::shared_ptr<const TlsContext>> TlsContext::load(const platform::Credentials& creds) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) return Error{Errc::internal, "cannot make an OpenSSL context: " + platform::ssl_errors()};
  std::shared_ptr<const TlsContext> out(new TlsContext(ctx));
  if (SSL_CTX_use_certificate_chain_file(ctx, creds.cert_file.c_str()) != 1)
    return unloadable(creds.cert_file, "certificate");
  if (SSL_CTX_use_PrivateKey_file(ctx, creds.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1)
    return unloadable(creds.key_file, "key");
  if (SSL_CTX_load_verify_locations(ctx, creds.ca_file.c_str(), nullptr) != 1)
    return unloadable(creds.ca_file, "CA certificate");
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (SSL_CTX_set_cipher_list(ctx, "HIGH:!aNULL:!MD5") != 1) return Error{Errc::internal, "cannot set TLS ciphers: " + platform::ssl_errors()};
  // A link connects once: nothing to resume, so no ticket to make.
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  // CAF's stream writes what is left of its buffer, which may have moved.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return out;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

std::unique_ptr<TlsSession> TlsSession::make(std::shared_ptr<const TlsContext> ctx, int fd, bool accepted) {
  BIO_METHOD* method = socket_method();
  if (method == nullptr || !ctx) return nullptr;
  SSL* ssl = SSL_new(ctx->native());
  if (ssl == nullptr) return nullptr;
  BIO* bio = BIO_new(method);
  if (bio == nullptr) {
    SSL_free(ssl);
    return nullptr;
  }
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)));
  SSL_set_bio(ssl, bio, bio); // the session owns it
  if (accepted)
    SSL_set_accept_state(ssl);
  else
    SSL_set_connect_state(ssl);
  return std::unique_ptr<TlsSession>(new TlsSession(std::move(ctx), ssl));
}

TlsSession::~TlsSession() { SSL_free(ssl_); }

TlsSession::Io TlsSession::read(void* buf, std::size_t len, std::size_t& n) {
  ERR_clear_error();
  return classify(SSL_read(ssl_, buf, static_cast<int>(std::min<std::size_t>(len, INT_MAX))), n);
}

TlsSession::Io TlsSession::write(const void* buf, std::size_t len, std::size_t& n) {
  ERR_clear_error();
  if (len == 0) {
    n = 0;
    if (SSL_is_init_finished(ssl_)) return Io::done;
    const int ret = SSL_do_handshake(ssl_);
    return ret == 1 ? Io::done : classify(ret, n);
  }
  return classify(SSL_write(ssl_, buf, static_cast<int>(std::min<std::size_t>(len, INT_MAX))), n);
}

std::size_t TlsSession::buffered() const { return static_cast<std::size_t>(SSL_pending(ssl_)); }

bool TlsSession::established() const { return SSL_is_init_finished(ssl_) == 1; }

bool TlsSession::wants_write() const { return SSL_want_write(ssl_) != 0; }

void say_handshake_failed(const std::string& peer, const std::string& why) {
  static std::mutex mutex;
  static core::Immortal<std::set<std::string>> said; // a handshake can fail while the process exits
  {
    std::lock_guard lock(mutex);
    if (said->size() >= 64 || !said->insert(why).second) return;
  }
  std::fprintf(stderr,
               "chorus: the TLS handshake of a link with %s failed (%s): is the peer a node of this job, with the "
               "job's credentials (CHORUS_TLS_DIR, made by `chorus certs`)?\n",
               peer.c_str(), why.c_str());
}

TlsSession::Io TlsSession::classify(int ret, std::size_t& n) {
  if (ret > 0) {
    n = static_cast<std::size_t>(ret);
    return Io::done;
  }
  n = 0;
  const int saved_errno = errno;
  switch (SSL_get_error(ssl_, ret)) {
  case SSL_ERROR_WANT_READ:
  case SSL_ERROR_WANT_WRITE:
    return Io::wait;
  case SSL_ERROR_ZERO_RETURN:
    why_ = "the peer closed the connection";
    return Io::closed;
  case SSL_ERROR_SYSCALL:
    why_ = platform::ssl_errors();
    if (!why_.empty()) return Io::failed;
    if (ret == 0 || saved_errno == 0) {
      why_ = "the peer closed the connection";
      return Io::closed;
    }
    why_ = std::strerror(saved_errno);
    return Io::failed;
  default: {
    why_ = platform::ssl_errors();
    if (const long v = SSL_get_verify_result(ssl_); v != X509_V_OK) {
      if (!why_.empty()) why_ += "; ";
      why_.append("the certificate did not verify: ").append(X509_verify_cert_error_string(v));
    }
    if (why_.empty()) why_ = "TLS failed";
    return Io::failed;
  }
  }
}

} // namespace chorus::actors
