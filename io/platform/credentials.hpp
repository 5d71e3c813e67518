// A job's credentials for authenticated links between nodes: a CA made for
// the job alone, and one certificate and key, signed by it, that every node
// of the job holds. Mutual TLS with that CA admits exactly the holders of
// the job's credentials. The CA's own key is thrown away once the
// certificate is signed, so no further certificate can be made for the job.
//
//   DIR/ca.pem    the job's CA certificate (trust anchor)
//   DIR/cert.pem  the nodes' certificate, signed by the CA
//   DIR/key.pem   its private key
#pragma once

#include <chorus/chorus.hpp>

#include <string>

namespace chorus::platform {

struct Credentials {
  std::string ca_file, cert_file, key_file;
};

/// Makes the job's credentials in `dir` (created 0700; files 0600), valid for
/// `days`. Refuses to replace existing credentials unless `replace`.
[[nodiscard]] Error make_credentials(const std::string& dir, int days, bool replace);

/// OpenSSL's queued errors of this thread, oldest first, as one line ("; "
/// between them), the queue emptied; "" where there were none.
[[nodiscard]] std::string ssl_errors();

/// Keeps OpenSSL's tables for as long as the process lives. OpenSSL frees
/// them at exit, from an exit handler its first use registers, while a run
/// still uses TLS: its links, and the upload that chorus's own exit handler
/// drains (runtime/client/endings.hpp). Called before chorus's first use of
/// OpenSSL (check_credentials, which comes before the links' TLS; libcurl's
/// initialisation; the exit handler's): where chorus is the first to use
/// it, that handler is never registered; where the program used it before,
/// its handler was registered before chorus's and runs after it.
void keep_tls_library_until_exit() noexcept;

/// Checks the credentials in `dir` before a run uses them: the three files
/// exist, parse, the key matches the certificate, and the certificate is
/// signed by the CA and valid now. The error names the file and the fix.
[[nodiscard]] Error check_credentials(const std::string& dir, Credentials& out);

} // namespace chorus::platform
