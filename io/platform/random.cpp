#include "io/platform/random.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace chorus::platform {

Error random_bytes(void* out, std::size_t bytes, std::string_view what) {
  auto* raw = static_cast<unsigned char*>(out);
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(raw + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::string why = "cannot make ";
      why += what;
      why += ": getrandom: ";
      why += std::strerror(errno);
      return Error(Errc::io_error, std::move(why));
    }
    got += static_cast<std::size_t>(n);
  }
  return {};
}

Result<std::string> random_hex(std::size_t bytes, std::string_view what) {
  std::vector<unsigned char> raw(bytes);
  if (Error e = random_bytes(raw.data(), bytes, what)) return e;
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes);
  for (const unsigned char b : raw) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

} // namespace chorus::platform
