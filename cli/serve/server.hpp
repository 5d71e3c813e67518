// `chorus serve`'s HTTP server (cpp-httplib): the page, the JSON API of
// cli/serve/api.hpp, artifact downloads and the live event stream, behind
// the rules that keep it safe to leave running: GET only, small requests,
// a token (on loopback too, unless --no-token), and no path out of the runs
// directory.
#pragma once

#include "runtime/core/result.hpp"

#include <cstddef>
#include <memory>
#include <string>

namespace chorus::cli::serve {

class IndexStore;

struct ServeOptions {
  std::string root;                 ///< the runs directory, as its real path
  std::string host = "127.0.0.1";   ///< where to listen
  int port = 8600;                  ///< 0: any free port
  std::string token;                ///< asked of every request where set (none: --no-token, loopback only)
  std::size_t cache_bytes = 1u << 30; ///< what the runs' indexes may hold together
  std::size_t max_streams = 32;     ///< live event streams at once
  std::shared_ptr<IndexStore> index_store; ///< where long files' indexes are kept between runs (none: null)
};

/// Whether `host` is a loopback name or address (localhost, 127.0.0.0/8, ::1).
[[nodiscard]] bool is_loopback(const std::string& host);

/// A random token: 32 hex digits from the kernel's random source.
[[nodiscard]] Result<std::string> random_token();

class Server {
public:
  explicit Server(ServeOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds host:port; an error naming the address and the fix where it cannot.
  [[nodiscard]] Error bind();
  /// The port bound (the one picked, for port 0).
  [[nodiscard]] int port() const;
  /// The page's address, with the token where one is asked.
  [[nodiscard]] std::string url() const;
  /// Serves until stop(); an error where the server could not run.
  [[nodiscard]] Error run();
  /// Ends run(), the event streams first. Safe from any thread.
  void stop();

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace chorus::cli::serve
