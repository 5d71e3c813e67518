// What the backends that speak HTTP share (io/upload/http_answers.cpp);
// how backends are found and made is io/upload/registry.hpp's.
#pragma once

#include "io/upload/registry.hpp"

namespace chorus::upload {

/// Performs `req` with `cap` as its own timeout: a caller's time slice
/// decides whether a backend call starts, never how long a request may take.
HttpResponse perform_capped(HttpClient& http, HttpRequest& req, std::chrono::milliseconds cap);

/// What a backend reports for an answer that was not 2xx: retry or stop, the
/// server's words after "<server> <what>: ", and `credentials_fix` for a 401 or 403.
Sent not_delivered(const HttpResponse& r, std::string_view server, std::string_view what,
                   std::string_view credentials_fix);

} // namespace chorus::upload
