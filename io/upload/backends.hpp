// The backends behind make_backend (io/upload/upload.hpp).
#pragma once

#include "io/upload/upload.hpp"

namespace chorus::io::detail {

/// MLflow log-batch requests in flight at once, each on a connection of its
/// own: enough to keep a server's workers busy (MLflow's default gunicorn
/// has 4), few enough to leave it room for other clients.
inline constexpr std::size_t mlflow_window = 4;

std::unique_ptr<Backend> make_mlflow_backend(const UploadTarget& target, HttpClient& http);
std::unique_ptr<Backend> make_wandb_backend(const UploadTarget& target, HttpClient& http, Error& error);

/// Performs `req` with `cap` as its own timeout: a caller's time slice
/// decides whether a backend call starts, never how long a request may take.
HttpResponse perform_capped(HttpClient& http, HttpRequest& req, std::chrono::milliseconds cap);

/// What a backend reports for an answer that was not 2xx: retry or stop, the
/// server's words after "<server> <what>: ", and `credentials_fix` for a 401 or 403.
Sent not_delivered(const HttpResponse& r, std::string_view server, std::string_view what,
                   std::string_view credentials_fix);

} // namespace chorus::io::detail
