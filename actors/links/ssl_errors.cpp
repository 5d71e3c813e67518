// CAF 0.17's OpenSSL module classifies the result of every SSL_read,
// SSL_write, SSL_accept and SSL_connect with SSL_get_error, but never empties
// the thread's OpenSSL error queue: an error left by one connection (a peer
// that closed, a failed handshake) makes the next "want read" of any other
// connection on the multiplexer thread look fatal, and CAF drops that link.
// OpenSSL's rule is that the queue be empty before each such call, so
// libchorus defines these four functions in front of libssl's (it is loaded
// before libssl, which it depends on) and calls the real ones on an empty
// queue. Every other caller in the process only gains from the same rule.
#include "io/platform/posix.hpp"

#include <dlfcn.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

namespace {

template <class F>
F real(const char* name) {
  return chorus::platform::dl_symbol<F>(RTLD_NEXT, name);
}

} // namespace

extern "C" {

__attribute__((visibility("default"))) int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto next = real<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return next(ssl, buf, num);
}

__attribute__((visibility("default"))) int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto next = real<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return next(ssl, buf, num);
}

__attribute__((visibility("default"))) int SSL_accept(SSL* ssl) {
  static const auto next = real<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return next(ssl);
}

__attribute__((visibility("default"))) int SSL_connect(SSL* ssl) {
  static const auto next = real<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return next(ssl);
}

} // extern "C"
