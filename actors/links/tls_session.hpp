// TLS for the links between nodes (node_link.hpp): one OpenSSL context a
// process, loaded once from the job's credentials, and a session a
// connection over it, which reads and writes the connection's non-blocking
// socket itself.
//
//  - One context: making one (parsing the certificate, the key and the CA,
//    OpenSSL 3's provider look-ups) costs about as much as the handshake
//    itself, and a run host makes a handshake for every rank of other nodes
//    on its one multiplexer thread (BENCHMARKS.md, "Joins across nodes").
//  - Mutual: each side presents the job's certificate and takes only a peer
//    whose certificate the job's CA signed (a host name is not checked: every
//    node holds the same certificate). No session is resumed and no ticket
//    is sent: a link connects once.
//  - The socket is read with recv and written with send(MSG_NOSIGNAL): a peer
//    that went away is an error of its link, never a SIGPIPE of the process.
//  - Each call starts on an empty OpenSSL error queue (OpenSSL's rule), so an
//    error left by another connection never makes this one look failed.
//
// CAF-free: LinkPolicy (link_stream.cpp) maps Io onto CAF's stream.
#pragma once

#include "io/platform/credentials.hpp"
#include "runtime/core/result.hpp"

#include <cstddef>
#include <memory>
#include <string>

using SSL_CTX = struct ssl_ctx_st;
using SSL = struct ssl_st;

namespace chorus::actors {

/// The job's credentials, loaded once, for every TLS link of this process.
class TlsContext {
public:
  /// Loads `creds` (checked before by platform::check_credentials); the
  /// error names the file that failed and the fix.
  [[nodiscard]] static Result<std::shared_ptr<const TlsContext>> load(const platform::Credentials& creds);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  [[nodiscard]] SSL_CTX* native() const noexcept { return ctx_; }

private:
  explicit TlsContext(SSL_CTX* ctx) noexcept : ctx_(ctx) {}
  SSL_CTX* ctx_;
};

/// One connection's TLS, on the non-blocking socket `fd`. The handshake runs
/// inside the first reads and writes (the side that `accepted` the
/// connection answers, the other speaks first).
class TlsSession {
public:
  /// What a read or a write did.
  enum class Io {
    done,   // `n` bytes (0 for a write of nothing)
    wait,   // nothing until the socket is ready again (the handshake may be under way)
    closed, // the peer closed the connection
    failed, // the handshake or the connection failed: why()
  };

  /// nullptr where OpenSSL cannot make a session (out of memory).
  [[nodiscard]] static std::unique_ptr<TlsSession> make(std::shared_ptr<const TlsContext> ctx, int fd, bool accepted);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  /// Reads up to `len` bytes into `buf` (len > 0).
  Io read(void* buf, std::size_t len, std::size_t& n);
  /// Writes up to `len` bytes of `buf`; with len 0, moves the handshake on.
  Io write(const void* buf, std::size_t len, std::size_t& n);
  /// Bytes already decrypted, waiting to be read (the socket will not say).
  [[nodiscard]] std::size_t buffered() const;
  /// The handshake is over: both sides proved themselves.
  [[nodiscard]] bool established() const;
  /// The last call that waited waits for the socket to take more (not only
  /// for the peer to speak).
  [[nodiscard]] bool wants_write() const;
  /// Why the last call failed: OpenSSL's reason and, where the peer's
  /// certificate did not verify, the verifier's.
  [[nodiscard]] const std::string& why() const noexcept { return why_; }

private:
  TlsSession(std::shared_ptr<const TlsContext> ctx, SSL* ssl) noexcept : ctx_(std::move(ctx)), ssl_(ssl) {}
  Io classify(int ret, std::size_t& n);

  std::shared_ptr<const TlsContext> ctx_; // outlives ssl_
  SSL* ssl_;
  std::string why_;
};

/// Says on stderr that a link's TLS handshake with `peer` failed, why, and the
/// fix; once a reason in a process (a port scanner would say it often).
void say_handshake_failed(const std::string& peer, const std::string& why);

} // namespace chorus::actors
