// What backends that speak HTTP share (io/upload/backends.hpp): a request under
// its own cap, and a Sent for an answer that was not 2xx.
#include "io/upload/backends.hpp"

namespace chorus::upload {

HttpResponse perform_capped(HttpClient& http, HttpRequest& req, std::chrono::milliseconds cap) {
  req.timeout = cap;
  return http.perform(req);
}

Sent not_delivered(const HttpResponse& r, std::string_view server, std::string_view what,
                           std::string_view credentials_fix) {
  Sent s;
  s.delivery = classify(r);
  s.retry_after = r.retry_after;
  s.message.append(server).append(" ").append(what).append(": ").append(describe(r));
  if (r.status == 401 || r.status == 403) s.message.append(" (").append(credentials_fix).append(")");
  if (s.delivery == Delivery::refused) s.stop = true;
  return s;
}

} // namespace chorus::upload
