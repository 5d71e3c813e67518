// The backends behind make_backend (io/upload.hpp).
#pragma once

#include "io/upload.hpp"

namespace chorus::io::detail {

std::unique_ptr<Backend> make_mlflow_backend(const UploadTarget& target, HttpClient& http);
std::unique_ptr<Backend> make_wandb_backend(const UploadTarget& target, HttpClient& http, Error& error);

/// The time left before `deadline` for one request, at most `cap`; zero if none is left.
std::chrono::milliseconds time_left(SteadyTime deadline, std::chrono::milliseconds cap);

/// Performs `req` within the time left before `deadline` (at most `cap`);
/// sends nothing, and answers "no answer", when none is left.
HttpResponse perform_until(HttpClient& http, HttpRequest& req, SteadyTime deadline, std::chrono::milliseconds cap);

/// What a backend reports for an answer that was not 2xx: retry or stop, the
/// server's words after "<server> <what>: ", and `credentials_fix` for a 401 or 403.
Sent not_delivered(const HttpResponse& r, std::string_view server, std::string_view what,
                   std::string_view credentials_fix);

} // namespace chorus::io::detail
